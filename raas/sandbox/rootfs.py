"""A sandbox's root over an OCI image's layers: copy-on-write, private, gone when it closes.

bubblewrap 0.8 has no overlay options, so the sandbox's launch starts with a mount namespace of its
own (``unshare --mount``; rootless, ``unshare --user --map-root-user --mount``, which may mount
overlayfs on kernels >= 5.11, with ``userxattr`` so that it reads the ``user.overlay.`` opaque marks
a rootless store sets; see ``OVERLAY_TRIES``). In it a size-capped tmpfs (the sandbox's
``disk_bytes``) holds overlayfs' upper and work directories, and an overlay of the image's layers
(the top one first) is mounted on ``root`` beside them; bwrap then binds the top-level entries of
that root writable into the sandbox. Every write lands in the sandbox's own upper layer, in memory:
the layers on disk, shared with other sandboxes and images, never change, and when the sandbox's
last process exits its mount namespace, and with it the tmpfs and the overlay, is gone. Where the
kernel refuses the overlay (probed once, said once in the log), the layers are copied into the tmpfs
instead, bottom first, applying whiteouts and opaque directories as overlayfs would (a slower start,
the same result).

Ownership. Rootless, the store's layers belong to raas's user (an unprivileged unpack cannot
chown), who is root in the launch's user namespace and whom bwrap maps to the sandbox's user:
the agent owns the image's files, as it would as root in a container. As root, raas runs each
sandbox as its own unprivileged host uid, and the image's files belong to host root: the agent
could read them but not edit ``/testbed``. So, still as root and before it drops to the
sandbox's uid (``setpriv``), the launch ``chown``s the image's work directories (its config's
``WorkingDir`` and ``/testbed``) to that uid in the overlay. With ``metacopy=on`` (root only)
that copies up metadata, not file contents: the tmpfs holds inodes, the layers stay as they
are. Elsewhere the image stays root's: pip falls back to a user install (into ``$HOME``, the
sandbox's workspace). A work directory is chowned only if every component of its path is a real
directory in the image (no symlink): ``chown -hR`` never follows a link, and a link on the way
could lead root's chown out of the image. Before the launch, the image's python3 is found and
its version read from the layers (``probe_python``, once per image): where it has none that
raas's action server can run on, the server runs on the Python raas provides
(``raas.sandbox.hostpython``), and an image that cannot run that either (no bash for the tools)
is an ``ImageError`` naming it and why, not a sandbox that never answers.
"""

from __future__ import annotations

import functools
import logging
import os
import posixpath
import re
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raas.images import overlay
from raas.images.errors import ImageError, ImageUnrunnable
from raas.images.image import StoredImage
from raas.images.overlay import is_opaque, is_whiteout

log = logging.getLogger(__name__)

MIN_PYTHON = (3, 8)
# The directories of an image that the agent edits (besides its config's WorkingDir).
WORK_DIRS = ("/testbed",)
# World-writable in an image, but the store keeps no such bit (raas.images.layers): as root
# they are given to the sandbox's uid like the work directories, so that the agent can write
# there as in a container (/tmp and /dev/shm are the sandbox's own tmpfs).
SCRATCH_DIRS = ("/var/tmp", "/run/lock")
# Entries of the image's root that the sandbox gets from bwrap instead.
NOT_BOUND = frozenset({"proc", "dev", "tmp", "sys", ".raas"})
MAX_SYMLINKS = 40
# The launch's tools, found by the shell (an unexported variable: nothing inherits it).
TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

