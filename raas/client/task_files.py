"""Task files in, result files out: reading a task file (JSONL or Parquet, raas's rows or
verl's), running it through a server (its results and an interruption told to callbacks) with
its infra failures, writing the results (what ``raas submit`` and ``raas run`` do) and reading
them back (``raas compare``). Nothing here prints: the commands' progress and messages are
raas.cli.progress's."""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from raas.client.rollout_client import RolloutClient
from raas.client.single_server import RaasHTTPError, request_body, with_job_id
from raas.helpers.task_dirs import TaskDirError, named, read_task_dir, task_dirs
from raas.wire import ErrorInfo, RolloutRequest, RolloutResult


class TaskFileError(ValueError):
    pass


class ResultFileError(ValueError):
    """A results file that cannot be read: one line, ``FILE:LINE: what is wrong``."""


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
    """The objects in a task file, each with ``FILE:LINE`` (``FILE:ROW`` in Parquet, from 1);
    a directory is a Harbor task or a dataset of them, each task a ``harbor`` instance with its
    files inline, found at its directory, its name (the directory's) its ``instance_id``, so
    that tables and results say ``create-file``, not a job id."""
    if not path.exists():
        raise TaskFileError(f"no such task file: {path}")
    if path.is_dir():
        try:
            return [(str(task), named(read_task_dir(task))) for task in task_dirs(path)]
        except TaskDirError as e:
            raise TaskFileError(str(e)) from e
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
                        numbered.append((f"{path}:{lineno}", json_line(line)))
                    except json.JSONDecodeError as e:
                        raise TaskFileError(not_json(f"{path}:{lineno}", e)) from e
    else:
        raise TaskFileError(f"{path}: use .jsonl, .parquet or a Harbor task directory")
    if not numbered:
        raise TaskFileError(f"{path} holds no tasks: one JSON object a line (see docs/tasks.md)")
    for where, row in numbered:
        if not isinstance(row, dict):
            raise TaskFileError(f"{where}: expected a JSON object")
    return numbered


def json_line(line: str) -> Any:
    """One line of a JSONL file, decoded without its line break: an error's column is then
    the line's own (an object left open is "at column N" past its text, not column 1 of a next
    line the decoder saw)."""
    return json.loads(line.rstrip("\r\n"))


def not_json(where: str, e: json.JSONDecodeError) -> str:
    """Why a line at ``where`` (FILE:LINE) is not JSON: the decoder's reason and column, not
    its own line number, which counts from the line and so would read as the file's."""
    return f"{where}: not JSON: {e.msg} at column {e.colno}"


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
        body = request_body(task)
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


def write_results(results: Iterable[RolloutResult], out: Path) -> None:
    """One result a line (JSONL), the directory made if need be."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w") as f:
        for r in results:
            f.write(r.model_dump_json() + "\n")


RESULTS_NAME = "results.jsonl"  # a run folder's results file (raas run's default --out)


def read_results(path: Path) -> list[RolloutResult]:
    """The results of a JSONL results file, one a line, as ``raas run --out``, ``raas submit``
    and ``raas export`` write them (an export's rows name their tenant too, which a result does
    not hold); a run's folder reads its ``results.jsonl``. ResultFileError names the file and
    line of what cannot be read."""
    if path.is_dir() and (path / RESULTS_NAME).is_file():
        path = path / RESULTS_NAME
    if not path.is_file():
        raise ResultFileError(f"no such results file: {path}")
    if path.suffix == ".parquet":
        raise ResultFileError(
            f"{path}: a Parquet export; results are read as JSON lines (raas export --out"
            " FILE.jsonl)"
        )
    results = []
    with open(path, "rb") as f:
        for lineno, raw in enumerate(f, 1):
            where = f"{path}:{lineno}"
            try:
                line = raw.decode()
            except UnicodeDecodeError:
                raise ResultFileError(f"{where}: not UTF-8 text (results are JSONL)") from None
            if not line.strip():
                continue
            try:
                row = json_line(line)
            except json.JSONDecodeError as e:
                raise ResultFileError(not_json(where, e)) from None
            try:
                results.append(RolloutResult.model_validate(row))
            except ValidationError as e:
                err = e.errors()[0]
                field = ".".join(str(p) for p in err["loc"]) or "the line"
                raise ResultFileError(
                    f"{where}: {field}: {err['msg']} (not a result as raas run and raas export"
                    " write them)"
                ) from None
    if not results:
        raise ResultFileError(f"{path} holds no results (one JSON result a line)")
    return results


def infra_errors(results: list[RolloutResult]) -> list[ErrorInfo]:
    """Why rollouts ended without a verdict because nothing could run them (kind infra)."""
    return [
        r.error
        for r in results
        if r.state != "done" and r.error is not None and r.error.kind == "infra"
    ]
