# Sourced by scripts that build Debian root filesystems (scripts/images/make-base-rootfs.sh,
# scripts/hpc/make-apptainer-env.sh). The caller defines say() and sets MIRROR; needs root.

# need_debootstrap: install debootstrap from Debian if it is missing.
need_debootstrap() {
    command -v debootstrap >/dev/null && return 0
    say "installing debootstrap"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}

# bootstrap DIR SUITE PACKAGES LOG: a minimal Debian root filesystem in DIR, trimmed of what no
# test needs; built in DIR.partial and renamed, so a killed build leaves no half DIR. Skipped
# when DIR is complete.
bootstrap() {
    local dir=$1 suite=$2 packages=$3 log=$4
    [ -e "$dir/.raas-complete" ] && return 0
    say "debootstrap $suite into $dir (a minute or two)"
    rm -rf "$dir.partial"
    debootstrap --variant=minbase --include="$packages" "$suite" "$dir.partial" "$MIRROR" \
        >"$log" 2>&1 || {
        tail -20 "$log" >&2
        exit 1
    }
    rm -rf "$dir.partial"/var/cache/apt/archives/*.deb "$dir.partial"/var/lib/apt/lists/* \
        "$dir.partial"/usr/share/doc "$dir.partial"/usr/share/man "$dir.partial"/usr/share/locale
    touch "$dir.partial/.raas-complete"
    rm -rf "$dir"
    mv "$dir.partial" "$dir"
}