# Run by sh in the sandbox's mount namespace (the overlay's paths are relative to the tmpfs, so
# that no host path shows in the sandbox's /proc/self/mountinfo): $1 the tmpfs (mounted on it),
# $2 its options, $3 "overlay" or "copy", $4 overlay's extra options, $5 the sandbox's host uid
# or "" (chown the work directories to it), then the layers top first, "--", the work
# directories, "--", and the command to exec. A fork's launch (``ImageRoot.seed_fd``) has
# $RAAS_SEED, an open directory of its parent's changes (its upper directory, or its whole root
# in the copy fallback), copied into this tmpfs (sparse files kept sparse) before the overlay is
# mounted, so the tmpfs's size caps them too; $RAAS_SEED_OWNER, the parent's host uid, whose
# files become the sandbox's. That fd is closed (by Python: dash names no fd above 9) before
# the rest runs: nothing in the sandbox can reach the parent's files through it. With
# $RAAS_SEED_KEEP (names of the root's entries, space-separated; overlay only), the copy keeps
# the parent's changes under the root's other directories only: those entries, and every
# top-level entry that is not a directory (a file, a link, a whiteout), are removed from the
# copied upper layer, so the child sees the image's own there (``ForkCarry``).
CLOSE_AND_EXEC = "import os, sys; os.close(int(sys.argv[1])); os.execvp(sys.argv[2], sys.argv[2:])"
MOUNT_SCRIPT = f"""set -e
PATH={TOOLS_PATH}
t=$1 opts=$2 how=$3 extra=$4 owner=$5; shift 5
seed=${{RAAS_SEED:-}} from=${{RAAS_SEED_OWNER:-}}
fill() {{
  cp -a --sparse=always -- "/proc/self/fd/$seed/." "$1/"
  [ -z "$from" ] || [ -z "$owner" ] || chown -hR --from="$from:$from" "$owner:$owner" -- "$1"
  [ -z "${{RAAS_SEED_KEEP:-}}" ] || prune "$1"
}}
prune() {{
  for e in "$1"/* "$1"/.[!.]* "$1"/..?*; do
    [ -e "$e" ] || [ -L "$e" ] || continue
    n=${{e##*/}}
    case " $RAAS_SEED_KEEP " in *" $n "*) rm -rf -- "$e"; continue;; esac
    if [ -L "$e" ] || [ ! -d "$e" ]; then rm -rf -- "$e"; fi
  done
}}
mount -t tmpfs -o "$opts" tmpfs "$t"
cd "$t"
mkdir root l
lower= i=0
while [ "$1" != -- ]; do
  ln -s "$1" "l/$i"; lower="$lower${{lower:+:}}l/$i"; i=$((i+1)); shift
done
shift
if [ "$how" = overlay ]; then
  mkdir upper work
  [ -z "$seed" ] || fill upper
  mount -t overlay -o "lowerdir=$lower,upperdir=upper,workdir=work,nosuid,nodev$extra" \\
    overlay root
elif [ -n "$seed" ]; then
  fill root
else
  "$RAAS_PYTHON" -I -S "$RAAS_COPY" root l/*
fi
cd /
while [ "$1" != -- ]; do
  [ -z "$owner" ] || chown -hR "$owner:$owner" -- "$t/root$1"; shift
done
shift
[ -z "$seed" ] || set -- "$RAAS_PYTHON" -I -S -c '{CLOSE_AND_EXEC}' "$seed" "$@"
unset PWD OLDPWD RAAS_PYTHON RAAS_COPY RAAS_SEED RAAS_SEED_OWNER RAAS_SEED_KEEP
exec "$@"
"""


def check_layers(image: StoredImage) -> None:
    """Every layer directory of ``image`` is there, or an ImageError naming the missing one."""
    if not image.layers:
        raise ImageError(f"image {image.ref}: it has no layers")
    for layer in image.layers:
        if not layer.is_dir():
            raise ImageError(
                f"image {image.ref}: its layer directory {layer} is missing (removed from the"
                " image store?): pull or import the image again"
            )


# -- the image's files, read from its layers as overlayfs would merge them -----------------------


def _entries(dirs: Sequence[Path], name: str) -> list[Path]:
    """The layers' copies of ``name`` in the merged directory ``dirs`` (top first): the one
    that is seen first, and below a directory the lower directories merged with it."""
    found: list[Path] = []
    for directory in dirs:
        path = directory / name
        try:
            st = os.lstat(path)
        except OSError:  # absent, or below a file of this layer
            continue
        if is_whiteout(st) or (found and not stat.S_ISDIR(st.st_mode)):
            break
        found.append(path)
        if not stat.S_ISDIR(st.st_mode) or is_opaque(path):
            break
    return found


def lookup(image: StoredImage, path: str, follow: bool = True) -> Path | None:
    """The host file that is ``path`` in the image's merged root, or None.

    ``follow``: symbolic links on the way and at the end are followed within the image (an
    absolute target starts again at the image's root); otherwise a link anywhere on the way
    gives None (what a root-run chown may trust).
    """
    layers = list(reversed(image.layers))
    parts = [p for p in path.split("/") if p and p != "."]
    dirs: list[Path] = layers
    walked: list[str] = []
    hops = 0
    while parts:
        name = parts.pop(0)
        if name == "..":
            walked = walked[:-1]
            dirs = _merged_dir(layers, walked)
            continue
        found = _entries(dirs, name)
        if not found:
            return None
        if found[0].is_symlink():
            if not follow or hops >= MAX_SYMLINKS:
                return None
            hops += 1
            target = os.readlink(found[0])
            if target.startswith("/"):
                walked = []
            parts = [p for p in target.split("/") if p and p != "."] + parts
            dirs = _merged_dir(layers, walked)
            continue
        walked.append(name)
        dirs = found
    return dirs[0] if walked or dirs else None


