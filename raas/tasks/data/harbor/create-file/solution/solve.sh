#!/bin/bash
# Gold solution: aggregate the shipped orders with Python's csv module (the product names
# may contain quoted commas) and Decimal (so the revenue is exact before rounding).
set -euo pipefail
python3 - <<'PY'
import csv
from decimal import Decimal

totals = {}
with open("/app/data/orders.csv", newline="") as f:
    for row in csv.DictReader(f):
        if row["status"] != "shipped":
            continue
        t = totals.setdefault(row["region"], [0, 0, Decimal(0)])
        t[0] += 1
        t[1] += int(row["quantity"])
        t[2] += int(row["quantity"]) * Decimal(row["unit_price"])

with open("/app/summary.csv", "w") as f:
    f.write("region,orders,units,revenue\n")
    for region in sorted(totals):
        orders, units, revenue = totals[region]
        f.write(f"{region},{orders},{units},{revenue:.2f}\n")
PY
