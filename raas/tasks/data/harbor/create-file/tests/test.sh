#!/bin/bash
# Verifier for create-file: writes /logs/verifier/reward.json with named rewards
# ("reward" is 1 only when the whole summary is right; "format" and "rows" give partial
# credit, for analysis and shaping).
mkdir -p /logs/verifier
# -I: the agent's files (e.g. a module in the working directory) cannot shadow anything.
cd /tests && python3 -I /tests/check_summary.py /app/summary.csv /logs/verifier/reward.json
# The checker always writes reward.json; should it crash before, the task is failed.
if [ ! -s /logs/verifier/reward.json ]; then
    echo '{"reward": 0, "format": 0, "rows": 0}' > /logs/verifier/reward.json
fi
