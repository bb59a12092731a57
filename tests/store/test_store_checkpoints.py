"""The store's side of durable turn boundaries (raas.store.checkpoints), on a real SQLite store.

The rows: a row of a job in flight reads back; one that goes on from turn k removes the job's
rows after k and their archives; none is kept for a finished job; a result takes its job's rows
and directory with it; an open removes what finished jobs (and anyone else) left, not what
unfinished jobs need. StoredCheckpoints gives a TurnCheckpoint back as it was kept.

The directory, attacked as a hostile local user of a shared host would (the database in a
directory others can write to): ``DB.checkpoints`` or a job's directory made first as a link,
as someone else's directory, as one open to everyone, an archive as a link to a file of raas's.
raas writes nothing there, reads nothing back, and removes nothing through it: each attack has a
snapshot of what the attacker pointed at, taken before and compared after every write and open
(the hostile owner is uid 65534, made with chown: the tests run as root). And as a user that is
not root, beside a directory it cannot enter, the store writes every result (it raised
PermissionError once the result was committed).
"""

from __future__ import annotations

import json
import os
import sqlite3
import stat
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import closing
from pathlib import Path

import pytest

from raas.agent.checkpoints import TurnCheckpoint
from raas.pipeline.checkpoints import StoredCheckpoints
from raas.store import checkpoints
from raas.store.checkpoints import CheckpointDirError, dir_name, root_of
from raas.store.sqlite import JobRecord, ResultStore
from raas.wire import RolloutResult, Timing, Trajectory
from tests.support.unprivileged import User, unprivileged_user

HOSTILE = 65534
ROOT = os.geteuid() == 0
as_root = pytest.mark.skipif(not ROOT, reason="another local user's files (chown) need root")


def job(job_id: str) -> JobRecord:
    return JobRecord(job_id, "queued", "probe", None, {}, 100.0)


def result(job_id: str) -> RolloutResult:
    return RolloutResult(
        job_id=job_id,
        state="done",
        data_source="probe",
        trajectory=Trajectory(response_ids=[1]),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
    )


async def opened(db: Path) -> ResultStore:
    """A store with two jobs in flight, ``live-1`` and ``live-2``."""
    store = ResultStore(db)
    await store.open()
    await store.add_jobs([job("live-1"), job("live-2")])
    return store


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[ResultStore]:
    store = await opened(tmp_path / "jobs.db")
    yield store
    await store.close()


def archive(store: ResultStore, job_id: str, name: str) -> Path:
    """An archive in the job's directory, as the Checkpointer writes one."""
    path = store.checkpoint_dir(job_id) / name
    path.write_bytes(f"{job_id}/{name}".encode())
    return path


async def keep(
    store: ResultStore, job_id: str, from_turn: int, turn: int, name: str | None
) -> None:
    await store.add_checkpoint(job_id, from_turn, turn, name, {"sha256": f"turn {turn}"})


async def chain(store: ResultStore, job_id: str) -> list[tuple[int, int, str | None]]:
    return [(r["from_turn"], r["turn"], r["archive"]) for r in await store.checkpoints(job_id)]


def files(store: ResultStore, job_id: str) -> set[str]:
    """The names in the job's directory (read without checking it: a test's eyes)."""
    folder = root_of(store.path) / dir_name(job_id)
    return {p.name for p in folder.iterdir()} if folder.is_dir() else set()


def rows_in_file(db: Path) -> list[tuple[str, int]]:
    """The rows as another reader of the file sees them (what was committed)."""
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT job_id, turn FROM checkpoints ORDER BY job_id, turn").fetchall()


async def reopen(store: ResultStore) -> ResultStore:
    await store.close()
    again = ResultStore(store.path)
    await again.open()
    return again


# -- the rows ------------------------------------------------------------------------------------


async def test_a_row_of_a_job_in_flight_reads_back(store: ResultStore) -> None:
    data = {"delta": {"response_ids": [5, 6], "messages": [{"content": "é ✓"}]}, "size": 7}
    await store.add_checkpoint("live-1", 0, 2, "t2.tar", data)
    assert await store.checkpoints("live-1") == [
        {**data, "turn": 2, "from_turn": 0, "archive": "t2.tar"}
    ]
    assert await store.checkpoints("live-2") == []


