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
if ! command -v debootstrap >/dev/null; then
    say "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi
mkdir -p "$CACHE"
say "debootstrap bookworm into $ROOT (a minute or two)"
rm -rf "$ROOT.partial"
debootstrap --variant=minbase --include=python3,python3-pytest,git "bookworm" "$ROOT.partial" \
    "$MIRROR" >"$CACHE/debootstrap.log" 2>&1 || {
    tail -20 "$CACHE/debootstrap.log" >&2
    exit 1
}
rm -rf "$ROOT.partial"/var/cache/apt/archives/*.deb "$ROOT.partial"/var/lib/apt/lists/* \
    "$ROOT.partial"/usr/share/doc "$ROOT.partial"/usr/share/man "$ROOT.partial"/usr/share/locale
touch "$ROOT.partial/.raas-complete"
rm -rf "$ROOT"
mv "$ROOT.partial" "$ROOT"
echo "$ROOT"
