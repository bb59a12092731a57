"""The trainer-side client against the real app (ASGI transport)."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import pytest

from raas.api.app import create_app
from raas.client import AsyncRolloutClient, RaasHTTPError, RolloutClient
from raas.client.task_files import TaskFileError, read_requests, run_requests
from raas.settings import ServeSettings
from raas.tasks import TaskRegistry
from raas.wire import RolloutRequest
from tests.support.probe import ProbeTask, probe_instance


class ReleaseOn429(httpx.AsyncBaseTransport):
    """Passes requests to the app; the first 429 it sees releases the job that fills the queue."""

    def __init__(self, inner: httpx.AsyncBaseTransport, probe: ProbeTask, job_id: str) -> None:
        self.inner, self.probe, self.job_id = inner, probe, job_id
        self.refused = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if response.status_code == 429:
            self.refused += 1
            self.probe.release(self.job_id, "init")
        return response


async def test_client_waits_out_a_429_and_loses_nothing(
    tmp_path: Path, registry: TaskRegistry, probe: ProbeTask
) -> None:
    settings = ServeSettings(db=tmp_path / "c.db", init_workers=1, init_queue=1)
    app = create_app(settings, registry)
    async with app.router.lifespan_context(app):
        transport = ReleaseOn429(httpx.ASGITransport(app=app), probe, "blocker")
        async with AsyncRolloutClient("http://localhost", transport=transport) as client:
            first = RolloutRequest(instance=probe_instance(init="block"), job_id="blocker")
            await client.submit(first)
            await probe.wait_entered("blocker", "init")
            await client.submit(RolloutRequest(instance=probe_instance(), job_id="queued"))
            late = await client.submit(RolloutRequest(instance=probe_instance(), job_id="late"))
            assert late.created and transport.refused >= 1
            results = [await client.wait(j, poll_s=10) for j in ("blocker", "queued", "late")]
            with pytest.raises(RaasHTTPError) as exc:
                await client.get("missing")
    assert exc.value.status_code == 404
    assert [r.state for r in results] == ["done", "done", "done"]


async def test_run_requests_returns_results_in_submission_order(
    tmp_path: Path, registry: TaskRegistry
) -> None:
    app = create_app(ServeSettings(db=tmp_path / "r.db"), registry)
    async with app.router.lifespan_context(app):
        transport = httpx.ASGITransport(app=app)
        async with RolloutClient("http://localhost", transport=transport) as client:
            requests = [RolloutRequest(instance=probe_instance(), job_id=f"r{i}") for i in range(7)]
            seen: list[str] = []
            results = await run_requests(
                client, requests, on_result=lambda r: seen.append(r.job_id), batch_size=3
            )
    assert [r.job_id for r in results] == [f"r{i}" for i in range(7)]
    assert sorted(seen) == sorted(r.job_id for r in results)


class HoldsTheBatchAnswer(httpx.AsyncBaseTransport):
    """Lets the app take a batch submission, then never hands its answer back to the client."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.taken = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path.endswith(":batch"):
            self.taken.set()
            await asyncio.Event().wait()  # the answer is still on the wire when Ctrl-C comes
        return response


async def test_a_batch_cut_off_on_the_wire_is_cancelled_on_the_server(
    tmp_path: Path, registry: TaskRegistry
) -> None:
    app = create_app(ServeSettings(db=tmp_path / "w.db"), registry)
    async with app.router.lifespan_context(app):
        transport = HoldsTheBatchAnswer(httpx.ASGITransport(app=app))
        async with RolloutClient("http://localhost", transport=transport) as client:
            requests = [
                RolloutRequest(instance=probe_instance(init="block"), job_id=f"w{i}")
                for i in range(2)
            ]
            told: list[int] = []
            run = asyncio.create_task(run_requests(client, requests, on_interrupt=told.append))
            await asyncio.wait_for(transport.taken.wait(), 30)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run
        async with AsyncRolloutClient(
            "http://localhost", transport=httpx.ASGITransport(app=app)
        ) as c:
            states = [(await c.get(f"w{i}")).state for i in range(2)]
    assert told == [2]
    assert states == ["cancelled", "cancelled"]


def test_read_requests_merges_sampling_params(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"data_source": "probe"}\n\n'
        '{"instance": {"data_source": "probe"}, "sampling_params": {"seed": 3}}\n'
    )
    a, b = read_requests(f, {"seed": 1, "temperature": 0.5}, timeout_s=9)
    assert a.sampling_params == {"seed": 1, "temperature": 0.5} and a.timeout_s == 9
    assert b.sampling_params == {"seed": 3, "temperature": 0.5}
    f.write_text("[1, 2]\n")
    with pytest.raises(TaskFileError, match=r"t\.jsonl:1: expected a JSON object"):
        read_requests(f)