async def test_a_row_going_on_from_turn_k_removes_the_rows_after_k_and_their_archives(
    store: ResultStore,
) -> None:
    for turn, name in [(1, "a1"), (2, "a2"), (3, None), (4, "a4")]:
        if name is not None:
            archive(store, "live-1", name)
        await keep(store, "live-1", turn - 1, turn, name)
    archive(store, "live-2", "b1")
    await keep(store, "live-2", 0, 1, "b1")

    # Another run of live-1 resumed at turn 1: its turn 2 replaces every row after turn 1.
    archive(store, "live-1", "r2")
    await keep(store, "live-1", 1, 2, "r2")
    assert await chain(store, "live-1") == [(0, 1, "a1"), (1, 2, "r2")]
    assert files(store, "live-1") == {"a1", "r2"}  # a2 and a4 went; a1, at turn 1, stayed
    # The control: another job's rows and archives are not touched.
    assert await chain(store, "live-2") == [(0, 1, "b1")]
    assert files(store, "live-2") == {"b1"}


async def test_a_row_for_a_finished_job_is_not_kept(store: ResultStore) -> None:
    await store.save_result("live-1", result("live-1"))
    late = archive(store, "live-1", "late")  # a checkpoint written as the job finished
    await keep(store, "live-1", 0, 1, "late")
    assert await store.checkpoints("live-1") == []
    assert not late.exists()
    await keep(store, "never-submitted", 0, 1, None)
    assert await store.checkpoints("never-submitted") == []
    # The control: the same call for a job in flight keeps its row.
    await keep(store, "live-2", 0, 1, None)
    assert await chain(store, "live-2") == [(0, 1, None)]


async def test_a_result_takes_its_jobs_rows_and_directory(store: ResultStore) -> None:
    for job_id in ("live-1", "live-2"):
        archive(store, job_id, "a1")
        await keep(store, job_id, 0, 1, "a1")
    assert await store.save_result("live-1", result("live-1")) == result("live-1")
    assert await store.checkpoints("live-1") == []
    assert not (root_of(store.path) / dir_name("live-1")).exists()
    # The control: the job still in flight keeps both.
    assert await chain(store, "live-2") == [(0, 1, "a1")]
    assert files(store, "live-2") == {"a1"}
    assert rows_in_file(store.path) == [("live-2", 1)]


async def test_an_open_removes_what_finished_jobs_and_others_left_and_keeps_what_is_in_flight(
    tmp_path: Path,
) -> None:
    store = await opened(tmp_path / "jobs.db")
    for job_id in ("live-1", "live-2"):
        archive(store, job_id, "a1")
        await keep(store, job_id, 0, 1, "a1")
    root = root_of(store.path)
    precious = tmp_path / "precious"
    precious.write_text("raas's own")
    (root / "stray-file").write_text("x")
    (root / "stray-dir" / "deep").mkdir(parents=True, mode=0o700)
    (root / "stray-dir" / "deep" / "f").write_text("x")
    (root / "stray-link").symlink_to(precious)
    (root / "stray-dangling").symlink_to(tmp_path / "nowhere")
    await store.close()
    # A crash between live-1's result and its directory's removal (and a row of a job the
    # database never had, as another raas might leave).
    with closing(sqlite3.connect(store.path)) as conn, conn:
        conn.execute(
            "UPDATE jobs SET state = 'done', seq = 1, result = ? WHERE job_id = 'live-1'",
            (result("live-1").model_dump_json(),),
        )
        conn.execute(
            "INSERT INTO checkpoints (job_id, turn, from_turn, archive, data)"
            " VALUES ('ghost', 1, 0, NULL, ?)",
            (json.dumps({"a": 1}),),
        )

    store = ResultStore(store.path)
    await store.open()
    try:
        assert sorted(p.name for p in root.iterdir()) == [dir_name("live-2")]
        assert precious.read_text() == "raas's own"  # the link went, not what it named
        assert await store.checkpoints("live-1") == await store.checkpoints("ghost") == []
        assert await chain(store, "live-2") == [(0, 1, "a1")]
        assert files(store, "live-2") == {"a1"}
    finally:
        await store.close()


