#!/bin/bash
# Verifier for repair-config: runs the original app (a copy kept in /tests, so an edited
# /app/app.py does not count) on /app/config/app.ini and compares its one line of output.
mkdir -p /logs/verifier
expected="inventory ready: listening on 127.0.0.1:8443, workers=4, timeout=30s, storage=/app/var/inventory/inventory.db (12 items), log level=info"
reward=0
out=$(cd /tests && timeout 20 python3 -I /tests/app.py /app/config/app.ini)
status=$?
# The database must be the original one, not a new or edited file.
db_ok=0
if [ "$(sha256sum < /app/var/inventory/inventory.db 2>/dev/null | cut -d' ' -f1)" = \
     "$(sha256sum < /tests/inventory.db.in | cut -d' ' -f1)" ]; then
    db_ok=1
fi
if [ "$status" = 0 ] && [ "$out" = "$expected" ] && [ "$db_ok" = 1 ]; then
    reward=1
else
    echo "exit status: $status; database unchanged: $db_ok"
    echo "expected: $expected"
    echo "got:      $out"
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
