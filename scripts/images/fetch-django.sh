#!/usr/bin/env bash
# What the image tier's Django rows (tests/swe_django_rows.py) are made of: Django's own source
# distribution (its django package and tests/runtests.py) and the wheels of its two
# dependencies, fetched once from PyPI with pip and cached; prints the directory on the last
# line. PYTHON names the interpreter whose pip downloads (default python3).
set -euo pipefail

CACHE="${RAAS_CACHE_DIR:-$HOME/.cache/raas}/swe-images"
DIR="$CACHE/django"
PYTHON="${PYTHON:-python3}"
DJANGO="django==4.2.30"  # supports Python 3.8 to 3.12: the base root filesystem has 3.11

if [ -e "$DIR/.raas-complete" ]; then
    echo "$DIR"
    exit 0
fi
rm -rf "$DIR.partial"
mkdir -p "$DIR.partial/sdist" "$DIR.partial/wheels"
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: "$DJANGO" -d "$DIR.partial/sdist"
"$PYTHON" -m pip download --quiet --no-deps --only-binary :all: \
    "asgiref>=3.6,<4" "sqlparse>=0.3.1,<0.6" -d "$DIR.partial/wheels"
touch "$DIR.partial/.raas-complete"
rm -rf "$DIR"
mv "$DIR.partial" "$DIR"
echo "$DIR"
