"""Running raas as an unprivileged user from tests that may run as root.

As root, ``unprivileged_user`` runs commands as uid 65534 (nobody: ``setpriv``, no groups) in a
directory it owns under a fresh temporary directory; as anyone else, as that user. The user
gets its own HOME, image store, cache and runtime directories, and an interpreter it can run:
this one where it can (PYTHONPATH the repository), else, since a venv's interpreter may live in
root's home (pyenv's), which that user cannot enter, a copy of the base interpreter and its
standard library (hard links where the file system allows: moments, no space), with this
venv's site-packages added by a ``.pth``. Nothing of the user's home is chmodded.

Run as a module (``python -m tests.support.unprivileged sandbox REF HOW``), it starts a bwrap
sandbox of the stored image REF (HOW: ``overlay``, or ``copy`` as where the kernel refuses an
overlay) and prints what it saw there as JSON: what ``tests/sandbox/test_images_rootless.py``
asserts on.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from raas.images.layers import remove_tree

REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534
TOOLS_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
# What the user's interpreter must import (raas, and what its CLI and sandboxes need).
IMPORTS = "import raas.cli, raas.sandbox.bwrap, raas.images.store, pydantic, click"
# The standard library's parts nothing here needs (and the venv's own site-packages).
STDLIB_LEFT_OUT = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip")


@dataclass
class User:
    """An unprivileged user, the directories it owns under ``home``, and ``shared``: root's (or
    the test's), for what the test builds for the user to read (``readable``)."""

    uid: int
    home: Path
    shared: Path
    python: str
    env: dict[str, str] = field(default_factory=dict)

    @property
    def store(self) -> Path:
        return self.home / "store"

    @property
    def runtime(self) -> Path:
        return self.home / "run"

    def run(self, *argv: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        """``argv`` as this user, with its environment (and nothing of ours)."""
        prefix: list[str] = []
        if self.uid != os.geteuid():
            setpriv = shutil.which("setpriv", path=TOOLS_PATH) or "setpriv"
            uid = str(self.uid)
            prefix = [setpriv, "--reuid", uid, "--regid", uid, "--clear-groups", "--"]
        return subprocess.run(
            [*prefix, *argv],
            env=self.env,
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    def python_run(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run(self.python, *args, timeout=timeout)

    def raas(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.python_run("-m", "raas", *args, timeout=timeout)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system, or links refused
        shutil.copy2(src, dst)


def copy_interpreter(dest: Path) -> tuple[str, dict[str, str]]:
    """This interpreter's base (not the venv), under ``dest``: its path, and the environment it
    needs (its shared library's directory). This venv's site-packages are on its path."""
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    (dest / "bin").mkdir(parents=True)
    binary = dest / "bin" / version
    _link_or_copy(os.path.realpath(sys.executable), str(binary))
    lib = dest / "lib"
    shutil.copytree(
        sysconfig.get_path("stdlib"),
        lib / version,
        ignore=shutil.ignore_patterns(*STDLIB_LEFT_OUT),
        copy_function=_link_or_copy,
    )
    env: dict[str, str] = {}
    soname = sysconfig.get_config_var("INSTSONAME")
    libdir = sysconfig.get_config_var("LIBDIR")
    if sysconfig.get_config_var("Py_ENABLE_SHARED") and soname and libdir:
        _link_or_copy(os.path.join(libdir, soname), str(lib / soname))
        env["LD_LIBRARY_PATH"] = str(lib)  # before the binary's RUNPATH (the original's)
    site_dir = lib / version / "site-packages"
    site_dir.mkdir()
    venv = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    lines = "".join(f"import site; site.addsitedir({d!r})\n" for d in venv)
    (site_dir / "raas-venv.pth").write_text(lines)
    for path in (dest, *dest.rglob("*")):
        if path.is_dir() and not path.is_symlink():
            path.chmod(0o755)
    return str(binary), env


def _chown_tree(path: Path, uid: int) -> None:
    for p in (path, *path.rglob("*")):
        os.chown(p, uid, uid, follow_symlinks=False)


def _runs_raas(user: User) -> bool:
    """Whether ``user``'s interpreter is this one and imports raas. (Where the venv's binary
    is in a home the user cannot enter, it may still start, but on the system's libpython and
    standard library: another patch release, which is not what the tests ran.)"""
    check = user.python_run("-c", f"{IMPORTS}; import sys; print(sys.version)", timeout=120)
    return check.returncode == 0 and check.stdout.strip() == sys.version


@contextlib.contextmanager
def traversable(listed: Path, *paths: str | Path) -> Iterator[None]:
    """Let every user pass through (``o+x``: enter, not list) the directories above ``paths``
    and ``listed``, and list ``listed`` (``o+rx``: an import path's directory is listed), where
    they do not allow it, for the ``with`` block: a clone in a fresh ``mktemp -d`` (0700) holds
    the repository and its venv. The user's home is never opened so: there this gives up and
    the caller's check says the user cannot run raas."""
    home = Path.home().resolve()
    opened: list[tuple[Path, int]] = []
    wanted = {above: 0o001 for path in (listed, *paths) for above in Path(path).resolve().parents}
    wanted[listed.resolve()] = 0o005
    try:
        for above, bits in sorted(wanted.items()):
            mode = above.stat().st_mode
            if above == home or mode & bits == bits or os.geteuid() != 0:
                continue
            above.chmod(mode | bits)
            opened.append((above, mode))
        yield
    finally:
        for above, mode in reversed(opened):
            above.chmod(mode & 0o7777)


@contextlib.contextmanager
def unprivileged_user() -> Iterator[User]:
    """An unprivileged user (nobody as root, else ourselves) with a home of its own, removed
    after the ``with`` block. Raises RuntimeError naming what is missing where it cannot run
    raas."""
    uid = NOBODY if os.geteuid() == 0 else os.geteuid()
    venv = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib")}
    # One at a time across pytest's workers: ``traversable`` gives the directories their modes
    # back at its end, which would shut out another worker's user still inside.
    with _one_at_a_time(), traversable(REPO, *venv):
        top = Path(tempfile.mkdtemp(prefix="raas-rootless-"))
        yield from _user_in(uid, top)


@contextlib.contextmanager
def _one_at_a_time() -> Iterator[None]:
    """An exclusive lock, across processes, on this checkout's unprivileged user."""
    lock = Path(tempfile.gettempdir()) / f"raas-unprivileged-{os.geteuid()}.lock"
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # the lock goes with it


def _user_in(uid: int, top: Path) -> Iterator[User]:
    try:
        top.chmod(0o711)  # the user may enter, not list
        home = top / "home"
        for sub in ("", "store", "run", "cache", "xdg"):
            (home / sub).mkdir(mode=0o700)
        _chown_tree(home, uid)
        (top / "shared").mkdir(mode=0o755)
        env = {
            "HOME": str(home),
            "PATH": TOOLS_PATH,
            "LANG": "C.UTF-8",
            "PYTHONPATH": str(REPO),
            "RAAS_IMAGE_STORE": str(home / "store"),
            "RAAS_CACHE_DIR": str(home / "cache"),
            "RAAS_SANDBOX_DIR": str(home / "run"),
            "XDG_RUNTIME_DIR": str(home / "xdg"),
        }
        user = User(uid, home, top / "shared", sys.executable, env)
        if not _runs_raas(user):
            python, extra = copy_interpreter(top / "python")
            user = User(uid, home, top / "shared", python, {**env, **extra})
            if not _runs_raas(user):
                raise RuntimeError(f"uid {uid} cannot run raas on a copy of {sys.executable}")
        yield user
    finally:
        remove_tree(top)  # read-only directories of the user's layers included


def readable(path: Path) -> None:
    """Let every user read ``path`` (a tree the test built for the user to read)."""
    for p in (path, *path.rglob("*")):
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | (0o555 if p.is_dir() else 0o444))


# -- run as the user: a sandbox of a stored image, and what it saw ------------------------------


SHELL_CHECKS = {
    "uid": "id -u",
    "fs": "stat -f -c %T /testbed",
    "issue": "test -e /etc/issue && echo present || echo gone",
    "opaque": "ls -A /opt/env",
    "edit": "echo 'Y = 2' >> /testbed/pkg/mod.py && mkdir /testbed/new && touch /testbed/new/f"
    " && rm /testbed/README && ls /testbed && cat /testbed/pkg/mod.py",
    "refill": "rm -r /opt/env && mkdir /opt/env && touch /opt/env/mine && ls -A /opt/env",
}


async def sandbox_report(ref: str, how: str) -> dict[str, object]:
    """Start a bwrap sandbox of ``ref`` from the default store, run the checks, close it."""
    from raas.images.store import ImageStore, default_store_dir
    from raas.sandbox import BwrapConfig, SandboxLimits, namespaced, rootfs
    from raas.sandbox.bwrap import BwrapSandbox

    report: dict[str, object] = {"overlay": rootfs.overlay_options(rootless=True)}
    if how == "copy":  # as where the kernel refuses an overlay
        namespaced.overlay_options = lambda rootless: None  # type: ignore[attr-defined,assignment]
    image = ImageStore(default_store_dir()).resolve(ref)
    limits = SandboxLimits(action_timeout_s=60, disk_bytes=256 << 20, start_timeout_s=60)
    runtime = Path(os.environ["RAAS_SANDBOX_DIR"])
    sandbox = BwrapSandbox(BwrapConfig(limits=limits, runtime_dir=runtime), image)
    await sandbox.start()
    try:
        python = await sandbox.exec(["python3", "-c", "import sys; print(sys.version_info[:2])"])
        report["python"] = [python.exit_code, python.stdout.strip()]
        for name, command in SHELL_CHECKS.items():
            result = await sandbox.bash(command)
            report[name] = [result.exit_code, result.output.split()]
    finally:
        await sandbox.close()
    report["left"] = sorted(p.name for p in runtime.iterdir())
    return report


def main(argv: list[str]) -> None:
    if argv[:1] == ["sandbox"] and len(argv) == 3:
        print(json.dumps(asyncio.run(sandbox_report(argv[1], argv[2]))))
    else:
        sys.exit("usage: python -m tests.support.unprivileged sandbox REF overlay|copy")


if __name__ == "__main__":
    main(sys.argv[1:])
