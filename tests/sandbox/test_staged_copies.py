"""Staged copies (``py-<digest>`` under the runtime root) do not pile up: a copy no process
holds is removed once it is obsolete, and a copy some process holds never is.

Each test stages a copy of a directory with ``staged_binds`` (what the harness tasks bind into
sandboxes), in a runtime root of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from raas.sandbox import copies
from raas.sandbox.pydeps import staged_binds

# Stages SOURCE in a process of its own, prints the copy's path, then holds it until its stdin
# closes (or exits at once with "exit").
STAGER = """
import sys
from raas.sandbox.pydeps import staged_binds
[host] = staged_binds(None, {sys.argv[1]: "/x"}, own_files=True)
print(host, flush=True)
if sys.argv[2] == "hold":
    sys.stdin.read()
"""


@pytest.fixture
def root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RAAS_SANDBOX_DIR", str(tmp_path / "run"))
    return tmp_path / "run" / f"raas-{os.getuid()}"


def _source(tmp_path: Path, name: str, text: str = "v1") -> Path:
    source = tmp_path / name
    source.mkdir(exist_ok=True)
    (source / "agent.py").write_text(text)
    return source


def _stage(source: Path) -> Path:
    [host] = staged_binds(None, {str(source): "/x"}, own_files=True)
    return Path(host).parent


@contextlib.contextmanager
def _copy_in(source: Path, hold: bool) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    proc = subprocess.Popen(
        [sys.executable, "-c", STAGER, str(source), "hold" if hold else "exit"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert proc.stdout is not None
    copy = Path(proc.stdout.readline().strip()).parent
    try:
        yield copy, proc
    finally:
        proc.communicate(timeout=60)


def _in_other_process(source: Path) -> Path:
    with _copy_in(source, hold=False) as (copy, _):
        return copy


def test_a_copy_of_files_that_are_gone_is_removed_and_one_of_files_that_are_not_stays(
    tmp_path: Path, root: Path
) -> None:
    gone = _in_other_process(_source(tmp_path, "deleted-clone"))
    kept = _in_other_process(_source(tmp_path, "other-agent"))
    (tmp_path / "deleted-clone" / "agent.py").unlink()
    (tmp_path / "deleted-clone").rmdir()
    assert gone.is_dir() and kept.is_dir()

    new = _stage(_source(tmp_path, "third-agent"))

    assert not gone.exists()
    assert kept.is_dir() and new.is_dir()


def test_an_older_copy_of_the_same_files_is_removed_unless_a_live_process_holds_it(
    tmp_path: Path, root: Path
) -> None:
    source = _source(tmp_path, "agent")
    old = _in_other_process(source)
    with _copy_in(_source(tmp_path, "agent", "v2"), hold=True) as (held, proc):
        (source / "agent.py").write_text("v3 and longer")  # a new version: a new copy

        new = _stage(source)

        assert new != held and new.is_dir()
        assert (new / "dir0" / "agent.py").read_text() == "v3 and longer"
        assert not old.exists(), "the copy of v1 no process holds stays"
        assert held.is_dir(), "the copy of v2 a live process holds was removed"
        assert proc.poll() is None


def test_a_copy_from_before_copies_said_their_sources_is_removed(
    tmp_path: Path, root: Path
) -> None:
    root.mkdir(parents=True)
    legacy = root / f"{copies.PREFIX}0123456789abcdef"
    (legacy / "py").mkdir(parents=True)

    _stage(_source(tmp_path, "agent"))

    assert not legacy.exists()


def test_a_staging_directory_is_removed_only_once_its_maker_is_gone(
    tmp_path: Path, root: Path
) -> None:
    root.mkdir(parents=True)
    dead, live = root / ".staging-dead", root / ".staging-live"
    dead.mkdir()
    live.mkdir()
    fd = os.open(live, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # its maker is still copying (here: this test)
    try:
        _stage(_source(tmp_path, "agent"))
        assert not dead.exists()
        assert live.is_dir()
    finally:
        os.close(fd)


def test_a_copy_removed_by_hand_is_made_and_held_again(tmp_path: Path, root: Path) -> None:
    source = _source(tmp_path, "agent")
    first = _stage(source)
    for path in sorted(first.rglob("*"), reverse=True):
        path.unlink() if not path.is_dir() else path.rmdir()
    first.rmdir()

    again = _stage(source)

    assert again == first and (again / "dir0" / "agent.py").read_text() == "v1"
    assert copies.hold(again)  # held by this process already: no second lock


def test_a_program_staged_stays_runnable_and_other_files_do_not_become_so(
    tmp_path: Path, root: Path
) -> None:
    """The npm agents' node binary is staged like a package: a copy made 0644 could not run."""
    source = _source(tmp_path, "node")
    program = source / "node"
    program.write_text("#!/bin/sh\necho ran\n")
    program.chmod(0o700)  # the owner's alone: the sandbox's uid may be another
    [host] = staged_binds(None, {str(program): "/x/node"})
    assert os.stat(host).st_mode & 0o777 == 0o755
    assert subprocess.run([host], capture_output=True, text=True).stdout == "ran\n"
    [copy] = staged_binds(None, {str(source): "/x"})
    assert (Path(copy) / "agent.py").stat().st_mode & 0o777 == 0o644
