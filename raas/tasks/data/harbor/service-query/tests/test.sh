#!/bin/bash
# Verifier for service-query: /app/reorder.txt must list exactly the expected SKUs. They are
# fixed here (the service's data is deterministic); 4 items sit exactly at their category's
# level and must not be listed, and the list spans several of the service's pages.
mkdir -p /logs/verifier
expected="CB-1333
CB-1407
CB-1481
FS-1000
FS-1074
FS-1555
FS-1691
FS-1851
HG-1296
PT-1037
PT-1321
PT-1814
PT-1888
TL-1062"
reward=0
if [ -f /app/reorder.txt ]; then
    # $(...) drops trailing newlines; CRLF line ends are accepted too.
    got=$(tr -d '\r' < /app/reorder.txt)
    if [ "$got" = "$expected" ]; then
        reward=1
    else
        echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fi
else
    echo "/app/reorder.txt is missing"
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
