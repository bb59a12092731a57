"""A Harbor task named by its path (``{"data_source": "harbor", "path": ...}``), read by the
server beneath its Harbor roots at submission, and the one reader (raas.helpers.task_dirs) the
client shares, against a hostile directory: every attack beside a control that passes.

The attacker is a tenant naming paths, and another user who can write under a root (a shared
dataset's directory): links out of the root or the task, ``..``, FIFOs, sockets and devices
(which would hang or feed a read without end), files larger than the cap or growing while read,
directories of too many entries or too deep, hard links to files the attacker cannot read, a
file swapped for a link or a FIFO between its check and its open, a root's own link moved."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from raas.api.openapi import document_instances
from raas.cli.serve import serve
from raas.client.task_files import as_requests, read_tasks
from raas.helpers import task_dirs
from raas.helpers.task_dirs import (
    MAX_DEPTH,
    MAX_ENTRIES,
    MAX_TASK_BYTES,
    MAX_TASK_FILES,
    NotATaskUnderRoots,
    TaskDirError,
    read_task_dir,
    read_task_under,
)
from raas.pipeline import JobRequest, Pipeline, RequestRejected
from raas.pipeline.errors import JobIdConflict
from raas.sandbox import BwrapConfig
from raas.settings import SettingsError, TaskSettings, load_settings
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks import services as services_module
from raas.tasks.harbor.instance import HarborInstance
from raas.tasks.harbor.task import HarborTask
from raas.tasks.harness import HarnessTask
from raas.tasks.protocol import InvalidInstance, Submission, TaskJob
from raas.tasks.services import TaskServices
from tests.conftest import small_config

TOML = 'schema_version = "1.1"\n[environment]\ndocker_image = "raas/harbor-base:bookworm"\n'
TEST_SH = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"
Roots = list[tuple[Path, Path]]


def make_task(path: Path, instruction: str = "Say hello.\n") -> Path:
    (path / "tests").mkdir(parents=True)
    (path / "environment").mkdir()
    (path / "task.toml").write_text(TOML)
    (path / "instruction.md").write_text(instruction)
    (path / "tests" / "test.sh").write_text(TEST_SH)
    return path


def roots_of(*dirs: Path) -> Roots:
    """As the server holds its roots: as given (absolute), and where they led at its start."""
    return [(Path(os.path.abspath(d)), Path(os.path.realpath(d))) for d in dirs]


def within(call: Callable[[], Any], seconds: float = 20.0) -> Any:
    """``call()`` in a thread that must end within ``seconds``: a read that opened a FIFO or a
    device would block there, and the test says so instead of hanging."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = call()
        except BaseException as e:  # handed to the test's thread
            out["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"the read hung for {seconds} s"
    if "error" in out:
        raise out["error"]
    return out["value"]


@pytest.fixture
def layout(tmp_path: Path) -> dict[str, Path]:
    """A root holding a task, and beside it (outside the root) a private task and a secret."""
    root = tmp_path / "datasets"
    make_task(root / "hello")
    outside = tmp_path / "private"
    make_task(outside / "secret-task", instruction="the private task\n")
    (outside / "secret.txt").write_text("s3cret\n")
    os.chmod(outside / "secret.txt", 0o600)
    return {"root": root, "task": root / "hello", "outside": outside}


# -- naming a task: beneath the roots, or one answer ----------------------------------------------


def test_control_a_task_beneath_a_root_is_read_as_the_client_reads_it(
    layout: dict[str, Path],
) -> None:
    read = read_task_under(str(layout["task"]), roots_of(layout["root"]))
    assert read == read_task_dir(layout["task"])  # one reader, client and server
    assert read["name"] == "hello" and read["files"]["instruction.md"] == "Say hello.\n"
    HarborInstance.model_validate(read)
    # A trailing slash, the root itself as a dataset's one task, a link beneath the root.
    assert read_task_under(str(layout["task"]) + "/", roots_of(layout["root"])) == read
    assert read_task_under(str(layout["task"]), roots_of(layout["task"]))["name"] == "hello"
    (layout["root"] / "latest").symlink_to("hello")
    (layout["root"] / "sub").mkdir()
    (layout["root"] / "sub" / "up").symlink_to("../hello")
    (layout["root"] / "absolute").symlink_to(layout["task"])
    for name in ("latest", "sub/up", "absolute"):
        assert read_task_under(f"{layout['root']}/{name}", roots_of(layout["root"])) == read


def test_every_path_that_is_no_task_beneath_the_roots_gets_one_answer(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    """Outside, missing, through ``..``, a link out (to something or to nothing), a file, a
    directory without task.toml, a FIFO (never opened), a loop of links, /proc: the same text,
    so that no answer says whether something exists outside the roots."""
    root, outside = layout["root"], layout["outside"]
    (root / "to-private").symlink_to(outside / "secret-task")
    (root / "to-private-relative").symlink_to("../private/secret-task")
    (root / "to-nothing").symlink_to(tmp_path / "no-such-dir")
    (root / "to-etc").symlink_to("/etc")
    (root / "loop-a").symlink_to("loop-b")
    (root / "loop-b").symlink_to("loop-a")
    (root / "a-file").write_text("x")
    (root / "no-toml").mkdir()
    os.mkfifo(root / "fifo")
    make_task(root / "fifo-toml")
    (root / "fifo-toml" / "task.toml").unlink()
    os.mkfifo(root / "fifo-toml" / "task.toml")
    make_task(root / "toml-link-out")
    (root / "toml-link-out" / "task.toml").unlink()
    (root / "toml-link-out" / "task.toml").symlink_to(outside / "secret-task" / "task.toml")
    paths = [
        str(outside / "secret-task"),  # a task, outside
        str(outside / "missing"),
        "/etc/shadow",
        "/etc",
        "/proc/self/environ",
        "/proc/self/root/etc",
        "/dev/zero",
        "/",
        f"{root}/../private/secret-task",
        f"{root}/./hello",
        f"{root}//hello",
        f"{root}/hello/../../private/secret-task",
        "hello",  # relative
        "",
        f"{root}/missing",
        f"{root}/to-private",
        f"{root}/to-private-relative",
        f"{root}/to-nothing",
        f"{root}/to-etc",
        f"{root}/to-etc/shadow",
        f"{root}/loop-a",
        f"{root}/a-file",
        f"{root}/no-toml",
        f"{root}/fifo",
        f"{root}/fifo-toml",
        f"{root}/toml-link-out",
        f"{root}/hello/task.toml",
        f"{root}/hello\0/x",
        f"{root}/\ud800",  # a lone surrogate, which JSON may carry: no file's name
        f"{root}/" + "x" * 5000,
        f"{root}-sibling/hello",  # the root's name as a prefix is not the root
    ]
    said = set()
    for path in paths:
        with pytest.raises(NotATaskUnderRoots) as caught:
            within(lambda path=path: read_task_under(path, roots_of(root)))
        said.add(str(caught.value))
    assert said == {str(NotATaskUnderRoots([root]))}
    (text,) = said
    assert "s3cret" not in text and str(outside) not in text and "private" not in text
    # Control: the task beside them is read.
    assert read_task_under(f"{root}/hello", roots_of(root))["name"] == "hello"


def test_a_root_that_is_a_link_is_where_it_led_at_the_start(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    """An admin may name a root by a link: both spellings name its tasks. The link moved later
    (by whoever can write beside it) moves no root: the server resolved it when it started."""
    link = tmp_path / "current"
    link.symlink_to(layout["root"])
    services = TaskServices(llm=None, tasks=TaskSettings(harbor_roots=[link]))  # type: ignore[arg-type]
    roots = services._roots
    for path in (link / "hello", layout["root"] / "hello"):
        assert read_task_under(str(path), roots)["name"] == "hello"  # control
    link.unlink()
    link.symlink_to(layout["outside"])
    with pytest.raises(NotATaskUnderRoots):
        read_task_under(str(link / "secret-task"), roots)
    assert read_task_under(str(link / "hello"), roots)["name"] == "hello"  # still the old root


def test_a_link_may_not_hop_out_of_the_root_and_back(layout: dict[str, Path]) -> None:
    """A link is followed only while its text stays beneath the root: nothing outside is
    looked at, not even on the way back in."""
    root, outside = layout["root"], layout["outside"]
    (outside / "back").symlink_to(layout["task"])
    (root / "via-outside").symlink_to(outside / "back")
    with pytest.raises(NotATaskUnderRoots):
        read_task_under(f"{root}/via-outside", roots_of(root))


def test_roots_that_would_open_the_host_are_refused(tmp_path: Path) -> None:
    for bad in ("/", "/proc", "/sys/kernel", "/dev"):
        with pytest.raises(SettingsError, match="cannot be a root"):
            load_settings(None, {"harbor_roots": [bad]})
    link = tmp_path / "everything"
    link.symlink_to("/")
    with pytest.raises(SettingsError, match=f"{link} \\(/\\) cannot be a root"):
        load_settings(None, {"harbor_roots": [link]})
    with pytest.raises(SettingsError, match="does not point to a directory"):
        load_settings(None, {"harbor_roots": [tmp_path / "missing"]})
    assert load_settings(None, {"harbor_roots": [tmp_path]}).tasks.harbor_roots == [tmp_path]
    assert load_settings(None, {}).tasks.harbor_roots == []  # none unless named
    [option] = [p for p in serve.params if p.name == "harbor_roots"]  # repeatable, directories
    assert option.multiple and option.type.convert(str(tmp_path), option, None) == tmp_path


def test_a_task_file_s_row_naming_a_path_passes_through_the_client(tmp_path: Path) -> None:
    """``raas submit tasks.jsonl`` sends a path-form row as it is (the server reads it);
    ``--task harbor`` names the task of a row that gives only its path."""
    rows = tmp_path / "tasks.jsonl"
    named = {"data_source": "harbor", "path": "/data/tb2/hello", "reward_key": "pass"}
    rows.write_text(json.dumps(named) + "\n" + json.dumps({"path": "/data/tb2/other"}) + "\n")
    first, second = as_requests(read_tasks(rows, task="harbor"))
    assert first.instance == named
    assert second.instance == {"path": "/data/tb2/other", "data_source": "harbor"}


# -- what a task holds: hostile content beneath a root ------------------------------------------


def refusal(task: Path, root: Path | None = None) -> str:
    with pytest.raises(TaskDirError) as caught:
        within(lambda: read_task_under(str(task), roots_of(root or task.parent)))
    assert not isinstance(caught.value, NotATaskUnderRoots)  # the task was found: its problem
    return str(caught.value)


@pytest.mark.parametrize(
    "target",
    ["/etc/passwd", "/dev/zero", "/proc/self/environ", "../../private/secret.txt", "../../.."],
)
def test_a_link_out_of_the_task_is_refused_unopened(layout: dict[str, Path], target: str) -> None:
    task = layout["task"]
    (task / "tests" / "helper.sh").symlink_to("test.sh")  # control: a link inside is read
    read = read_task_under(str(task), roots_of(layout["root"]))
    assert read["files"]["tests/helper.sh"] == TEST_SH
    (task / "environment" / "leak").symlink_to(target)
    said = refusal(task)
    assert said.endswith("environment/leak links outside the task")
    assert "s3cret" not in said and "root:" not in said


def test_a_link_to_a_directory_or_to_nothing_is_refused(layout: dict[str, Path]) -> None:
    task = layout["task"]
    (task / "environment" / "tests").symlink_to("../tests")
    assert "links to a directory" in refusal(task)
    (task / "environment" / "tests").unlink()
    (task / "environment" / "gone").symlink_to("nothing-here")
    assert "links to nothing in the task" in refusal(task)


def special(kind: str, path: Path) -> None:
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        os.mknod(path, stat.S_IFSOCK | 0o600)
    else:  # /dev/zero's own device: a read of it never ends
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 5))
        except PermissionError:
            pytest.skip("making a device needs CAP_MKNOD")


@pytest.mark.parametrize("kind", ["fifo", "socket", "device"])
def test_a_fifo_socket_or_device_is_refused_without_opening_it(
    layout: dict[str, Path], kind: str
) -> None:
    task = layout["task"]
    read_task_under(str(task), roots_of(layout["root"]))  # control
    special(kind, task / "environment" / "special")
    assert refusal(task).endswith(
        "environment/special is not a regular file (a FIFO, a socket or a device)"
    )
    (task / "environment" / "special").unlink()
    special(kind, task / "special-target")  # through a link inside the task, likewise
    (task / "environment" / "via").symlink_to("../special-target")
    assert "environment/via is not a regular file" in refusal(task)


def test_the_bytes_are_capped_whatever_a_file_says(layout: dict[str, Path]) -> None:
    task = layout["task"]
    blob = task / "environment" / "blob"
    with open(blob, "wb") as f:  # exactly what is left of the cap: read
        f.truncate(MAX_TASK_BYTES - sum(p.stat().st_size for p in task.rglob("*") if p.is_file()))
    read = read_task_under(str(task), roots_of(layout["root"]))
    assert len(read["files"]["environment/blob"]) == blob.stat().st_size  # zeros: UTF-8 text
    with open(blob, "ab") as f:  # one byte more: refused
        f.write(b"\0")
    assert "over 32 MiB or 4096 files" in refusal(task)
    os.truncate(blob, 1 << 40)  # a sparse TiB is refused after the cap, not read whole
    started = time.monotonic()
    assert "over 32 MiB" in refusal(task)
    assert time.monotonic() - started < 10


def test_a_file_growing_while_read_is_read_no_further_than_the_cap(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each read of the file adds more to it than was read (another user appending): the
    reader stops one chunk past what is left of the cap."""
    task = layout["task"]
    growing = task / "environment" / "log"
    growing.write_bytes(b"x" * 1000)
    read_task_under(str(task), roots_of(layout["root"]))  # control: the file as it is
    cap = 4 << 20
    monkeypatch.setattr(task_dirs, "MAX_TASK_BYTES", cap)
    real, seen = task_dirs._read_chunk, []

    def append_while_read(fd: int, n: int) -> bytes:
        data = real(fd, n)
        if os.fstat(fd).st_ino == growing.stat().st_ino:
            seen.append(len(data))
            with open(growing, "ab") as f:
                f.write(b"y" * (2 * task_dirs.CHUNK))
        return data

    monkeypatch.setattr(task_dirs, "_read_chunk", append_while_read)
    assert "over 4 MiB" in refusal(task)
    assert cap < sum(seen) <= cap + task_dirs.CHUNK


def test_too_many_files_too_many_entries_or_too_deep_are_refused(
    layout: dict[str, Path],
) -> None:
    task = layout["task"]
    env = os.open(task / "environment", os.O_RDONLY | os.O_DIRECTORY)
    try:
        for i in range(MAX_TASK_FILES - 3):  # with task.toml, instruction.md and test.sh: all
            os.close(os.open(f"f{i}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=env))
        read = read_task_under(str(task), roots_of(layout["root"]))
        assert len(read["files"]) == MAX_TASK_FILES  # control: at the cap
        os.close(os.open("one-more", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=env))
        assert "4096 files" in refusal(task)
        # A directory of many entries is refused once MAX_ENTRIES are seen, before any is read
        # (were it 100,000, the rest are never listed).
        for i in range(MAX_ENTRIES - MAX_TASK_FILES):
            os.close(os.open(f"e{i}", os.O_CREAT | os.O_WRONLY, 0o644, dir_fd=env))
    finally:
        os.close(env)
    started = time.monotonic()
    assert f"over {MAX_ENTRIES} entries" in refusal(task)
    assert time.monotonic() - started < 10

    deep = make_task(layout["root"] / "deep")
    nested = deep / "environment" / "/".join(["d"] * (MAX_DEPTH - 1))
    nested.mkdir(parents=True)
    (nested / "f").write_text("x")
    assert read_task_under(str(deep), roots_of(layout["root"]))  # control: at the depth cap
    (nested / "d").mkdir()
    (nested / "d" / "f").write_text("x")
    assert f"directories over {MAX_DEPTH} deep" in refusal(deep)


def test_a_hard_link_is_read_only_where_every_user_may_read_it(
    layout: dict[str, Path],
) -> None:
    """Another user who can write beneath a root links a file the server may read and they
    may not (where the kernel lets them: fs.protected_hardlinks off, or as its owner): the
    link is that file, so it is refused unless every user may read it."""
    task, secret = layout["task"], layout["outside"] / "secret.txt"
    os.link(secret, task / "environment" / "secret.txt")
    said = refusal(task)
    assert "environment/secret.txt has other hard links" in said and "s3cret" not in said
    os.chmod(secret, 0o644)  # control: anyone may read it, so the task may carry it
    read = read_task_under(str(task), roots_of(layout["root"]))
    assert read["files"]["environment/secret.txt"] == "s3cret\n"


@pytest.mark.parametrize("swap", ["link", "fifo"])
def test_a_file_swapped_between_its_check_and_its_open_is_refused(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch, swap: str
) -> None:
    """The file is replaced just after its lstat (TOCTOU): by a link to /etc/passwd (O_NOFOLLOW
    refuses to open it) or by a FIFO (opened O_NONBLOCK, its type checked on the descriptor)."""
    task = layout["task"]
    read_task_under(str(task), roots_of(layout["root"]))  # control
    target, real_stat = task / "tests" / "test.sh", os.stat

    def stat_then_swap(name: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        result = real_stat(name, *args, **kwargs)
        if name == "test.sh" and target.is_file() and not target.is_symlink():
            target.unlink()
            target.symlink_to("/etc/passwd") if swap == "link" else os.mkfifo(target)
        return result

    monkeypatch.setattr(os, "stat", stat_then_swap)
    said = refusal(task)
    assert "tests/test.sh" in said and "root:" not in said


def test_a_read_stops_at_its_deadline_and_names_must_be_utf8(layout: dict[str, Path]) -> None:
    task = layout["task"]
    with pytest.raises(TaskDirError, match="not read in time"):
        read_task_under(str(task), roots_of(layout["root"]), deadline=time.monotonic() - 1)
    read_task_under(str(task), roots_of(layout["root"]), deadline=time.monotonic() + 60)
    os.close(os.open(bytes(task / "environment") + b"/\xff", os.O_CREAT | os.O_WRONLY, 0o644))
    assert "a file name is not UTF-8" in refusal(task)


def test_the_client_s_read_shares_the_reader(layout: dict[str, Path]) -> None:
    """``raas run DIR`` and ``raas submit DIR`` read with the same reader: a FIFO refused
    unopened, a link out refused; a link to the task directory itself followed."""
    task = layout["task"]
    link = layout["root"] / "by-link"
    link.symlink_to(task)
    assert read_task_dir(link)["name"] == "hello"  # the caller's own link: followed
    os.mkfifo(task / "environment" / "pipe")
    with pytest.raises(TaskDirError, match="environment/pipe is not a regular file"):
        within(lambda: read_task_dir(task))


# -- at submission: prepared into the inline form the job keeps -----------------------------------


def services_for(*roots: Path, **more: Any) -> TaskServices:
    return TaskServices(llm=None, tasks=TaskSettings(harbor_roots=list(roots)), **more)  # type: ignore[arg-type]


async def prepare(instance: dict[str, Any], submission: Submission) -> dict[str, Any]:
    return await HarborTask().prepare(instance, submission)


async def test_a_path_is_read_into_files_and_kept_beside_them(layout: dict[str, Path]) -> None:
    services = services_for(layout["root"])
    try:
        path = str(layout["task"])
        given = {"data_source": "harbor", "path": path, "reward_key": "pass", "instance_id": "i"}
        prepared = await prepare(given, Submission(services, 1 << 30))
        assert prepared == {**read_task_dir(layout["task"]), **given}
        named = await prepare({**given, "name": "mine"}, Submission(services, 1 << 30))
        assert named["name"] == "mine"
        # The prepared form is what runs (and what a restart validates): no file read again.
        HarborTask().validate(TaskJob("j", prepared, {}))
        inline = {k: v for k, v in prepared.items() if k != "path"}
        assert await prepare(inline, Submission(services, 0)) is inline  # inline: as it is
    finally:
        await services.close()


async def test_a_harness_job_on_a_harbor_task_may_name_it_by_path(
    layout: dict[str, Path],
) -> None:
    services = services_for(layout["root"])
    try:
        given = {"judge": "harbor", "agent": "reference", "path": str(layout["task"])}
        prepared = await HarnessTask().prepare(given, Submission(services, 1 << 30))
        assert prepared == {**read_task_dir(layout["task"]), **given}
        HarnessTask().validate(TaskJob("j", prepared, {}))
        # another judge's instance is left as it is; an unknown judge is validate's to name
        for other in ({"judge": "math", "path": "x"}, {"judge": "nope", "path": "x"}):
            assert await HarnessTask().prepare(other, Submission(services, 0)) is other
    finally:
        await services.close()


async def test_a_path_is_refused_without_roots_and_beside_files(layout: dict[str, Path]) -> None:
    instance = {"data_source": "harbor", "path": str(layout["task"])}
    for services in (services_for(), None):
        with pytest.raises(InvalidInstance) as caught:
            await prepare(instance, Submission(services, 1 << 30))
        assert caught.value.loc == ("instance", "path")
        assert "this server reads no task directories" in caught.value.message
        assert "--harbor-roots" in caught.value.message
    services = services_for(layout["root"])
    try:
        for key in ("files", "binary_files", "executable"):
            with pytest.raises(InvalidInstance) as caught:
                await prepare({**instance, key: {}}, Submission(services, 1 << 30))
            assert caught.value.loc == ("instance", key) and "not both" in caught.value.message
        # A path-form instance that skipped preparing never runs as an empty task.
        with pytest.raises(InvalidInstance) as caught:
            HarborTask().validate(TaskJob("j", instance, {}))
        assert caught.value.loc == ("instance", "path") and "not read" in caught.value.message
    finally:
        await services.close()


async def test_a_task_read_is_checked_as_an_inline_one_under_path(
    layout: dict[str, Path],
) -> None:
    (layout["task"] / "task.toml").write_text(TOML + "[verifier]\ntimeout = 3\n")
    services = services_for(layout["root"])
    try:
        with pytest.raises(InvalidInstance) as caught:
            await prepare(
                {"data_source": "harbor", "path": str(layout["task"])},
                Submission(services, 1 << 30),
            )
    finally:
        await services.close()
    assert caught.value.loc == ("instance", "path")
    assert "files.task.toml" in caught.value.message and "verifier.timeout" in caught.value.message


async def test_a_submission_reads_a_directory_once_and_within_its_bytes(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch of many jobs of one task (GRPO's samples) reads it once; each job keeps its own
    copy, so the copies together may come to no more than the server takes in one body."""
    services = services_for(layout["root"])
    reads = []
    real = services.read_task_dir

    async def counted(path: str) -> dict[str, Any]:
        reads.append(path)
        return await real(path)

    monkeypatch.setattr(services, "read_task_dir", counted)
    instance = {"data_source": "harbor", "path": str(layout["task"])}
    size = sum(len(v) for v in read_task_dir(layout["task"])["files"].values())
    try:
        submission = Submission(services, 3 * size)
        for _ in range(3):
            await prepare(dict(instance), submission)
        assert reads == [str(layout["task"])] and submission.bytes_left == 0
        with pytest.raises(InvalidInstance) as caught:
            await prepare(dict(instance), submission)  # a fourth copy: over
        assert caught.value.loc == ("instance", "path") and "max_body_mb" in caught.value.message
    finally:
        await services.close()


async def test_a_slow_read_is_left_at_its_deadline_off_the_event_loop(
    layout: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read stuck in the kernel (a hung file system) holds one of the readers' threads, not
    the event loop, and the submission is answered at the deadline; a path outside the roots is
    answered at once, as text, even while every reader is busy."""
    release = threading.Event()

    def stuck(path: str, roots: Roots, deadline: float) -> dict[str, Any]:
        release.wait(30)
        return read_task_under(path, roots)

    monkeypatch.setattr(services_module, "TASK_DIR_TIMEOUT_S", 0.3)
    monkeypatch.setattr(services_module, "read_task_under", stuck)
    services = services_for(layout["root"])
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    ticking = asyncio.create_task(tick())
    try:
        reads = [services.read_task_dir(str(layout["task"])) for _ in range(6)]  # > 4 readers
        said = await asyncio.gather(*reads, return_exceptions=True)
        assert all(isinstance(e, TaskDirError) and "not read within" in str(e) for e in said)
        assert ticks > 20  # the loop went on meanwhile
        started = time.monotonic()
        with pytest.raises(NotATaskUnderRoots):
            await services.read_task_dir("/etc/shadow")
        assert time.monotonic() - started < 0.2
        release.set()
        assert (await services.read_task_dir(str(layout["task"])))["name"] == "hello"  # control
    finally:
        release.set()
        ticking.cancel()
        await services.close()


@pytest.fixture
def harbor_registry() -> TaskRegistry:
    registry = TaskRegistry()
    registry.register(HarborTask())
    return registry


async def test_the_job_keeps_what_was_read_whatever_the_directory_becomes(
    layout: dict[str, Path], tmp_path: Path, harbor_registry: TaskRegistry
) -> None:
    """Accepted, the job's record holds the files as read: a resubmission of its job_id is the
    same job while the directory is unchanged, a different one (409) once it changed; a restart
    runs the stored files even with the directory gone. A bad job of a batch refuses it all."""
    db = tmp_path / "paths.db"
    task = str(layout["task"])
    body = {"data_source": "harbor", "path": task}
    services = services_for(layout["root"], sandbox_config=BwrapConfig(image_store=tmp_path / "s"))
    store = ResultStore(db)
    await store.open()
    pipeline = Pipeline(harbor_registry, store, small_config(), services=services)  # not started
    try:
        with pytest.raises(RequestRejected) as caught:
            await pipeline.submit(
                [JobRequest.of(body, job_id="ok"), JobRequest.of({**body, "path": "/etc"})]
            )
        assert caught.value.index == 1 and await store.get("ok") is None
        (view,) = await pipeline.submit([JobRequest.of(body, job_id="h")])
        assert view.created
        again = await pipeline.submit([JobRequest.of(body, job_id="h")])
        assert not again[0].created  # the same job
        (layout["task"] / "instruction.md").write_text("Something else.\n")
        with pytest.raises(JobIdConflict):
            await pipeline.submit([JobRequest.of(body, job_id="h")])
        record = await store.get("h")
        assert record is not None
        stored = record.request["instance"]
        assert stored["path"] == task and stored["name"] == "hello"
        assert stored["files"]["instruction.md"] == "Say hello.\n"
    finally:  # no stop: the server dies with the job queued
        await store.close()
        await services.close()

    # The job, unfinished, comes back after a restart from its record alone: no directory is
    # read again (it is gone, and this server reads none).
    for path in sorted(layout["task"].rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    store = ResultStore(db)
    await store.open()
    services = services_for(sandbox_config=BwrapConfig(image_store=tmp_path / "s"))  # no roots
    pipeline = Pipeline(harbor_registry, store, small_config(), services=services)
    try:
        assert await pipeline.recover() == (1, 0)
        job = pipeline.active("h")
        assert job is not None and job.request.rollout.instance == stored
    finally:
        await pipeline.stop(grace_s=0)
        await store.close()
        await services.close()


# -- the document: a path form only where the server reads task directories ---------------------


def harbor_schema(settings: TaskSettings) -> dict[str, Any]:
    registry = TaskRegistry()
    registry.register(HarborTask())
    document: dict[str, Any] = {
        "components": {
            "schemas": {
                "RolloutRequest": {"type": "object", "properties": {"instance": {}}},
            }
        }
    }
    document_instances(document, registry, settings)
    schemas = document["components"]["schemas"]
    schema = json.loads(
        json.dumps(schemas["Instance.harbor"]).replace("#/components/schemas/", "#/$defs/")
    )
    return {**schema, "$defs": schemas}


def test_the_document_offers_a_path_only_where_the_server_reads_task_directories(
    layout: dict[str, Path], tmp_path: Path
) -> None:
    """The fuzz tier sends what the document admits and counts a 422 to it as a fault: without
    roots the document admits no ``path`` (the 422 it gets is one it was told of); with roots,
    a path beneath them as text, and never beside the files."""
    inline = {
        "data_source": "harbor",
        **{k: v for k, v in read_task_dir(layout["task"]).items() if k != "name"},
    }
    inline["files"] = {
        **inline["files"],
        "task.toml": 'schema_version = "1.1"\n',
        "environment/Dockerfile": "FROM x\n",
    }
    by_path = {"data_source": "harbor", "path": str(layout["task"])}
    rootless = jsonschema.Draft202012Validator(harbor_schema(TaskSettings()))
    assert rootless.is_valid(inline)  # control
    assert not rootless.is_valid(by_path) and not rootless.is_valid({**inline, "path": "/x"})
    link = tmp_path / "current"
    link.symlink_to(layout["root"])
    rooted = jsonschema.Draft202012Validator(harbor_schema(TaskSettings(harbor_roots=[link])))
    assert rooted.is_valid(inline) and rooted.is_valid(by_path)
    assert rooted.is_valid({**by_path, "path": f"{link}/hello/", "name": "x"})
    for bad in ("/etc/shadow", f"{layout['root']}/../private", f"{link}x/hello", "hello"):
        assert not rooted.is_valid({**by_path, "path": bad}), bad
    assert not rooted.is_valid({**inline, "path": str(layout["task"])})
    assert not rooted.is_valid({**by_path, "executable": []})
