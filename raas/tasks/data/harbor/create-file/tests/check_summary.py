"""Checks /app/summary.csv against the expected per-region summary of the shipped orders.

The expected rows are fixed here (not recomputed from /app/data/orders.csv, which the agent
could have changed). Rewards: "format" (header, row shape and order right), "rows" (the
fraction of expected rows present exactly) and "reward" (1 only when both are perfect and
nothing extra is in the file).
"""

import json
import re
import sys

HEADER = "region,orders,units,revenue"
EXPECTED = [
    "East,4,61,440.51",
    "North,7,78,564.51",
    "South,10,139,1318.81",
    "West,9,86,559.52",
]
ROW = re.compile(r"^[A-Za-z]+,\d+,\d+,\d+\.\d\d$")


def score(path):
    try:
        with open(path, "rb") as f:
            text = f.read().decode("utf-8")
    except (OSError, UnicodeDecodeError) as e:
        print(f"cannot read {path}: {e}")
        return {"reward": 0, "format": 0, "rows": 0}
    # One trailing newline is fine, and so are CRLF line ends (csv.writer's default).
    lines = [line.rstrip("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    body = lines[1:]
    fmt = (
        bool(lines)
        and lines[0] == HEADER
        and all(ROW.match(line) for line in body)
        and [line.split(",")[0] for line in body] == sorted(line.split(",")[0] for line in body)
    )
    present = sum(1 for row in EXPECTED if row in body)
    rows = present / len(EXPECTED)
    perfect = fmt and body == EXPECTED
    print(f"format ok: {fmt}; expected rows present: {present}/{len(EXPECTED)}; got: {body!r}")
    return {"reward": 1 if perfect else 0, "format": 1 if fmt else 0, "rows": round(rows, 4)}


if __name__ == "__main__":
    result = score(sys.argv[1])
    with open(sys.argv[2], "w") as f:
        json.dump(result, f)
    print(json.dumps(result))
