#!/bin/bash
# Gold solution: merge() replaced the previous interval's end by the next one's, which
# shrinks it when the next interval lies inside it; the merged end is the larger of the two.
set -euo pipefail
f=/app/spans/core.py
grep -q 'merged\[-1\] = (merged\[-1\]\[0\], end)' "$f"
sed -i 's/merged\[-1\] = (merged\[-1\]\[0\], end)/merged[-1] = (merged[-1][0], max(merged[-1][1], end))/' "$f"
grep -q 'max(merged\[-1\]\[1\], end)' "$f"
