#!/usr/bin/env bash
# The root filesystem the image tier (`make test-images`) builds its small SWE images on: Debian
# bookworm, minimal, with python3, pytest and git. Built once with debootstrap (Debian's mirror is
# the only network used) and cached; prints its path on the last line. Needs root.
set -euo pipefail

CACHE="${RAAS_CACHE_DIR:-$HOME/.cache/raas}/swe-images"
MIRROR="${RAAS_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
ROOT="$CACHE/base-rootfs"

say() { echo "make-base-rootfs: $*" >&2; }

if [ -e "$ROOT/.raas-complete" ]; then
    echo "$ROOT"
    exit 0
fi
if [ "$(id -u)" != 0 ]; then
    say "needs root (debootstrap)"
    exit 1
fi
# shellcheck source=../lib/bootstrap.sh
. "$(dirname "$0")/../lib/bootstrap.sh"
need_debootstrap
mkdir -p "$CACHE"
bootstrap "$ROOT" bookworm python3,python3-pytest,git "$CACHE/debootstrap.log"
echo "$ROOT"
