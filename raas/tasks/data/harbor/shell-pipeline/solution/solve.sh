#!/bin/bash
# Gold solution: select on the status field (the 9th), count per client, keep the top three.
set -euo pipefail
awk '$9 == 404 { print $1 }' /app/logs/access.log \
    | sort | uniq -c | sort -k1,1nr -k2,2 | head -n 3 \
    | awk '{ print $2 " " $1 }' > /app/answer.txt