async def test_stored_checkpoints_give_a_turn_checkpoint_back_exactly(store: ResultStore) -> None:
    book = StoredCheckpoints(store)
    first = TurnCheckpoint(
        job_id="live-1",
        from_turn=0,
        turn=2,
        fingerprint={"request": "ab" * 16, "tools": "cd" * 16},
        delta={
            "prompt_ids": [1, 2],
            "response_ids": [3, 4],
            "loss_mask": [1, 0],
            "logprobs": [-0.123456789012345, 0.0],
            "turns": [{"index": 0, "tool_calls": 1}],
            "messages": [{"role": "assistant", "content": "é ✓ \u0000"}],
        },
        base=2,
        archive="turn-2.tar",
        size=12345,
        sha256="f" * 64,
        shell={"cwd": "/testbed/src", "env": {"A": "1", "B": ""}},
        lost=["a process in the background (sleep 100)"],
        created_at=1764000000.123456,
    )
    second = TurnCheckpoint(
        job_id="live-1", from_turn=2, turn=3, fingerprint={"request": "ab" * 16}, delta={}
    )
    await book.add_checkpoint(first)
    await book.add_checkpoint(second)
    # A row that is not a TurnCheckpoint (another raas's: no fingerprint) is not one.
    await store.add_checkpoint("live-1", 3, 4, None, {"delta": {}})
    assert await book.checkpoints("live-1") == [first, second]
    assert await book.checkpoints("live-2") == []
    assert book.job_dir("live-1") == root_of(store.path) / dir_name("live-1")


# -- the directory: the normal path --------------------------------------------------------------


def mode_and_owner(path: Path) -> tuple[bool, int, int]:
    st = path.lstat()
    return stat.S_ISDIR(st.st_mode), stat.S_IMODE(st.st_mode), st.st_uid


def test_the_directories_are_made_0700_and_raas_own(tmp_path: Path) -> None:
    db = tmp_path / "jobs.db"
    folder = checkpoints.job_dir(db, "live-1")
    assert folder == root_of(db) / dir_name("live-1")
    for made in (root_of(db), folder):
        assert mode_and_owner(made) == (True, 0o700, os.geteuid())
    assert checkpoints.job_dir(db, "live-1") == folder  # again: found, checked, the same


# -- the directory: attacked ---------------------------------------------------------------------


def snapshot(top: Path) -> dict[str, tuple[object, ...]]:
    """Everything at and under ``top``, never through a link: each entry's kind, content (a
    file's bytes, a link's target), owner and mode."""
    found: dict[str, tuple[object, ...]] = {}
    if not top.exists() and not top.is_symlink():
        return found
    paths = [top]
    if top.is_dir() and not top.is_symlink():
        for here, dirs, names in os.walk(top):  # a link to a directory is listed, not entered
            paths += [Path(here, name) for name in [*dirs, *names]]
    for path in paths:
        st = path.lstat()
        if stat.S_ISLNK(st.st_mode):
            what: object = ("link", os.readlink(path))
        elif stat.S_ISDIR(st.st_mode):
            what = "dir"
        else:
            what = path.read_bytes()
        found[str(path.relative_to(top))] = (what, st.st_uid, stat.S_IMODE(st.st_mode))
    return found


def theirs(path: Path, mode: int = 0o700) -> Path:
    """A directory of the hostile user's."""
    path.mkdir(mode=mode)
    path.chmod(mode)  # past the umask
    os.chown(path, HOSTILE, HOSTILE)
    return path


def their_link(link: Path, target: Path) -> Path:
    link.symlink_to(target)
    os.chown(link, HOSTILE, HOSTILE, follow_symlinks=False)
    return link


def bait(folder: Path, owner: int) -> Path:
    """What raas would remove or read if it went into ``folder``: a directory named as live-1's
    with an archive its rows name, and a stray file, all ``owner``'s."""
    (folder / dir_name("live-1")).mkdir(mode=0o700)
    for path in (folder / dir_name("live-1") / "a1", folder / "stray"):
        path.write_text("not raas's to remove")
    for path in (*folder.iterdir(), folder / dir_name("live-1") / "a1"):
        os.chown(path, owner, owner)
    return folder


