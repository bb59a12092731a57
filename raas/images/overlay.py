"""Image layers as overlayfs reads them: whiteouts, opaque directories, and the copy fallback.

Standard library only: besides being imported, this file is run by the host's python in a
sandbox's mount namespace (``python3 -I -S overlay.py ROOT LINK...``) to copy an image's layers
into the sandbox's tmpfs where the kernel refuses an overlay (``raas.sandbox.rootfs``).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import sys

# Where a directory says it hides the lower layers' (root's store: trusted; a rootless: user).
OPAQUE_XATTRS = ("trusted.overlay.opaque", "user.overlay.opaque")


def is_whiteout(st: os.stat_result) -> bool:
    """An overlayfs whiteout: a 0/0 character device, which hides the name in lower layers."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: str | os.PathLike[str]) -> bool:
    """A directory that hides what the lower layers hold in it."""
    for name in OPAQUE_XATTRS:
        try:
            if os.getxattr(path, name, follow_symlinks=False) == b"y":
                return True
        except OSError:
            continue
    return False


def _remove(path: str) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.unlink(path)


def _own(path: str, st: os.stat_result) -> None:
    with contextlib.suppress(OSError):  # an owner the namespace does not map: the copier's
        os.chown(path, st.st_uid, st.st_gid, follow_symlinks=False)


def merge_layer(layer: str, root: str) -> None:
    """Copy ``layer`` onto ``root`` as an upper layer: its whiteouts remove what is there, its
    opaque directories replace what is there, its files and links replace those of the same
    name. Device nodes other than whiteouts are not copied."""
    for entry in os.scandir(layer):
        source, target = entry.path, os.path.join(root, entry.name)
        st = entry.stat(follow_symlinks=False)
        if is_whiteout(st):
            _remove(target)
        elif stat.S_ISDIR(st.st_mode):
            if is_opaque(source) or not (os.path.isdir(target) and not os.path.islink(target)):
                _remove(target)
                os.mkdir(target)
            merge_layer(source, target)
            os.chmod(target, stat.S_IMODE(st.st_mode))
            _own(target, st)
        elif stat.S_ISLNK(st.st_mode):
            _remove(target)
            os.symlink(os.readlink(source), target)
            _own(target, st)
        elif stat.S_ISREG(st.st_mode):
            _remove(target)
            shutil.copy2(source, target, follow_symlinks=False)
            _own(target, st)


def copy_layers(root: str, links: list[str]) -> None:
    """Fill ``root`` from the layers that ``links`` point to (named 0 for the top one, 1, ...),
    bottom first."""
    for link in sorted(links, key=lambda p: -int(os.path.basename(p))):
        merge_layer(os.path.realpath(link), root)


if __name__ == "__main__":
    copy_layers(sys.argv[1], sys.argv[2:])
