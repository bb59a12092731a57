#!/usr/bin/env bash
# The Debian packages raas needs on the host: bubblewrap (sandboxes), skopeo (the image store's
# pulls and imports), squashfs-tools (importing a .sif), umoci and docker-registry (the image
# tier builds images and serves them), buildah (`raas images build-context`, a Harbor task's
# Dockerfile), tmux (the tool-latency baseline in `raas bench tools`), IPython for the
# host-/usr sandboxes' python3, and Chromium (headless: the dashboard's browser tests); and,
# where it can, wrk (the load generator of `raas bench pipeline`, which falls back
# to Python clients and says so without it; nothing else needs it).
set -euo pipefail
missing=()
command -v bwrap >/dev/null || missing+=(bubblewrap)
command -v skopeo >/dev/null || missing+=(skopeo)
command -v unsquashfs >/dev/null || missing+=(squashfs-tools)
command -v umoci >/dev/null || missing+=(umoci)
command -v docker-registry >/dev/null || missing+=(docker-registry)
command -v buildah >/dev/null || missing+=(buildah)
command -v tmux >/dev/null || missing+=(tmux)
command -v chromium >/dev/null || missing+=(chromium)
/usr/bin/python3 -c 'import ipykernel, jupyter_client' 2>/dev/null \
    || missing+=(python3-ipykernel python3-jupyter-client)
if ! command -v wrk >/dev/null; then
    if [ "$(id -u)" -eq 0 ]; then
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null; } \
            || echo "could not install wrk: raas bench pipeline uses Python clients instead" >&2
    else
        echo "optional: sudo apt-get install wrk (raas bench pipeline's load generator)" >&2
    fi
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
    echo "raas needs these Debian packages: sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "installing ${missing[*]}" >&2
apt-get update -qq
others=()
for pkg in "${missing[@]}"; do [ "$pkg" = buildah ] || others+=("$pkg"); done
[ ${#others[@]} -eq 0 ] \
    || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${others[@]}" >/dev/null
# buildah without its recommends (crun, runc, fuse-overlayfs): as root raas builds with
# --isolation chroot on the kernel's overlay, which needs none of them (rootless builds need
# crun or runc: `raas images build-context --help`).
if [ ${#others[@]} -ne ${#missing[@]} ]; then
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null
fi