# Each makes ``DB.checkpoints`` (``root``) as an attacker would, before raas, and returns what it
# wants raas to write into or remove from (its snapshot must not change).


def link_to_theirs(root: Path, tmp: Path) -> Path:
    their_link(root, bait(theirs(tmp / "theirs"), HOSTILE))
    return tmp / "theirs"


def link_to_raas_own(root: Path, tmp: Path) -> Path:
    """Another database's checkpoints (raas's own, 0700): its job live-1 is another job."""
    their_link(root, bait(checkpoints.own_dir(tmp / "other.db.checkpoints"), os.geteuid()))
    return tmp / "other.db.checkpoints"


def link_to_nowhere(root: Path, tmp: Path) -> Path:
    their_link(root, tmp / "made-by-raas")  # where raas would make it
    return tmp / "made-by-raas"


def their_dir(root: Path, tmp: Path) -> Path:
    return bait(theirs(root), HOSTILE)


def their_dir_open_to_all(root: Path, tmp: Path) -> Path:
    return bait(theirs(root, 0o777), HOSTILE)


def raas_dir_open_to_all(root: Path, tmp: Path) -> Path:
    bait(checkpoints.own_dir(root), HOSTILE).chmod(0o777)
    return root


def raas_dir_its_group_writes(root: Path, tmp: Path) -> Path:
    bait(checkpoints.own_dir(root), os.geteuid()).chmod(0o770)
    return root


def their_file(root: Path, tmp: Path) -> Path:
    root.write_text("theirs")
    os.chown(root, HOSTILE, HOSTILE)
    return root


ROOT_ATTACKS = [
    link_to_theirs,
    link_to_raas_own,
    link_to_nowhere,
    their_dir,
    their_dir_open_to_all,
    raas_dir_open_to_all,
    raas_dir_its_group_writes,
    their_file,
]


@as_root
@pytest.mark.parametrize("attack", ROOT_ATTACKS, ids=lambda attack: attack.__name__)
async def test_a_checkpoints_directory_raas_did_not_make_is_refused_and_never_gone_through(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, attack: Callable[[Path, Path], Path]
) -> None:
    db = tmp_path / "jobs.db"
    root = root_of(db)
    target = attack(root, tmp_path)
    before = snapshot(target)

    store = ResultStore(db)
    await store.open()
    await store.add_jobs([job("live-1")])
    with pytest.raises(CheckpointDirError) as refused:
        store.checkpoint_dir("live-1")
    message = str(refused.value)
    assert str(root) in message and "remove it" in message and "\n" not in message
    # Every path that removes: a row going on from turn 0 (a1's row goes), the result (the
    # job's directory goes), an open (finished jobs' directories and strays go).
    await keep(store, "live-1", 0, 1, "a1")
    await keep(store, "live-1", 0, 1, "a1-again")
    assert await chain(store, "live-1") == [(0, 1, "a1-again")]  # the rows are the store's
    assert await store.save_result("live-1", result("live-1")) == result("live-1")
    store = await reopen(store)
    await store.close()

    assert snapshot(target) == before
    assert str(root) in caplog.text  # the open said why it left the directory alone


@as_root
async def test_a_jobs_directory_raas_did_not_make_is_refused_and_never_gone_through(
    tmp_path: Path,
) -> None:
    store = await opened(tmp_path / "jobs.db")
    root = checkpoints.own_dir(root_of(store.path))
    # live-1's: a link (the attacker's) to a directory of raas's with its archives (live-2's).
    archive(store, "live-2", "a1")
    await keep(store, "live-2", 0, 1, "a1")
    linked = root / dir_name("live-2")
    their_link(root / dir_name("live-1"), linked)
    # job-3's: a directory of the attacker's, and job-4's: raas's user's, open to all.
    await store.add_jobs([job("job-3"), job("job-4")])
    bait(theirs(root / dir_name("job-3")), HOSTILE)
    bait(checkpoints.own_dir(root / dir_name("job-4")), HOSTILE).chmod(0o777)
    before = {
        name: snapshot(root / dir_name(name)) for name in ("live-1", "live-2", "job-3", "job-4")
    }
    del before["live-1"]  # the link itself raas may remove (never what it names)

    for job_id in ("live-1", "job-3", "job-4"):
        with pytest.raises(CheckpointDirError, match="remove it"):
            store.checkpoint_dir(job_id)
        await keep(store, job_id, 0, 1, "a1")
        await keep(store, job_id, 0, 1, "a1-again")
        await store.save_result(job_id, result(job_id))
    store = await reopen(store)
    try:
        assert {name: snapshot(root / dir_name(name)) for name in before} == before
        assert await chain(store, "live-2") == [(0, 1, "a1")]  # the control: untouched
        assert store.checkpoint_dir("live-2") == linked
    finally:
        await store.close()


