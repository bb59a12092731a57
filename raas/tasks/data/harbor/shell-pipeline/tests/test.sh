#!/bin/bash
# Verifier for shell-pipeline: /app/answer.txt must hold exactly the expected three lines.
# The expected answer is fixed here (the log is generated deterministically at build time),
# so editing the log does not change what is right.
mkdir -p /logs/verifier
expected=$'192.168.4.23 86\n10.0.0.1 74\n10.0.0.10 66'
reward=0
if [ -f /app/answer.txt ]; then
    # $(...) drops trailing newlines; CRLF line ends are accepted too.
    got=$(tr -d '\r' < /app/answer.txt)
    if [ "$got" = "$expected" ]; then
        reward=1
    else
        echo "expected:"; echo "$expected"; echo "got:"; echo "$got"
    fi
else
    echo "/app/answer.txt is missing"
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