def _merged_dir(layers: list[Path], parts: list[str]) -> list[Path]:
    dirs = layers
    for name in parts:
        dirs = _entries(dirs, name)
    return dirs


def top_entries(image: StoredImage) -> dict[str, str | None]:
    """The image root's entries: name -> a symbolic link's target, or None for anything else."""
    seen: dict[str, str | None] = {}
    hidden: set[str] = set()
    for layer in reversed(image.layers):
        for entry in sorted(os.scandir(layer), key=lambda e: e.name):
            if entry.name in seen or entry.name in hidden:
                continue
            st = entry.stat(follow_symlinks=False)
            if is_whiteout(st):
                hidden.add(entry.name)
            else:
                seen[entry.name] = os.readlink(entry.path) if entry.is_symlink() else None
        if is_opaque(layer):
            break
    return dict(sorted(seen.items()))


def image_env(image: StoredImage) -> dict[str, str]:
    """The image config's ``Env`` as a dict (a later entry wins, as Docker has it)."""
    env: dict[str, str] = {}
    for item in image.env:
        name, sep, value = item.partition("=")
        if sep and name:
            env[name] = value
    return env


_VERSION = re.compile(r"python(\d+)\.(\d+)")
ELF_MAGIC = b"\x7fELF"


def image_python(image: StoredImage, python: str, path: str) -> tuple[str, tuple[int, int]]:
    """Where ``python`` is in the image (looked up on ``path``, the sandbox's PATH) and its
    version, read from the layers, never run: the name the links end at (``python3.11``), else
    the one standard library beside it (``lib/python3.X/os.py``). Only what can be checked there
    is trusted: it must be an ELF binary (not a wrapper script) with that version's standard
    library beside it. An ImageError saying why where there is none such, or it is older than
    3.8: raas's action server runs on it.
    """
    if "/" in python:
        candidates = [python]
    else:
        candidates = [posixpath.join(d, python) for d in path.split(":") if d.startswith("/")]
    for candidate in candidates:
        host = lookup(image, candidate)
        if host is None or not host.is_file() or not os.stat(host).st_mode & 0o111:
            continue
        if not _is_elf(host):
            raise ImageError(
                f"image {image.ref}: its {python} ({candidate}) is not an ELF binary (a wrapper"
                " script?), so raas cannot tell which Python it runs"
            )
        version = _python_version(image, host, candidate)
        if version is None:
            raise ImageError(
                f"image {image.ref}: cannot tell which Python {candidate} is (no python3.X in"
                " its name or standard library beside it); raas's action server needs Python"
                f" {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
            )
        if version < MIN_PYTHON:
            raise ImageError(
                f"image {image.ref}: its {python} ({candidate}) is Python"
                f" {version[0]}.{version[1]}; raas's action server needs"
                f" {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer"
            )
        stdlib = f"{_prefix(candidate)}/lib/python{version[0]}.{version[1]}/os.py"
        if lookup(image, stdlib) is None:
            raise ImageError(
                f"image {image.ref}: its {python} ({candidate}) has no standard library beside"
                f" it ({stdlib})"
            )
        return candidate, version
    raise ImageError(
        f"image {image.ref}: no {python} on its PATH ({path}); raas's action server needs"
        f" Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]} or newer in the image"
    )


def _is_elf(host: Path) -> bool:
    with open(host, "rb") as f:
        return f.read(4) == ELF_MAGIC


def _prefix(candidate: str) -> str:
    return posixpath.dirname(posixpath.dirname(candidate))


def _python_version(image: StoredImage, host: Path, candidate: str) -> tuple[int, int] | None:
    match = _VERSION.fullmatch(host.name) or _VERSION.fullmatch(host.name.rstrip("mdu"))
    if match:
        return int(match[1]), int(match[2])
    prefix = _prefix(candidate)
    versions = set()
    for layer in image.layers:
        for os_py in (layer / prefix.lstrip("/") / "lib").glob("python*.*/os.py"):
            found = _VERSION.fullmatch(os_py.parent.name)
            if found and lookup(image, f"{prefix}/lib/{os_py.parent.name}/os.py") is not None:
                versions.add((int(found[1]), int(found[2])))
    return versions.pop() if len(versions) == 1 else None


@dataclass(frozen=True)
class ImagePython:
    """What runs an image's action server: the image's own Python (``path``), or where it has
    none that raas can run on (``path`` None), the one raas provides, and ``why`` not its own."""

    path: str | None
    why: str = ""