@as_root
async def test_an_archive_that_is_a_link_is_removed_itself_never_what_it_names(
    tmp_path: Path, store: ResultStore
) -> None:
    precious = tmp_path / "precious"
    precious.write_text("raas's own")
    folder = store.checkpoint_dir("live-1")
    archive(store, "live-2", "a1")
    their_link(folder / "a1", precious)
    their_link(folder / "dir-link", tmp_path)
    await keep(store, "live-1", 0, 1, "a1")
    # Names no archive of raas's has (rows another raas wrote, or tampered): never a path.
    odd = ["..", ".", "", f"../{dir_name('live-2')}/a1", str(precious), "a\0b"]
    for turn, name in enumerate(odd, start=2):
        await keep(store, "live-1", turn - 1, turn, name)
    their_link(folder / "a2", precious)
    await keep(store, "live-1", 0, 1, "a2")  # another run's turn 1: every row above goes
    assert await chain(store, "live-1") == [(0, 1, "a2")]
    assert sorted(p.name for p in folder.iterdir()) == ["a2", "dir-link"]
    assert precious.read_text() == "raas's own"
    assert files(store, "live-2") == {"a1"}

    await store.save_result("live-1", result("live-1"))
    assert not folder.exists() and not folder.is_symlink()
    assert precious.read_text() == "raas's own"
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "jobs.db",
        "jobs.db-shm",
        "jobs.db-wal",
        "jobs.db.checkpoints",
        "jobs.db.lock",
        "precious",
    ]
    assert files(store, "live-2") == {"a1"}


# -- as a user that is not root (the attacker: root, here) ---------------------------------------


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    if not ROOT:
        pytest.skip("another local user (setpriv) needs root")
    with unprivileged_user() as user:
        yield user


SAVE_AS_USER = """
import asyncio, json, sys
from pathlib import Path
from raas.store.checkpoints import CheckpointDirError
from raas.store.sqlite import JobRecord, ResultStore
from raas.wire import RolloutResult, Timing, Trajectory

async def main(db: Path) -> dict[str, object]:
    seen: dict[str, object] = {}
    store = ResultStore(db)
    await store.open()
    await store.add_jobs([JobRecord("live-1", "queued", "probe", None, {}, 1.0)])
    try:
        store.checkpoint_dir("live-1")
    except CheckpointDirError as e:
        seen["refused"] = str(e)
    await store.add_checkpoint("live-1", 0, 1, "a1", {})
    await store.add_checkpoint("live-1", 0, 1, "a2", {})
    done = RolloutResult(job_id="live-1", state="done", data_source="probe",
        trajectory=Trajectory(), timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0))
    seen["saved"] = await store.save_result("live-1", done) == done
    await store.close()
    return seen

print(json.dumps(asyncio.run(main(Path(sys.argv[1])))))
"""


def test_a_users_store_writes_results_beside_another_users_checkpoints_directory(
    user: User,
) -> None:
    """raas as an unprivileged user, the directory another's (root's: it can neither enter nor
    read it): every write of the store succeeds, and the directory is refused with a reason."""
    folder = user.home / "shared-db"
    folder.mkdir()
    os.chown(folder, user.uid, user.uid)
    db = folder / "jobs.db"
    root_of(db).mkdir(mode=0o700)
    bait(root_of(db), 0)
    before = snapshot(root_of(db))
    run = user.python_run("-c", SAVE_AS_USER, str(db), timeout=120)
    assert run.returncode == 0, run.stderr
    seen = json.loads(run.stdout)
    assert seen["saved"] is True
    assert "remove it" in str(seen["refused"])
    assert snapshot(root_of(db)) == before
