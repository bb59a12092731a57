#!/usr/bin/env bash
# Puts raas/harbor-base:bookworm into raas's image store: Debian bookworm with python3, pytest
# and git (the root filesystem scripts/images/make-base-rootfs.sh makes, once, with debootstrap),
# which the Harbor tasks shipped in raas/tasks/data/harbor build on. Needs root (debootstrap),
# umoci and skopeo (scripts/install-system-deps.sh). The store: $RAAS_IMAGE_STORE, else
# raas's default (raas images --help); a name the store holds already is left as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
RAAS="${RAAS:-.venv/bin/raas}"
REF="raas/harbor-base:bookworm"
listed="$("$RAAS" images ls 2>/dev/null || true)"
if grep -q "raas/harbor-base:bookworm" <<<"$listed"; then
    echo "import-base: $REF is in the store already" >&2
    exit 0
fi
ROOTFS="$(scripts/images/make-base-rootfs.sh | tail -1)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT INT TERM
umoci init --layout "$work/layout"
umoci new --image "$work/layout:base"
umoci insert --image "$work/layout:base" "$ROOTFS" /
"$RAAS" images import "$work/layout" --ref "$REF"