# Probed once per image (its digest and layers: what an image holds never changes).
_probed: dict[tuple[str, tuple[Path, ...], str, str], ImagePython] = {}


def probe_python(image: StoredImage, python: str, path: str) -> ImagePython:
    """The image's own ``python`` where raas can run its action server on it, else why not
    (``image_python``), read once per image; an ImageError where the image can run neither:
    raas's Python needs nothing of the image, but the tools need its bash, built for this
    machine."""
    key = (image.digest, image.layers, python, path)
    if key not in _probed:
        try:
            _probed[key] = ImagePython(image_python(image, python, path)[0])
        except ImageError as e:
            why = str(e).removeprefix(f"image {image.ref}: ")
            _probed[key] = ImagePython(None, why)
    found = _probed[key]
    if found.path is None:
        shell = _shell_problem(image, path)
        if shell is not None:
            raise ImageUnrunnable(
                f"image {image.ref}: raas cannot run in it: {found.why}, and it cannot run"
                f" raas's own Python either: {shell}"
            )
    return found


def _shell_problem(image: StoredImage, path: str) -> str | None:
    """Why the image has no bash for the bash tool that runs on this machine (None: it has)."""
    for directory in (d for d in path.split(":") if d.startswith("/")):
        host = lookup(image, posixpath.join(directory, "bash"))
        if host is None or not host.is_file() or not os.stat(host).st_mode & 0o111:
            continue
        if not _is_elf(host):
            return f"its bash ({directory}/bash) is not an ELF binary"
        if _machine(host) != _machine(Path(os.path.realpath(sys.executable))):
            return f"its bash ({directory}/bash) is built for another architecture than this host"
        return None
    return f"it has no bash on its PATH ({path}) for the bash tool"


def _machine(host: Path) -> bytes:
    """An ELF file's class, byte order and machine (what a host must be to run it)."""
    with open(host, "rb") as f:
        head = f.read(20)
    return head[4:6] + head[18:20]


def work_dirs(image: StoredImage) -> list[str]:
    """The image's directories that the agent edits: its WorkingDir and /testbed, and the
    scratch directories an image leaves to anyone (``SCRATCH_DIRS``), those that are real
    directories (no symbolic link on the way)."""
    dirs: list[str] = []
    for candidate in (image.workdir, *WORK_DIRS, *SCRATCH_DIRS):
        norm = posixpath.normpath("/" + candidate.lstrip("/"))
        if norm == "/" or norm in dirs or ".." in norm.split("/"):
            continue
        host = lookup(image, norm, follow=False)
        if host is not None and host.is_dir() and not host.is_symlink():
            dirs.append(norm)
    return dirs


# -- mounting ------------------------------------------------------------------------------------


# The probe: what the launch does, on a small tmpfs, with each set of options in turn; prints
# the first that mounts (a line each for those that fail, on stderr).
PROBE_SCRIPT = """mount -t tmpfs -o size=1m tmpfs "$1" && cd "$1" && mkdir l u w m || exit 1
shift
for extra in "$@"; do
  mount -t overlay -o "lowerdir=l,upperdir=u,workdir=w$extra" overlay m && echo "ok$extra" && exit
done
exit 1
"""


# The extra overlay options to try, best first. As root: ``metacopy=on`` where the kernel takes
# it (a chown then copies no file's data). Rootless: ``userxattr`` only. In a user namespace the
# kernel cannot read ``trusted.*`` xattrs, so without it overlayfs would ignore the opaque marks
# of a rootless store (which can set only ``user.overlay.opaque``) and show what an opaque
# directory hides; the option came with unprivileged overlay mounts (Linux 5.11), and where a
# kernel refuses it the layers are copied, which honours both marks.
OVERLAY_TRIES = {False: (",metacopy=on", ""), True: (",userxattr",)}


@functools.cache
def overlay_options(rootless: bool) -> str | None:
    """The extra overlayfs options the launch mounts with here (the first of ``OVERLAY_TRIES``
    that mounts); None where the kernel refuses an overlay at all (probed once, in a throwaway
    namespace, and said once in the log): then the layers are copied."""
    unshare = shutil.which("unshare")
    if unshare is None:
        raise ImageError("unshare (util-linux) is not installed: apt-get install util-linux")
    tries = OVERLAY_TRIES[rootless]
    with tempfile.TemporaryDirectory(prefix="raas-overlay-probe-") as tmp:
        argv = [unshare, *_namespace_flags(rootless), "--", "sh", "-c", PROBE_SCRIPT, "sh", tmp]
        try:
            result = subprocess.run(
                [*argv, *tries],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
                env=_tools_env(),
            )
        except (OSError, subprocess.TimeoutExpired) as e:
            result = subprocess.CompletedProcess(argv, 1, "", str(e))
    if result.returncode == 0 and result.stdout.startswith("ok"):
        return result.stdout.strip()[2:]
    log.warning(
        "overlayfs cannot be mounted here (%s): image sandboxes copy their layers into their"
        " tmpfs instead (a slower start)",
        result.stderr.strip() or f"exit status {result.returncode}",
    )
    return None


