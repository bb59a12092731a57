#!/usr/bin/env bash
# What the image tier's Django and SymPy rows (tests/judge/swe_django_rows.py, tests/judge/swe_sympy_rows.py)
# are made of: each project's own source distribution and the wheels of its dependencies,
# fetched once from PyPI with pip and cached; prints the cache directory on the last line.
# PYTHON names the interpreter whose pip downloads (default python3).
set -euo pipefail

CACHE="${RAAS_CACHE_DIR:-$HOME/.cache/raas}/swe-images"
PYTHON="${PYTHON:-python3}"

# fetch NAME SDIST WHEEL...: the source distribution and the wheels, into $CACHE/NAME.
fetch() {
    local dir="$CACHE/$1" sdist="$2"
    shift 2
    [ -e "$dir/.raas-complete" ] && return 0
    rm -rf "$dir.partial"
    mkdir -p "$dir.partial/sdist" "$dir.partial/wheels"
    "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$sdist" -d "$dir.partial/sdist"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary :all: "$@" -d "$dir.partial/wheels"
    touch "$dir.partial/.raas-complete"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
}

# Versions that run on the base root filesystem's Python 3.11.
fetch django "django==4.2.30" "asgiref>=3.6,<4" "sqlparse>=0.3.1,<0.6"
fetch sympy "sympy==1.12" "mpmath>=1.1,<1.4"
echo "$CACHE"
