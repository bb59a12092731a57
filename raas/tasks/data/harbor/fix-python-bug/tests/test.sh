#!/bin/bash
# Verifier for fix-python-bug: runs the hidden tests against /app/spans; reward 1 only if all
# of them ran and passed.
mkdir -p /logs/verifier
echo 0 > /logs/verifier/reward.txt
EXPECTED_TESTS=11

# No plugins or options from the environment; -I keeps the agent's files in the working
# directory from shadowing pytest itself (the tests put /app on sys.path themselves).
unset PYTEST_ADDOPTS PYTEST_PLUGINS
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
junit=$(mktemp /tmp/verifier-junit.XXXXXX.xml)
cd /tests
python3 -I -m pytest -q -p no:cacheprovider --junitxml="$junit" /tests/test_hidden.py
status=$?

# A zero exit status alone is not trusted (code under test could end the process early with
# it): the report must show every test run and passed.
if [ "$status" = 0 ] && python3 -I - "$junit" "$EXPECTED_TESTS" <<'PY'
import sys
import xml.etree.ElementTree as ET

root = ET.parse(sys.argv[1]).getroot()
suite = root if root.tag == "testsuite" else root.find("testsuite")
counts = {k: int(suite.get(k, "0")) for k in ("tests", "failures", "errors", "skipped")}
print("junit:", counts)
ok = counts["tests"] == int(sys.argv[2]) and not (counts["failures"] or counts["errors"] or counts["skipped"])
sys.exit(0 if ok else 1)
PY
then
    echo 1 > /logs/verifier/reward.txt
fi
rm -f "$junit"
cat /logs/verifier/reward.txt
