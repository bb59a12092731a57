"""Task files in, result files out: reading a task file (JSONL or Parquet, raas's rows or
verl's), running it through a server with its progress and its infra failures, writing the
results (what ``raas submit`` and ``raas run`` do)."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import itertools
import json
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from raas.client.rollout_client import RolloutClient
from raas.client.single_server import RaasHTTPError, with_job_id
from raas.helpers.terminal import plain
from raas.wire import ErrorInfo, RolloutRequest, RolloutResult


class TaskFileError(ValueError):
    pass


def read_requests(
    path: Path, sampling_params: dict[str, Any] | None = None, timeout_s: float | None = None
) -> list[RolloutRequest]:
    """Every task in a task file as a request (what ``raas submit`` and ``raas run`` send)."""
    return as_requests(read_tasks(path), sampling_params, timeout_s)


def read_tasks(path: Path, task: str | None = None) -> list[tuple[str, dict[str, Any]]]:
    """Every task in a .jsonl (.jsonl.gz, .json) or .parquet file, with where it was
    (``FILE:LINE``): full requests (with ``instance``), raas's own instances, or verl's rows.
    ``task``: the ``data_source`` of rows that name none (SWE-Gym's and SWE-bench's own rows)."""
    return [(where, task_instance(row, where, task)) for where, row in read_rows(path)]


def read_rows(path: Path) -> list[tuple[str, dict[str, Any]]]:
    """The objects in a task file, each with ``FILE:LINE`` (``FILE:ROW`` in Parquet, from 1)."""
    if not path.exists():
        raise TaskFileError(f"no such task file: {path}")
    if path.suffix == ".parquet":
        try:
            import pyarrow.parquet as pq
        except ImportError as e:
            raise TaskFileError("reading Parquet needs pyarrow: pip install 'raas[parquet]'") from e
        try:
            rows: list[Any] = pq.read_table(path).to_pylist()
        except (OSError, ValueError) as e:  # pyarrow's ArrowInvalid is a ValueError
            raise TaskFileError(f"{path}: not a Parquet file pyarrow can read: {e}") from e
        numbered = [(f"{path}:{i}", row) for i, row in enumerate(rows, 1)]
    elif path.suffix in {".jsonl", ".json"} or path.name.endswith(".jsonl.gz"):
        opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
        numbered = []
        with opener(path, "rt") as f:
            for lineno, line in enumerate(f, 1):
                if line.strip():
                    try:
                        numbered.append((f"{path}:{lineno}", json.loads(line)))
                    except json.JSONDecodeError as e:
                        raise TaskFileError(f"{path}:{lineno}: not JSON: {e}") from e
    else:
        raise TaskFileError(f"{path}: use .jsonl or .parquet")
    for where, row in numbered:
        if not isinstance(row, dict):
            raise TaskFileError(f"{where}: expected a JSON object")
    return numbered


def task_instance(row: dict[str, Any], where: str, task: str | None = None) -> dict[str, Any]:
    """The task instance (or full request) a row of a task file stands for: the row itself,
    as ``POST /v1/rollouts`` would take it, so that a row runs the same through every command.

    verl's RL rows (``data_source``, ``prompt`` as chat messages, ``ability``, ``reward_model``
    with ``ground_truth``, ``extra_info``) keep every field where verl put it (the tasks read
    ``reward_model.ground_truth``; ``data_source`` such as ``openai/gsm8k`` runs as the task the
    alias table of ``raas.tasks.sources`` names). Only what the row leaves out is filled in: its
    id, ``DATA_SOURCE-INDEX`` when ``extra_info`` has an ``index``; and ``math`` as the
    data_source of a row with an empty one and ``ability`` math (DeepScaleR's rows); ``task``
    as the data_source of any other row without one.
    """
    if "instance" in row and isinstance(row["instance"], dict):  # a full request
        return row
    row = {k: v.tolist() if hasattr(v, "tolist") else v for k, v in row.items()}  # numpy
    if "reward_model" in row:
        reward_model = row.get("reward_model")
        if not isinstance(reward_model, dict) or "ground_truth" not in reward_model:
            raise TaskFileError(f"{where}: reward_model has no ground_truth")
        if not row.get("data_source") and str(row.get("ability", "")).lower() == "math":
            row["data_source"] = "math"
        extra = row.get("extra_info")
        index = extra.get("index") if isinstance(extra, dict) else None
        if index is not None and row.get("data_source") and row.get("instance_id") is None:
            row["instance_id"] = f"{row['data_source']}-{index}"
    if not row.get("data_source") and task:
        row = {**row, "data_source": task}
    if not row.get("data_source"):
        raise TaskFileError(
            f"{where}: no data_source (which task scores this row? --task NAME names it for"
            " rows without one, e.g. --task swe for SWE-Gym's)"
        )
    return row


def as_requests(
    tasks: Iterable[tuple[str, dict[str, Any]]],
    sampling_params: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> list[RolloutRequest]:
    """Requests for ``(where, instance or full request)`` pairs: ``sampling_params`` merged
    under each task's own, ``timeout_s`` where a task sets none; a task the wire refuses is
    a TaskFileError naming where it was and the field."""
    requests = []
    for where, task in tasks:
        body = task if "instance" in task else {"instance": task}
        if sampling_params:
            body = {
                **body,
                "sampling_params": {**sampling_params, **(body.get("sampling_params") or {})},
            }
        if timeout_s is not None and body.get("timeout_s") is None:
            body = {**body, "timeout_s": timeout_s}
        try:
            requests.append(RolloutRequest.model_validate(body))
        except ValidationError as e:
            err = e.errors()[0]
            field = ".".join(str(p) for p in err["loc"])
            raise TaskFileError(f"{where}: {field}: {err['msg']}") from e
    return requests


async def run_requests(
    client: RolloutClient,
    requests: Iterable[RolloutRequest],
    on_result: Callable[[RolloutResult], None] | None = None,
    batch_size: int = 256,
    on_interrupt: Callable[[int], None] | None = None,
    cancel_timeout_s: float = 30.0,
    names: Sequence[str] | None = None,
) -> list[RolloutResult]:
    """Submit in batches and collect results as they finish; returned in submission order.

    Collecting starts with the first batch, so a file larger than the server's queue streams
    through it (the client retries 429s) instead of waiting for every submission first. If
    this is cancelled (Ctrl-C), the jobs it submitted that have not finished are cancelled on
    the server too (``on_interrupt`` is told how many first), within ``cancel_timeout_s``.
    A 422 names a refused job by its entry in ``names`` (``FILE:LINE``), when given.
    """
    submitted: list[str] = []

    async def collect(job_id: str) -> RolloutResult:
        result = await client.wait(job_id)
        if on_result is not None:
            on_result(result)
        return result

    collectors: list[asyncio.Task[RolloutResult]] = []
    pending = list(requests)
    try:
        for start in range(0, len(pending), batch_size):
            batch = [with_job_id(r) for r in pending[start : start + batch_size]]
            # Counted as submitted before the answer: a Ctrl-C while the batch is on the wire
            # may leave it running on the server, so it is cancelled with the rest.
            submitted.extend(str(r.job_id) for r in batch)
            try:
                ids = await client.submit_batch(batch)
            except RaasHTTPError as e:
                raise located(e, names[start:]) if names else e from None
            collectors.extend(asyncio.create_task(collect(job_id)) for job_id in ids)
        return list(await asyncio.gather(*collectors))
    except asyncio.CancelledError:
        # Cancelling the gather cancelled the collectors: a job is unfinished unless its
        # collector came back with the result.
        unfinished = [
            j
            for j, c in itertools.zip_longest(submitted, collectors)
            if c is None or c.cancelled() or not c.done()
        ]
        if unfinished:
            if on_interrupt is not None:
                on_interrupt(len(unfinished))
            await client.cancel_all(unfinished, cancel_timeout_s)
        raise
    finally:
        for task in collectors:
            task.cancel()


def located(error: RaasHTTPError, names: Sequence[str]) -> RaasHTTPError:
    """A 422 on a batch with its first refused job named by ``names`` (where it came from,
    ``FILE:LINE``) instead of its place in the batch (``jobs.0``, counted from 0)."""
    detail = error.detail
    if error.status_code != 422 or not isinstance(detail, list) or not detail:
        return error
    first = detail[0] if isinstance(detail[0], dict) else {}
    loc = list(first.get("loc", []))
    if loc[:2] != ["body", "jobs"] or len(loc) < 3 or not isinstance(loc[2], int):
        return error
    if not 0 <= loc[2] < len(names):
        return error
    field = ".".join(str(x) for x in loc[3:])
    more = f" (and {len(detail) - 1} more)" if len(detail) > 1 else ""
    text = f"{names[loc[2]]}: {field}: {first.get('msg', '')}{more}"
    return RaasHTTPError(error.status_code, text, error.server)


def keeping(
    finished: list[RolloutResult], then: Callable[[RolloutResult], None]
) -> Callable[[RolloutResult], None]:
    """An ``on_result`` that appends each result to ``finished`` (what a Ctrl-C still has to
    write) before calling ``then``."""

    def arrived(result: RolloutResult) -> None:
        finished.append(result)
        then(result)

    return arrived


def say_cancelling(n: int) -> None:
    """What ``raas run`` / ``raas submit`` print on Ctrl-C before cancelling their jobs."""
    print(f"interrupted: cancelling this run's {n} unfinished jobs on the server", flush=True)


def write_results(results: Iterable[RolloutResult], out: Path) -> None:
    """One result a line (JSONL), the directory made if need be."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for r in results:
            f.write(r.model_dump_json() + "\n")


def infra_errors(results: list[RolloutResult]) -> list[ErrorInfo]:
    """Why rollouts ended without a verdict because nothing could run them (kind infra)."""
    return [
        r.error
        for r in results
        if r.state != "done" and r.error is not None and r.error.kind == "infra"
    ]


def markup(value: object) -> str:
    """Text from a job or a server inside rich markup: control characters shown as escapes
    (``plain``) and square brackets escaped, so ``[red]`` is shown, not applied."""
    from rich.markup import escape

    return escape(plain(value))


class Counting:
    """Progress over N jobs: a live bar on a terminal; elsewhere (a log, CI, a pipe) a line every
    ``every_s`` seconds and at the end, so a long CPU run is never silent."""

    def __init__(self, console: Any, total: int, label: str, every_s: float = 15.0) -> None:
        from rich.progress import Progress

        self.console, self.total, self.label, self.every_s = console, total, label, every_s
        self.done = 0
        self.failed = 0
        self._started = self._said = time.monotonic()
        self._bar = Progress(console=console) if console.is_terminal else None
        self._task = (
            self._bar.add_task(markup(label), total=total) if self._bar is not None else None
        )
        self._ticker: asyncio.Task[None] | None = None  # off a terminal: a line every every_s

    def __enter__(self) -> Counting:
        if self._bar is not None:
            self._bar.__enter__()
            return self
        self.console.print(
            f"{markup(self.label)}: {self.total} job{'' if self.total == 1 else 's'}"
        )
        with contextlib.suppress(RuntimeError):  # no running loop: lines come with results
            self._ticker = asyncio.get_running_loop().create_task(self._tick())
        return self

    def __exit__(self, kind: type[BaseException] | None, *exc: object) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
        elif self.done < self.total and (kind is None or not issubclass(kind, Exception)):
            self._say()  # where a run stopped; an error says so itself, in its one line

    async def _tick(self) -> None:
        while True:  # a line even when nothing finishes for a long while
            await asyncio.sleep(self.every_s)
            if time.monotonic() - self._said >= self.every_s:
                self._say()

    def advance(self, result: Any = None) -> None:
        self.done += 1
        if result is not None and getattr(result, "state", "done") != "done":
            self.failed += 1
        if self._bar is not None and self._task is not None:
            self._bar.advance(self._task)
        elif time.monotonic() - self._said >= self.every_s or self.done == self.total:
            self._say()

    def _say(self) -> None:
        self._said = time.monotonic()
        self.console.print(
            f"{markup(self.label)}: {self.done}/{self.total} finished ({self.failed} not done),"
            f" {self._said - self._started:.0f} s"
        )
