"""What forking a live sandbox carries over, and how: its files, its shell's place, and a note
of what it cannot carry (``Sandbox.fork``).

A sandbox's writable state lives in tmpfs mounts of its own mount namespaces (the workspace,
``/tmp``; with an image, the overlay's upper directory, or the whole root in the copy
fallback), never on the host's disk. The host reaches them through ``/proc/PID/root`` of a
process in that namespace and copies them (``cp -a``: modes, links, xattrs such as overlayfs'
opaque marks, and whiteouts kept). The shell's working directory and exported variables are
read by one command in the parent's shell and set again by one in the child's. Processes are
not carried (no CRIU): the child starts with a fresh action server, shell and, on first use,
IPython kernel; what ran in the parent besides those is named in the child's note.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from raas.sandbox import procs
from raas.sandbox.client import SandboxError
from raas.sandbox.rootfs import TOOLS_PATH

# One line of the working directory, then bash's ``declare -x`` lines (quoted for re-reading).
READ_SHELL = 'printf "%s\\n" "$PWD"; export -p'
SHELL_OUTPUT_BYTES = 1 << 20
# The action server's own files in its scratch directory (its command scripts): the child's
# server has its own.
SCRATCH_OWN = ".raas-"
COPY_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ShellState:
    """The parent shell's working directory and ``export -p`` lines."""

    cwd: str
    exports: str

    @classmethod
    def parse(cls, output: str) -> ShellState:
        lines = output.replace("\r\n", "\n").split("\n")
        return cls(lines[0], "\n".join(line for line in lines[1:] if line.strip()))

    def restore_command(self) -> str:
        """The child shell's command that makes its environment the parent's: every exported
        variable unset, the parent's exported again (read-only ones stay as they are), then
        ``cd`` to the parent's directory."""
        return (
            '{ for _v in $(compgen -e); do unset "$_v"; done; unset _v\n'
            f"{self.exports}\n"
            f"}} 2>/dev/null; cd -- {shlex.quote(self.cwd)}"
        )


def copy_entries(
    source: Path, target: Path, skip_prefix: str = "", owner: tuple[int, int] | None = None
) -> None:
    """Copy what directory ``source`` holds into directory ``target`` (``cp -a``), leaving
    out names that start with ``skip_prefix``; ``owner``: (from uid, to uid) to give what the
    from uid owned to the other (raas as root: each sandbox has a host uid of its own).
    Runs in a thread; a SandboxError says why a copy failed (a full tmpfs, for one)."""
    try:
        names = sorted(source.iterdir())
    except OSError as e:
        raise SandboxError(f"cannot read the sandbox's {source.name}: {e}") from None
    entries = [str(p) for p in names if not (skip_prefix and p.name.startswith(skip_prefix))]
    if entries:
        _run(["cp", "-a", "--reflink=auto", "--", *entries, str(target)])
        if owner is not None and owner[0] != owner[1]:
            spec = f"{owner[1]}:{owner[1]}"
            _run(["chown", "-hR", f"--from={owner[0]}:{owner[0]}", spec, "--", *_in(target, names)])


def _in(target: Path, names: list[Path]) -> list[str]:
    return [str(target / p.name) for p in names if (target / p.name).exists()]


def copy_into(source: Path, target: Path, skip_prefix: str, uid: int | None) -> None:
    """Copy what directory ``source`` holds into ``target``, a directory of a sandbox's tmpfs
    (through its /proc/PID/root), as ``uid``: its host uid when raas runs as root, since that
    tmpfs belongs to the sandbox's user namespace, where root is no one (EOVERFLOW). A tar
    pipe: root reads the parent, the child's uid writes. Runs in a thread."""
    try:
        names = [p.name for p in sorted(source.iterdir())]
    except OSError as e:
        raise SandboxError(f"cannot read the sandbox's {source.name}: {e}") from None
    names = [n for n in names if not (skip_prefix and n.startswith(skip_prefix))]
    if not names:
        return
    as_uid: list[str] = []
    if uid is not None:
        setpriv = shutil.which("setpriv", path=TOOLS_PATH) or "setpriv"
        as_uid = [setpriv, f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    pack = ["tar", "-C", str(source), "--xattrs", "-cf", "-", "--", *names]
    unpack = [*as_uid, "tar", "-C", str(target), "--xattrs", "-xpf", "-", "--no-same-owner"]
    try:
        with subprocess.Popen(pack, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as reader:
            assert reader.stdout is not None
            written = subprocess.run(
                unpack, stdin=reader.stdout, capture_output=True, timeout=COPY_TIMEOUT_S
            )
            reader.stdout.close()
            read_error = reader.stderr.read() if reader.stderr is not None else b""
            reader.wait(timeout=COPY_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"fork: copying {source.name} failed: {e}") from None
    if reader.returncode != 0 or written.returncode != 0:
        why = (read_error + written.stderr).decode(errors="replace").strip()[-1000:]
        raise SandboxError(f"fork: copying {source.name} failed: {why}")


def _run(argv: list[str]) -> None:
    try:
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=COPY_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxError(f"fork: {argv[0]} failed: {e}") from None
    if result.returncode != 0:
        raise SandboxError(f"fork: {argv[0]} failed: {result.stderr.strip()[-1000:]}")


def namespace_init(pids: set[int]) -> int | None:
    """The host PID of the PID namespace's init among ``pids`` (a sandbox's processes)."""
    return next((p for p in sorted(pids) if _ns_pid(p) == 1), None)


def not_carried(pids: set[int]) -> list[str]:
    """What runs in a sandbox besides its init, action server and shell (a fork carries none
    of it), each as ``name (pid N)`` with its PID in the sandbox; an IPython kernel as such.
    Runs in a thread: it reads /proc."""
    init = namespace_init(pids)
    servers = {p for p in pids if procs.parent_of(p) == init}
    shells = {p for p in pids if procs.parent_of(p) in servers and _comm(p) == "bash"}
    found: list[str] = []
    for pid in sorted(pids - {init} - servers - shells if init is not None else set()):
        if "ipykernel" in procs.command_line(pid):
            found.append("the IPython kernel (its variables and imports)")
        else:
            found.append(f"{_comm(pid) or '?'} (pid {_ns_pid(pid)})")
    return found


def fork_note(parent_id: str, lost: list[str]) -> str | None:
    """The child's first observation's note, where something was not carried over."""
    if not lost:
        return None
    return (
        f"this sandbox is a fork of sandbox {parent_id}: its files and the shell's directory"
        f" and exported variables were carried over, but not its running processes: "
        + ", ".join(lost)
    )


def _status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def _ns_pid(pid: int) -> int | None:
    """``pid``'s number in its own (innermost) PID namespace."""
    numbers = _status(pid).get("NSpid", "").split()
    return int(numbers[-1]) if numbers else None


def _comm(pid: int) -> str:
    return _status(pid).get("Name", "").strip()
