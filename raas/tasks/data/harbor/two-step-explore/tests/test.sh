#!/bin/bash
# Verifier for two-step-explore: /app/answer.txt must hold M-07's total in the nightly job's
# file (readings-20240316.csv). Fixed here, since the readings are generated deterministically;
# the other days' files give 97.77, 97.24 and 111.13, and counting M-070/M-17 too gives 178.86.
mkdir -p /logs/verifier
expected="94.24"
reward=0
if [ -f /app/answer.txt ]; then
    # $(...) drops trailing newlines; CRLF line ends are accepted too.
    got=$(tr -d '\r' < /app/answer.txt)
    if [ "$got" = "$expected" ]; then
        reward=1
    else
        echo "expected: $expected"; echo "got: $got"
    fi
else
    echo "/app/answer.txt is missing"
fi
echo "$reward" > /logs/verifier/reward.txt
echo "reward: $reward"
