"""A sandbox's cgroup (raas.sandbox.cgroups): its parent made again where it was swept away,
and the sweep of empty parents that no server's release takes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from raas.sandbox import cgroups

NO_CAPS = cgroups.Caps(None, None, None)


@pytest.fixture
def found() -> cgroups.Hierarchy:
    hierarchy = cgroups.hierarchy()
    if hierarchy is None:
        pytest.skip("no writable cgroup on this machine")
    return hierarchy


@pytest.fixture
def runtime(tmp_path: Path, found: cgroups.Hierarchy) -> Iterator[Path]:
    yield tmp_path
    cgroups.remove_all(tmp_path)


def parents(found: cgroups.Hierarchy, runtime: Path) -> list[Path]:
    return [base / cgroups.parent_name(runtime) for base in found.bases.values()]


def test_the_sweep_takes_an_empty_parent_and_leaves_one_holding_a_sandbox(
    found: cgroups.Hierarchy, runtime: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    group = cgroups.create(runtime, "s1", NO_CAPS)
    assert group is not None
    other = tmp_path_factory.mktemp("other")
    left = cgroups.create(other, "s2", NO_CAPS)
    assert left is not None and left.remove()  # its sandbox closed: the parent stays, empty
    # (Not asserted that it stays until here, nor how many this sweep takes: in make test, other
    # workers' servers sweep at their start too, and may take it first.)
    cgroups.sweep_parents()
    assert not any(p.exists() for p in parents(found, other))
    # The control: the kernel keeps a parent that holds a sandbox, and the sandbox with it.
    assert all(d.is_dir() for d in group.dirs.values())
    assert group.remove()


def test_the_sweep_leaves_what_is_not_a_sandbox_parent(found: cgroups.Hierarchy) -> None:
    # A process probing the hierarchy (raas-probe-PID) or anything else someone made is not raas's
    # to remove, empty or not.
    base = next(iter(found.bases.values()))
    probe, mine = base / "raas-probe-999999999", base / "not-raas"
    probe.mkdir()
    mine.mkdir()
    try:
        cgroups.sweep_parents()
        assert probe.is_dir() and mine.is_dir()
    finally:
        probe.rmdir()
        mine.rmdir()


def test_a_parent_swept_while_a_sandbox_is_made_in_it_is_made_again(
    found: cgroups.Hierarchy, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    swept = sweep_after_each_parent_mkdir(monkeypatch, times=2)
    group = cgroups.create(runtime, "s1", NO_CAPS)
    assert swept == [2]  # it did sweep between the two mkdirs, twice
    assert group is not None and all(d.is_dir() for d in group.dirs.values())
    assert group.remove()


def test_the_control_one_try_fails_as_the_race_would(
    found: cgroups.Hierarchy, runtime: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cgroups, "PARENT_TRIES", 1)
    sweep_after_each_parent_mkdir(monkeypatch, times=1)
    with pytest.raises(FileNotFoundError, match="was removed 1 times"):
        cgroups.create(runtime, "s1", NO_CAPS)
    assert not any(p.exists() for p in parents(found, runtime))  # nothing left half made


def sweep_after_each_parent_mkdir(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Path.mkdir, but the first ``times`` makings of a sandbox parent are swept right after."""
    mkdir, swept = Path.mkdir, [0]

    def racing(self: Path, *args: object, **kwargs: object) -> None:
        mkdir(self, *args, **kwargs)  # type: ignore[arg-type]
        if cgroups.PARENT_NAME.fullmatch(self.name) and swept[0] < times:
            swept[0] += 1
            self.rmdir()  # what another thread's sweep_parents does

    monkeypatch.setattr(Path, "mkdir", racing)
    return swept
