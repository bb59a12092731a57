#!/bin/bash
# The common shape of a Harbor verifier: pytest on the hidden tests, which import the agent's
# module in pytest's own process; reward 1 where pytest exits 0. raas runs twins of these tests
# (docs/harbor.md), since the agent's code could otherwise decide that exit status.
mkdir -p /logs/verifier
cd /app
if python3 -m pytest -q -p no:cacheprovider /tests/test_stats.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