def test_a_bare_task_line_s_request_keys_are_its_request_s(tmp_path: Path) -> None:
    # `"timeout_s": 1` on a plain line was a field of the instance, which no task reads: the job
    # ran its whole default budget, unsaid.
    f = tmp_path / "t.jsonl"
    f.write_text(
        '{"data_source": "probe", "timeout_s": 1, "sampling_params": {"seed": 3}, "job_id": "a"}\n'
        '{"instance": {"data_source": "probe"}, "timeout_s": 1, "job_id": "b"}\n'  # the control
    )
    bare, full = read_requests(f, {"temperature": 0.5}, timeout_s=9)
    assert bare.instance == full.instance == {"data_source": "probe"}
    assert (bare.timeout_s, bare.job_id) == (1, "a") and (full.timeout_s, full.job_id) == (1, "b")
    assert bare.sampling_params == {"seed": 3, "temperature": 0.5}
    f.write_text('{"data_source": "probe", "timeout_s": "soon"}\n')  # still checked, by name
    with pytest.raises(TaskFileError, match=r"t\.jsonl:1: timeout_s: "):
        read_requests(f)


def test_a_task_file_with_no_task_or_a_broken_line_is_refused_by_name(tmp_path: Path) -> None:
    f = tmp_path / "t.jsonl"
    for empty in ("", "\n\n  \n"):
        f.write_text(empty)
        with pytest.raises(TaskFileError, match=r"t\.jsonl holds no tasks"):
            read_requests(f)
    # A broken line is named by its line in the file, with its column, and no other line.
    f.write_text('{"data_source": "probe"}\n{"data_source": probe}\n')
    with pytest.raises(TaskFileError) as broken:
        read_requests(f)
    assert re.fullmatch(r".*t\.jsonl:2: not JSON: Expecting value at column 17", str(broken.value))
    # An object left open is past its text's end, not at column 1 of a line after it.
    f.write_text('{"data_source": "probe"}\n{"data_source": "probe"\n')
    with pytest.raises(TaskFileError) as open_object:
        read_requests(f)
    assert str(open_object.value).endswith(
        "t.jsonl:2: not JSON: Expecting ',' delimiter at column 24"
    )
    f.write_text('{"data_source": "probe"}\n')  # the control: one task
    assert [r.instance["data_source"] for r in read_requests(f)] == ["probe"]


def test_a_submission_is_a_request_its_dict_or_a_bare_instance() -> None:
    from raas.client.single_server import as_request

    instance = {"data_source": "math", "problem": "1 + 1?", "answer": "2"}
    bare = as_request(instance)
    assert bare.instance == instance and bare.job_id is None
    full = as_request({"instance": instance, "job_id": "j1", "sampling_params": {"seed": 1}})
    assert (full.job_id, full.sampling_params) == ("j1", {"seed": 1})
    assert as_request(full) is full
    with pytest.raises(ValueError, match="instance"):
        as_request({"job_id": "j2"})  # neither an instance nor a request


def test_a_422_reads_as_the_field_and_why() -> None:
    from raas.client.single_server import RaasHTTPError

    detail = [
        {"loc": ["body", "jobs", 0, "instance", "data_source"], "msg": "no task handler"},
        {"loc": ["body", "jobs", 1, "instance"], "msg": "missing"},
    ]
    assert str(RaasHTTPError(422, detail)) == (
        "raas answered 422: jobs.0.instance.data_source: no task handler (and 1 more)"
    )
    assert str(RaasHTTPError(409, "job_id 'a' was already submitted")) == (
        "raas answered 409: job_id 'a' was already submitted"
    )


async def test_an_empty_or_blank_api_key_sends_no_authorization_header(tmp_path: Path) -> None:
    """No key is no header: ``Bearer `` is a value HTTP refuses (``Illegal header value``), so
    an empty key made every request fail; a blank one did still. The control: a key is sent."""
    from raas.client.auth import auth_headers

    seen: list[str | None] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.headers.get("authorization"))
        return httpx.Response(404, json={"detail": "no such job"})

    for key in (None, "", "  ", "sesame"):
        transport = httpx.MockTransport(answer)
        async with AsyncRolloutClient("http://x", api_key=key, transport=transport) as client:
            with pytest.raises(RaasHTTPError):
                await client.get("j")
    assert seen == [None, None, None, "Bearer sesame"]
    assert [auth_headers(k) for k in ("", " \t", "k")] == [{}, {}, {"Authorization": "Bearer k"}]
