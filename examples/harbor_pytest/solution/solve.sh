#!/bin/bash
cat > /app/stats.py <<'PY'
def mean(xs):
    if not xs:
        raise ValueError("the mean of nothing")
    return sum(xs) / len(xs)


def median(xs):
    s, n = sorted(xs), len(xs)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def spread(xs):
    return max(xs) - min(xs)
PY