def _namespace_flags(rootless: bool) -> list[str]:
    flags = ["--mount", "--propagation", "private"]
    return ["--user", "--map-root-user", *flags] if rootless else flags


def _tools_env() -> dict[str, str]:
    return {"PATH": TOOLS_PATH}


@dataclass(frozen=True)
class ImageRoot:
    """How one sandbox's root is made from ``image``: a tmpfs of ``size_bytes`` mounted on
    ``mount_dir`` (a directory of the sandbox's own), the root at ``mount_dir/root``; ``owner``,
    the sandbox's host uid when raas runs as root; ``overlay``: the extra options of the overlay
    (``overlay_options``), or None to copy the layers instead (where the kernel refuses one).
    A fork's: ``seed_fd``, an open directory of the parent's changes (its upper directory, or
    its whole root with ``overlay`` None), passed to the launch and copied into the tmpfs;
    ``seed_owner``, the parent's host uid (raas as root); ``seed_keep``: the root's entries
    where the child keeps the image's own files (``MOUNT_SCRIPT``'s $RAAS_SEED_KEEP)."""

    image: StoredImage
    mount_dir: Path
    size_bytes: int
    owner: int | None = None
    overlay: str | None = ""
    seed_fd: int | None = None
    seed_owner: int | None = None
    seed_keep: tuple[str, ...] = ()

    @property
    def root(self) -> Path:
        return self.mount_dir / "root"

    def launch_prefix(self, as_owner: bool = True) -> list[str]:
        """The command that mounts the root and then runs the rest of the argv after it (as
        ``owner``, when there is one and ``as_owner``; apptainer drops to it itself)."""
        unshare = shutil.which("unshare")
        if unshare is None:
            raise ImageError("unshare (util-linux) is not installed: apt-get install util-linux")
        rootless = self.owner is None
        tmpfs = f"size={self.size_bytes},mode=0755,nosuid,nodev"
        dirs = work_dirs(self.image) if self.owner is not None else []
        how = "copy" if self.overlay is None else "overlay"
        owner = "" if self.owner is None else str(self.owner)
        script = [MOUNT_SCRIPT, "sh", str(self.mount_dir), tmpfs, how, self.overlay or "", owner]
        top_first = [str(layer) for layer in reversed(self.image.layers)]
        args = [unshare, *_namespace_flags(rootless), "--", "/bin/sh", "-c", *script]
        args += [*top_first, "--", *dirs, "--"]
        if self.owner is not None and as_owner:
            setpriv = shutil.which("setpriv", path=TOOLS_PATH) or "setpriv"
            args += [setpriv, "--reuid", owner, "--regid", owner, "--clear-groups", "--"]
        return args

    def launch_env(self) -> dict[str, str]:
        """The launch's environment: the copy fallback's python and script
        (``raas/images/overlay.py``), a fork's seed (``MOUNT_SCRIPT``), which the mount script
        unsets before it runs the rest."""
        env: dict[str, str] = {}
        if self.overlay is None:
            env["RAAS_PYTHON"] = sys.executable
            env["RAAS_COPY"] = overlay.__file__
        if self.seed_fd is not None:
            env["RAAS_PYTHON"] = sys.executable
            env["RAAS_SEED"] = str(self.seed_fd)
            if self.seed_owner is not None:
                env["RAAS_SEED_OWNER"] = str(self.seed_owner)
            if self.seed_keep:
                env["RAAS_SEED_KEEP"] = " ".join(self.seed_keep)
        return env

    def bwrap_args(self, own: Sequence[str] = ()) -> list[str]:
        """bwrap's binds of the root's top-level entries, writable (the overlay is the
        sandbox's own), but for those the sandbox gets from bwrap (/proc, /dev, /tmp, and
        ``own``: names of the entries it makes itself, such as a judge's tmpfs dirs, which
        the image's entry, a link perhaps, must not shape)."""
        args: list[str] = []
        for name, target in top_entries(self.image).items():
            if name in NOT_BOUND or name in own:
                continue
            if target is not None:
                args += ["--symlink", target, f"/{name}"]
            else:
                args += ["--bind", str(self.root / name), f"/{name}"]
        return args
