#!/bin/bash
# Gold solution: find the nightly billing job's configuration, resolve its input file
# (relative to its data_root) and sum M-07's readings exactly.
set -euo pipefail
python3 - <<'PY'
import configparser
import csv
import glob
import os
from decimal import Decimal

for path in glob.glob("/app/**/*.ini", recursive=True):
    job = configparser.ConfigParser()
    job.read(path)
    if job.get("job", "name", fallback="") == "nightly-billing":
        break
else:
    raise SystemExit("no nightly-billing job")
data = os.path.join(job["input"]["data_root"], job["input"]["file"])
with open(data, newline="") as f:
    total = sum((Decimal(r["kwh"]) for r in csv.DictReader(f) if r["meter"] == "M-07"), Decimal(0))
with open("/app/answer.txt", "w") as f:
    f.write(f"{total:.2f}\n")
PY
