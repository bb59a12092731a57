"""The Python raas provides to an image that has none its action server can run on.

An image without python3, or with one older than 3.8 (``rootfs.probe_python``), still runs its
tools (its own bash, coreutils, compilers): only the action server needs a Python. raas then
lends it the one it runs on itself: that interpreter's real binary, its standard library (with
lib-dynload, without site-packages, the test suite and Tk) and every shared library they need,
the dynamic loader among them (found with ``ldd``), copied once into a held copy under the
runtime root (``pydeps.stage_copy``; the copy is cleaned as the others are) and bound read-only
at ``MOUNT``, each time only once verified (``copies.verify``). It is started through its own
loader (``ARGV``): ``--library-path`` names the copy's libraries and ``--inhibit-cache`` keeps
the image's ``/etc/ld.so.cache`` out, so it never loads the image's libc; and as the binary sits
at ``bin/`` beside ``lib/python3.X``, Python finds its home from its own path (no PYTHONHOME,
which ``-I`` would ignore, and which the tools the agent runs would inherit). The loader's
options are its command line, not its environment: the agent's shell and the image's own
programs get nothing of it.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

from raas.sandbox import copies, pydeps
from raas.sandbox.client import SandboxError

MOUNT = "/.raas/python"
# What of the standard library an action server never imports (the bytecode of its plain
# imports is kept: the copy is read-only, and compiling at each start would slow it).
LEAVE_OUT = (
    "*.opt-1.pyc",
    "*.opt-2.pyc",
    "site-packages",
    "dist-packages",
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "config-3*",
    "_tkinter*",
)
# A line of ldd's: "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)", or the loader's own
# "/lib64/ld-linux-x86-64.so.2 (0x...)".
_LDD_LINE = re.compile(r"^\s*(?:(\S+) => )?(/\S+) \(0x[0-9a-f]+\)$")


@dataclass(frozen=True)
class ProvidedPython:
    """The host copy to bind read-only at ``MOUNT``, and the argv that runs it in a sandbox."""

    copy: Path
    argv: tuple[str, ...]


def provided_python() -> ProvidedPython:
    """This Python, staged for sandboxes (once a process; again if the copy was removed), and
    verified for the sandbox about to bind it (``copies.verify``: a copy whose files changed
    since it was staged is refused). Blocking: call it off the loop. A SandboxError where it
    cannot be staged or verified."""
    found = _provided()
    if not copies.current(found.copy):  # removed under us (a /tmp clean-up), or made again
        _provided.cache_clear()
        found = _provided()
    copies.verify(found.copy)
    return found


@functools.cache
def _provided() -> ProvidedPython:
    binary = Path(os.path.realpath(sys.executable))
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not (stdlib / "os.py").is_file():
        raise SandboxError(f"cannot lend this Python to images: no standard library at {stdlib}")
    libraries, loader = _shared_libraries([binary, *_extensions(stdlib)])
    sources = {f"bin/{version}": binary, f"lib/{version}": stdlib}
    sources |= {f"lib/{name}": host for name, host in libraries.items()}
    copy = pydeps.stage_copy(sources, ["provided python"], LEAVE_OUT)
    argv = (
        f"{MOUNT}/lib/{loader.name}",
        "--inhibit-cache",
        "--library-path",
        f"{MOUNT}/lib",
        f"{MOUNT}/bin/{version}",
    )
    return ProvidedPython(copy, argv)


def _extensions(stdlib: Path) -> list[Path]:
    """The compiled modules of the standard library that are copied (lib-dynload's)."""
    dynload = stdlib / "lib-dynload"
    if not dynload.is_dir():
        return []
    left_out = [p for pattern in LEAVE_OUT for p in dynload.glob(pattern)]
    return [p for p in sorted(dynload.glob("*.so")) if p not in left_out]


def _shared_libraries(files: list[Path]) -> tuple[dict[str, Path], Path]:
    """Every shared library ``files`` load (``{soname: host file}``, the loader included) and
    the loader, as ldd resolves them here. A library ldd cannot find is left out: only the
    extension module that needs it fails to import."""
    try:
        result = subprocess.run(
            ["ldd", *map(str, files)], capture_output=True, text=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"cannot lend this Python to images: ldd failed ({e})") from None
    libraries: dict[str, Path] = {}
    loader: Path | None = None
    for line in result.stdout.splitlines():
        match = _LDD_LINE.match(line)
        if match is None:
            continue
        soname, host = match[1], Path(match[2])
        if soname is None:
            loader = host
            libraries[host.name] = Path(os.path.realpath(host))
        elif "/" not in soname:
            libraries.setdefault(soname, Path(os.path.realpath(host)))
    if loader is None:
        raise SandboxError(
            f"cannot lend this Python to images: ldd names no dynamic loader for {files[0]}"
            f" ({result.stderr.strip() or 'a static binary?'})"
        )
    return libraries, loader
