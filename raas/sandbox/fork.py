"""What forking a sandbox carries over, and how: its files (copied, or copy-on-write from a
sealed sandbox), its shell's place, and a note of what it cannot carry (``Sandbox.fork``).

A sandbox's writable state lives in tmpfs mounts of its own mount namespaces (the workspace,
``/tmp``; with an image, the overlay's upper directory, or the whole root in the copy
fallback), never on the host's disk, each capped (``disk_bytes``, ``tmp_bytes``). A fork's
copies land in the child's own mounts of the same kind, so its caps hold them: the workspace and
``/tmp`` are copied after the child starts (a tar pipe), the image's changes by the child's
launch, from an open directory of the parent's, into its tmpfs before it mounts its overlay
(``cp -a``: modes, links, xattrs such as overlayfs' opaque marks, and whiteouts kept;
``raas.sandbox.rootfs``). Sparse files stay sparse (``tar --sparse``, ``cp --sparse=always``),
and before anything is copied each of the parent's mounts is measured in allocated blocks
(``statvfs``), not file sizes: one that holds more than the child's cap is refused at once with
an error naming that cap (``check_fits``), so a copy never runs on until a timeout. The host
reaches the parent's mounts through ``/proc/PID/root`` of a process in that namespace.
Processes are not carried (no CRIU): the child starts with a fresh action server, shell and,
on first use, IPython kernel; what ran in the parent besides those is named in the child's note.

A sealed parent (``Sandbox.seal``: a group's template, a kept snapshot; idle by construction)
is not copied: its processes were killed when it was sealed (its shell's state and what ran
in it read first), so nothing can change its files again, and each fork's workspace and
``/tmp`` are overlays whose lower layer is the sealed mount (a detached read-only copy of it,
from ``raas.sandbox.cow``) and whose upper is the fork's own tmpfs of its caps: copy-on-write,
a fork's cost flat in the files. A live parent's fork copies as above: a parent that goes on
running could otherwise write into its children's view (a lower layer must not change), and
in GRPO a policy that lowers its siblings' rewards raises its own advantage. Only a sandbox
forked from its template's zygote is sealed: one with an image (whose root's changes its
forks' launches copy, ``raas.sandbox.rootfs``) or a network is not (``seal`` says False), nor
one whose forks' overlays would stack deeper than the kernel allows; their forks copy.

The shell's working directory and exported variables are carried as data, never as code. The
parent's shell is the agent's: it may define functions or aliases named ``export``,
``printf``, ``builtin``..., traps, ``set -x``, and whatever it prints is the agent's to shape,
so what the host reads there is untrusted text, and only ever becomes NAME=VALUE pairs and a
path. ``read_shell_command`` runs in a subshell (nothing of the parent's state changes): POSIX
mode for one command so that the special builtin ``unset`` removes a function named
``builtin``, then traps and tracing off; every command word is quoted (``\builtin``: neither
an alias nor a function shapes it), and the one loop is parsed by ``eval`` after ``unalias
-a`` (an alias of ``while`` would otherwise be expanded). It prints, NUL-separated between
markers with a nonce of the host, ``pwd`` and each exported variable as NAME=VALUE
(``compgen -e`` and indirect expansion: no program is run, so an environment too large to
``exec`` is still read). ``ShellState.parse`` keeps a variable only if its name is an
identifier, it is not one of the shell's own or read by the child's shell as code or settings
(``NOT_CARRIED``: ``PROMPT_COMMAND``, ``PS1``, ``BASH_ENV``, ``IFS``, ``SHELLOPTS``,
``BASH_*``...), and its value is at most ``VALUE_BYTES`` (Linux passes no longer one to a
program; bash prints at most one byte more); at most ``MAX_VARIABLES``, and none when the whole
is over ``SHELL_OUTPUT_BYTES`` or its end marker is missing (the child keeps its own
environment then). ``ShellState.restore_command`` is made on the host: the child's exported
variables unset (but for those not carried), each of the parent's set again as ``\builtin
export NAME=VALUE`` with the value quoted by ``shlex.quote``, then ``\builtin cd -- DIR``; a
directory the child lacks leaves it in its own. Functions, aliases, traps and shell options are
never carried. What was dropped is said in the child's note. A shell that hides its state
(builtins disabled, say) gives nothing readable: the child then starts in its own directory and
environment, and the note says so; what a background job writes to the terminal meanwhile
can spoil a value, never add code.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from raas.sandbox import procs
from raas.sandbox.client import SandboxError
from raas.sandbox.rootfs import TOOLS_PATH

# The most the reading command may print: over it, the parent's variables are not carried.
SHELL_OUTPUT_BYTES = 4 << 20
# The longest value carried (Linux's MAX_ARG_STRLEN: no program could be given a longer one).
VALUE_BYTES = 128 << 10
MAX_VARIABLES = 4096
MAX_PATH_BYTES = 4096
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
# Exported by every bash itself (the child's shell has its own): never carried, never noted.
SHELL_EXPORTS = frozenset({"_", "PWD", "OLDPWD", "SHLVL"})
# The shell's own (read-only, or special when assigned), or read by the child's shell as code
# (prompts, PROMPT_COMMAND, BASH_ENV) or as settings that change how it runs the host's
# commands (IFS, POSIX mode, TMOUT...): the parent's are not carried, the child keeps its own.
NOT_CARRIED = SHELL_EXPORTS | frozenset(
    {
        *("BASH", "BASHOPTS", "SHELLOPTS", "PPID", "UID", "EUID", "GROUPS", "HISTCMD"),
        *("LINENO", "RANDOM", "SRANDOM", "SECONDS", "EPOCHREALTIME", "EPOCHSECONDS"),
        *("DIRSTACK", "FUNCNAME", "PIPESTATUS", "OPTIND", "OPTERR", "COLUMNS", "LINES"),
        *("PROMPT_COMMAND", "PS0", "PS1", "PS2", "PS3", "PS4", "BASH_ENV", "ENV", "IFS"),
        *("POSIXLY_CORRECT", "TMOUT", "GLOBIGNORE", "CDPATH", "EXECIGNORE", "FUNCNEST"),
        *("HISTFILE", "INPUTRC", "MAIL", "MAILCHECK", "MAILPATH"),
    }
)
NOT_CARRIED_PREFIXES = ("BASH_", "COMP_")
# The child's shell prints this where the parent's directory is not in the child.
NO_DIRECTORY = "raas-fork: no such directory"
# The action server's own files in its scratch directory (its command scripts): the child's
# server has its own.
SCRATCH_OWN = ".raas-"
COPY_TIMEOUT_S = 600.0


# A name of the root's entries, as the launch's shell reads a list of them (no blank, no glob).
ENTRY_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")


@dataclass(frozen=True)
class ForkCarry:
    """What of its parent a fork carries: by default everything (the image root's changes, the
    workspace, ``/tmp``, the shell's state). A judge's fork carries less, so that nothing the
    agent left where the judge's own programs live can run in its place: ``image_kept`` names
    the root's entries (``usr``, ``etc``...) whose changes are dropped, the child seeing the
    image's own files there, as are the changes to the root's top-level entries that are not
    directories (a file planted at ``/``, a directory made a link); ``scratch`` False leaves
    the workspace, ``/tmp`` and the shell's state behind; ``tmpfs_dirs`` are top-level
    directories the child gets empty and writable whatever the parent had there (a judge's
    ``/tests``, ``/logs``: BwrapConfig.tmpfs_dirs); ``ro_binds``, where not None, are the
    child's read-only binds (host path, sandbox path) instead of the parent's (a judge's fork
    of a harness job's sandbox: the server's own, none of the agent program's files). Dropping
    needs overlayfs (a copy fallback's root cannot be pruned back to the image's files)."""

    image_kept: tuple[str, ...] = ()
    scratch: bool = True
    tmpfs_dirs: tuple[str, ...] = ()
    ro_binds: tuple[tuple[str, str], ...] | None = None

    def __post_init__(self) -> None:
        for name in self.image_kept:
            if not ENTRY_NAME.fullmatch(name):
                raise ValueError(f"ForkCarry.image_kept: {name!r} is not an entry of the root")


CARRY_ALL = ForkCarry()


def _markers(nonce: str) -> tuple[str, str]:
    return f"raas-shell-{nonce}-begin", f"raas-shell-{nonce}-end"


def read_shell_command(nonce: str) -> str:
    """The command for the parent's shell that prints its state (see the module's docstring):
    ``nonce`` (``[0-9a-f]+``, the host's) marks where it begins and ends. Only simple commands
    with quoted command words outside the ``eval``, which runs after ``unalias -a``."""
    if not re.fullmatch("[0-9a-f]+", nonce):
        raise ValueError("the nonce must be hexadecimal")
    begin, end = _markers(nonce)
    loop = (
        "while (($#)); do [[ -z ${!1+x} ]]"
        f' || \\builtin printf "%s=%.*s\\0" "$1" {VALUE_BYTES + 1} "${{!1}}"; \\builtin shift; done'
    )
    return (
        "(POSIXLY_CORRECT=1; \\unset -f builtin; \\builtin unset -v POSIXLY_CORRECT IFS\n"
        "\\builtin unalias -a; \\builtin trap - DEBUG ERR RETURN; \\builtin set +euxvTE\n"
        f"\\builtin printf '%s\\0' {begin}; \\builtin pwd; \\builtin printf '\\0'\n"
        "\\builtin set -- $(\\builtin compgen -e)\n"
        f"\\builtin eval '{loop}'\n"
        f"\\builtin printf '%s\\0' {end}) 2>/dev/null"
    )


def _not_carried(name: str) -> bool:
    return name in NOT_CARRIED or name.startswith(NOT_CARRIED_PREFIXES)


@dataclass(frozen=True)
class ShellState:
    """The parent shell's working directory and exported variables, as read and checked on the
    host; None where they could not be read (the child keeps its own). ``dropped``: what of
    them is not carried, in words for the child's note."""

    cwd: str | None
    env: tuple[tuple[str, str], ...] | None
    dropped: tuple[str, ...] = ()

    @classmethod
    def parse(cls, output: str, nonce: str, complete: bool = True) -> ShellState:
        """The state in ``output`` of ``read_shell_command(nonce)``; ``complete``: False where
        the output was cut (too large: the variables are not carried)."""
        begin, end = _markers(nonce)
        start = output.find(begin + "\0")
        if start < 0:
            return cls(None, None, ("its directory and exported variables (not readable)",))
        records = output[start + len(begin) + 1 :].split("\0")
        dropped: list[str] = []
        path = records[0].removesuffix("\n")
        cwd: str | None = path
        if not path.startswith("/") or len(path.encode()) > MAX_PATH_BYTES or len(records) < 2:
            cwd = None
            dropped.append("its directory (not readable)")
        if not complete:
            dropped.append(f"its exported variables (over {SHELL_OUTPUT_BYTES} bytes in all)")
            return cls(cwd, None, tuple(dropped))
        if end not in records[1:]:
            dropped.append("its exported variables (not readable)")
            return cls(cwd, None, tuple(dropped))
        env: dict[str, str] = {}
        for record in records[1 : records.index(end, 1)]:
            name, equals, value = record.partition("=")
            if not equals or not NAME.fullmatch(name):
                dropped.append(f"a variable named {name[:64]!r}")
            elif _not_carried(name):
                if name not in SHELL_EXPORTS:
                    dropped.append(f"{name} (read by the shell itself)")
            elif len(value.encode()) > VALUE_BYTES:
                dropped.append(f"{name} (its value is over {VALUE_BYTES} bytes)")
            elif len(env) >= MAX_VARIABLES and name not in env:
                dropped.append(f"{name} (over {MAX_VARIABLES} variables)")
            else:
                env[name] = value
        return cls(cwd, tuple(env.items()), tuple(dropped))

    def restore_command(self) -> str:
        """The child shell's command that makes its directory and exported variables the
        parent's: its own exported variables unset (but for those not carried), the parent's
        exported, then ``cd``; only builtins (``\\builtin``), every value and the path quoted.
        Prints NO_DIRECTORY where the directory is not in the child."""
        lines = ["\\builtin unalias -a; \\builtin trap - DEBUG ERR RETURN"]
        if self.env is not None:
            keep = "|".join([*sorted(NOT_CARRIED), *(f"{p}*" for p in NOT_CARRIED_PREFIXES)])
            loop = (
                "for _raas_v in $(\\builtin compgen -e); do"
                f' case $_raas_v in ({keep}) ;; (*) \\builtin unset -v "$_raas_v" ;; esac; done'
            )
            lines += [f"\\builtin eval '{loop}' 2>/dev/null", "\\builtin unset -v _raas_v"]
            lines += [f"\\builtin export {name}={shlex.quote(value)}" for name, value in self.env]
        if self.cwd is not None:
            lines.append(
                f"\\builtin cd -- {shlex.quote(self.cwd)} 2>/dev/null"
                f" || \\builtin printf '%s\\n' {shlex.quote(NO_DIRECTORY)}"
            )
        return "\n".join(lines)

    def not_restored(self, output: str) -> list[str]:
        """What the child's ``restore_command`` (its ``output``) could not set, in words."""
        if self.cwd is not None and NO_DIRECTORY in output:
            return [f"its directory {self.cwd!r} (not in this fork)"]
        return []


def used_bytes(mount: Path) -> int:
    """What the file system mounted at ``mount`` (a sandbox's tmpfs, through /proc/PID/root)
    holds in allocated blocks: a sparse file counts what it stores, not its size."""
    try:
        st = os.statvfs(mount)
    except OSError as e:
        raise SandboxError(f"fork: cannot measure the sandbox's {mount.name}: {e}") from None
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def check_fits(parent_id: str, mounts: Sequence[tuple[str, Path, str, int]]) -> None:
    """Refuse a fork of sandbox ``parent_id`` whose child could not hold what it would copy:
    ``mounts``, each (what, the parent's mount, the name of the child's cap of it, that cap in
    bytes). A SandboxError naming the first cap that is too small. Runs in a thread."""
    for what, mount, cap_name, cap in mounts:
        used = used_bytes(mount)
        if used > cap:
            raise SandboxError(
                f"fork of {parent_id}: {used} bytes (allocated) in its {what}, more than the"
                f" fork's {cap_name} ({cap} bytes): fork with a larger {cap_name}, or free"
                " space in the sandbox first"
            )


def copy_into(source: Path, target: Path, skip_prefix: str, uid: int | None) -> None:
    """Copy what directory ``source`` holds into ``target``, a directory of a sandbox's tmpfs
    (through its /proc/PID/root), as ``uid``: its host uid when raas runs as root, since that
    tmpfs belongs to the sandbox's user namespace, where root is no one (EOVERFLOW). A tar
    pipe (the holes of sparse files kept: ``--sparse``): root reads the parent, the child's uid
    writes. Runs in a thread."""
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
    pack = ["tar", "-C", str(source), "--xattrs", "--sparse", "-cf", "-", "--", *names]
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


def namespace_init(pids: set[int]) -> int | None:
    """The host PID of the PID namespace's init among ``pids`` (a sandbox's processes)."""
    return next((p for p in sorted(pids) if _ns_pid(p) == 1), None)


def not_carried(pids: set[int]) -> list[str]:
    """What runs in a sandbox besides its init, action server and shell (a fork carries none
    of it), each as ``name (pid N)`` with its PID in the sandbox; an IPython kernel as such.
    Runs in a thread: it reads /proc."""
    init = namespace_init(pids)
    # The action server is the first child of init (the one the launch started): another child
    # is a process the agent's shell left, reparented to init when its parent exited.
    children = sorted((_ns_pid(p) or 0, p) for p in pids if procs.parent_of(p) == init)
    servers = {children[0][1]} if children else set()
    shells = {p for p in pids if procs.parent_of(p) in servers and _comm(p) == "bash"}
    found: list[str] = []
    for pid in sorted(pids - {init} - servers - shells if init is not None else set()):
        if "ipykernel" in procs.command_line(pid):
            found.append("the IPython kernel (its variables and imports)")
        else:
            found.append(f"{_comm(pid) or '?'} (pid {_ns_pid(pid)})")
    return found


def fork_note(parent_id: str, lost: list[str], shell: Sequence[str] = ()) -> str | None:
    """The child's first observation's note, where something was not carried over: ``lost``,
    processes; ``shell``, parts of the shell's directory and variables."""
    if not lost and not shell:
        return None
    note = (
        f"this sandbox is a fork of sandbox {parent_id}: its files and the shell's directory"
        " and exported variables were carried over"
    )
    if lost:
        note += ", but not its running processes: " + ", ".join(lost)
    if shell:
        note += "; not carried from the shell: " + ", ".join(shell)
    return note


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
