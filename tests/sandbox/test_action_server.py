"""The in-sandbox action server stands alone: standard library only, Python 3.8 syntax."""

from __future__ import annotations

import ast
import asyncio
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from raas.sandbox.base import INSIDE_DIR

sys.path.insert(0, str(INSIDE_DIR))
from outbuf import OutputBuffer

FILES = sorted(INSIDE_DIR.glob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_parses_as_python_3_8(path: Path) -> None:
    ast.parse(path.read_text(), feature_version=(3, 8))


def test_imports_only_the_standard_library() -> None:
    """Import the server under -X dev and list every module it pulled in that is not stdlib."""
    probe = (
        "import sys, json; sys.path.insert(0, sys.argv[1]); before = set(sys.modules);"
        " import server;"
        " own = {p.stem for p in __import__('pathlib').Path(sys.argv[1]).glob('*.py')};"
        " new = {m.split('.')[0] for m in set(sys.modules) - before} - own;"
        " print(json.dumps(sorted(m for m in new if m not in sys.stdlib_module_names)))"
    )
    out = subprocess.run(
        [sys.executable, "-X", "dev", "-I", "-c", probe, str(INSIDE_DIR)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(out.stdout) == []
    assert "Warning" not in out.stderr


def test_output_buffer_keeps_head_and_tail_exactly() -> None:
    buf = OutputBuffer(max_bytes=10)
    data = b"".join(bytes([65 + i % 26]) for i in range(10_000))
    for i in range(0, len(data), 7):
        buf.feed(data[i : i + 7])
    text, cut = buf.text()
    assert cut == len(data) - 10
    assert text.startswith(data[:5].decode()) and text.endswith(data[-5:].decode())
    small = OutputBuffer(max_bytes=100)
    small.feed(b"hello\nmarker")
    assert small.text(cut_at_end=len(b"\nmarker")) == ("hello", 0)


@pytest.mark.parametrize("spawn", [True, False], ids=["posix_spawn", "fork"])
async def test_the_shell_starts_by_posix_spawn_or_else_by_fork_alike(
    spawn: bool, tmp_path: Path
) -> None:
    # posix_spawn (no copy of the server's pages) where the shell's directory is the server's;
    # a fork that changes directory where it is not. Either way: a session of its own on the
    # pty, the default signal dispositions, no echo, 1000 columns.
    from shell import DEFAULTS, Shell

    here = Path.cwd()
    shell = Shell(str(here if spawn else tmp_path), dict(os.environ), str(tmp_path))
    spawned = shell._spawn()
    assert (spawned is not None) == spawn
    if spawned is not None:
        os.killpg(spawned[0], signal.SIGKILL)
        await asyncio.to_thread(os.waitpid, spawned[0], 0)
        os.close(spawned[1])
    await shell.start()
    try:
        probe = (
            "echo $$ $(ps -o sid= -p $$) $(tty); pwd; stty -a | grep -o 'columns [0-9]*';"
            " awk '/^SigIgn/ {print $2}' /proc/self/status"
        )
        result = await shell.run(probe, 10, 4096)
        pid, sid, tty, cwd, _, columns, ignored = result["output"].split()
        assert pid == sid == str(shell.pid) and tty.startswith("/dev/pts/"), result
        assert cwd == str(here if spawn else tmp_path) and columns == "1000", result
        for sig in DEFAULTS:  # a command's own process does not ignore them
            assert not int(ignored, 16) & 1 << (sig - 1), (sig, ignored)
        interrupted = await shell.run("sleep 30", 0.5, 4096)
        assert interrupted["timed_out"] and interrupted["exit_code"] == 130
        assert (await shell.run("echo alive", 5, 4096))["output"] == "alive\n"
    finally:
        shell.close()
