"""Protocol clients against real HTTP servers, and the backend pool's routing and failover."""

from __future__ import annotations

import asyncio
import email.utils
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from raas.helpers.retries import retry_after_s
from raas.llm.clients import SGLangClient, VerlClient, VLLMClient, base_url
from raas.llm.pool import BackendPool, PoolConfig
from raas.llm.types import BackendError, LiveCall, NoBackendAvailable, SamplingParams
from tests.support.llm_servers import FakeBackend, ServerThread, scripted

PROMPT = [5, 6, 7]
PARAMS = SamplingParams(temperature=0.7, top_p=0.9, top_k=20, max_tokens=5, seed=11)


@pytest.fixture
def servers() -> Iterator[Any]:
    started: list[ServerThread] = []

    def start(protocol: str = "vllm", **kw: Any) -> tuple[FakeBackend, ServerThread]:
        fake = FakeBackend(protocol, **kw)
        thread = ServerThread(fake.app).start()
        started.append(thread)
        return fake, thread

    yield start
    for thread in started:
        thread.stop()


def test_base_url_accepts_the_forms_trainers_send() -> None:
    assert base_url("http://h:8000/v1") == "http://h:8000"
    assert base_url("h:8000/") == "http://h:8000"


@pytest.mark.parametrize("protocol", ["vllm", "sglang", "verl"])
async def test_each_client_speaks_its_protocol(servers: Any, protocol: str) -> None:
    fake, server = servers(protocol)
    cls = {"vllm": VLLMClient, "sglang": SGLangClient, "verl": VerlClient}[protocol]
    client = cls(server.url + ("/v1" if protocol == "vllm" else ""))
    try:
        gen = await client.generate(PROMPT, PARAMS)
        stopped = await client.generate(PROMPT, SamplingParams(max_tokens=10, stop_token_ids=(2,)))
    finally:
        await client.aclose()
    expected, lps, _ = scripted(PROMPT, 5, [])
    assert gen.token_ids == expected and gen.logprobs == pytest.approx(lps)
    assert gen.finish_reason == "length" and gen.backend == server.url
    assert stopped.token_ids[-1] == 2 and len(stopped.token_ids) == 3
    body = fake.requests[0]
    if protocol == "vllm":
        assert body["prompt"] == PROMPT and body["model"] == "fake-model"
        assert body["return_token_ids"] is True and body["logprobs"] == 0
        assert (body["temperature"], body["top_p"], body["top_k"], body["seed"]) == (
            0.7,
            0.9,
            20,
            11,
        )
        assert stopped.finish_reason == "stop"
    elif protocol == "sglang":
        sp = body["sampling_params"]
        assert body["input_ids"] == PROMPT and body["return_logprob"] is True
        assert (sp["max_new_tokens"], sp["temperature"], sp["top_k"], sp["sampling_seed"]) == (
            5,
            0.7,
            20,
            11,
        )
        assert stopped.finish_reason == "stop"
    else:
        assert body["prompt_ids"] == PROMPT and body["max_tokens"] == 5 and body["seed"] == 11


async def test_the_sglang_client_reads_the_weight_versions_sglang_reports(servers: Any) -> None:
    """SGLang's /generate says which weights generated the tokens in its meta_info: spans where
    an update landed mid-generation, the version alone on an SGLang without spans; a version
    that is no number (SGLang's "default") is none raas can order. vLLM says nothing of it."""
    fake, server = servers("sglang")
    client = SGLangClient(server.url)
    answers: dict[str, Any] = {}
    try:
        fake.weight_version = "default"
        answers["default"] = await client.generate(PROMPT, PARAMS)
        fake.weight_version = "7"
        answers["one"] = await client.generate(PROMPT, PARAMS)
        fake.weight_versions = [
            {"version": "7", "start": 0, "end": 2},
            {"version": "8", "start": 2, "end": 5},
        ]
        fake.weight_version = "8"
        answers["spans"] = await client.generate(PROMPT, PARAMS)
        fake.weight_versions = [{"version": "8", "start": 0, "end": 3}]  # two tokens left out
        with pytest.raises(BackendError, match="do not cover the 5 tokens"):
            await client.generate(PROMPT, PARAMS)
    finally:
        await client.aclose()
    assert answers["default"].policy_versions is None
    assert answers["one"].policy_versions == [7] * 5
    assert answers["spans"].policy_versions == [7, 7, 8, 8, 8]
    _, vllm = servers("vllm")
    plain = VLLMClient(vllm.url, model="fake-model")
    try:
        assert (await plain.generate(PROMPT, PARAMS)).policy_versions is None
    finally:
        await plain.aclose()


async def test_vllm_before_return_token_ids_is_read_from_token_strings(servers: Any) -> None:
    _, server = servers("vllm", old_vllm=True)
    client = VLLMClient(server.url, model="fake-model")
    try:
        gen = await client.generate(PROMPT, PARAMS)
    finally:
        await client.aclose()
    assert gen.token_ids == scripted(PROMPT, 5, [])[0]


async def test_a_bad_request_is_not_retried_elsewhere(servers: Any) -> None:
    fake, server = servers("vllm")
    fake.fail_with = 400
    pool = BackendPool(PoolConfig(backoff_s=0))
    pool.add(server.url)
    with pytest.raises(BackendError) as exc:
        await pool.generate("s", PROMPT, PARAMS)
    assert not exc.value.transient and len(fake.requests) == 1 and not pool.moves
    await pool.stop()


async def test_a_transient_failure_is_retried_on_the_same_backend(servers: Any) -> None:
    fake, server = servers("vllm")
    fake.fail_with, fake.fail_times = 503, 2
    # A backoff no test could wait out: the backend's Retry-After (0) is what is waited.
    pool = BackendPool(PoolConfig(retries=2, backoff_s=3600))
    backend = pool.add(server.url)
    gen = await asyncio.wait_for(pool.generate("s", PROMPT, PARAMS), timeout=60)
    assert gen.token_ids == scripted(PROMPT, PARAMS.max_tokens, [])[0]
    assert (len(fake.requests), backend.failures, backend.healthy) == (3, 2, True)
    assert not pool.moves
    await pool.stop()


VOCAB = 2000  # the scripted ids are 3 to 1002
FORGERIES: dict[str, tuple[Any, str]] = {
    "nan": (
        lambda ids, lps: (ids, [*lps[:1], float("nan"), *lps[2:]]),
        "logprob nan at position 1",
    ),
    "infinity": (lambda ids, lps: (ids, [float("inf"), *lps[1:]]), "logprob inf at position 0"),
    "-infinity": (lambda ids, lps: (ids, [*lps[:-1], -float("inf")]), "logprob -inf at position 4"),
    "over-long": (
        lambda ids, lps: (ids * 4001 + [3], lps * 4001 + [-0.5]),
        "returned 20006 tokens where at most 5 were asked for",
    ),
    "out of vocabulary": (
        lambda ids, lps: ([*ids[:2], 10**9, *ids[3:]], lps),
        f"token id 1000000000 at position 2, outside the vocabulary (the vocabulary has {VOCAB})",
    ),
    "negative id": (lambda ids, lps: ([-1, *ids[1:]], lps), "token id -1 at position 0"),
    "not an integer": (lambda ids, lps: ([ids[0] + 0.5, *ids[1:]], lps), "not an integer"),
    "a logprob short": (lambda ids, lps: (ids, lps[:-1]), "5 token ids but 4 logprobs"),
}


@pytest.mark.parametrize("protocol", ["vllm", "sglang", "verl"])
@pytest.mark.parametrize("forgery", sorted(FORGERIES))
async def test_a_forged_answer_is_a_backend_error_naming_the_backend_and_the_fault(
    servers: Any, protocol: str, forgery: str
) -> None:
    fake, server = servers(protocol)
    fake.forge, problem = FORGERIES[forgery]
    pool = BackendPool(PoolConfig(backoff_s=0), vocab_size=lambda: VOCAB)
    pool.add(server.url, protocol)
    try:
        with pytest.raises(BackendError) as exc:
            await pool.generate("s", PROMPT, PARAMS)
    finally:
        await pool.stop()
    assert str(exc.value).startswith(server.url + ": ") and problem in str(exc.value)
    # Not the connection's fault: neither retried there nor sent elsewhere.
    assert not exc.value.transient and len(fake.requests) == 1 and not pool.moves


async def test_without_a_known_vocabulary_any_non_negative_id_passes(servers: Any) -> None:
    fake, server = servers("vllm")
    fake.forge = lambda ids, lps: ([10**9, *ids[1:]], lps)
    client = VLLMClient(server.url, model="fake-model")
    try:
        gen = await client.generate(PROMPT, PARAMS)
        with pytest.raises(BackendError, match="outside the vocabulary"):
            await client.generate(PROMPT, PARAMS, vocab_size=VOCAB)
    finally:
        await client.aclose()
    assert gen.token_ids[0] == 10**9


def test_retry_after_in_seconds_or_as_a_date() -> None:
    assert retry_after_s({"Retry-After": "7"}) == 7.0
    assert retry_after_s({}, 1.0) == 1.0 and retry_after_s({"Retry-After": "soon"}) is None
    later = email.utils.formatdate(time.time() + 120, usegmt=True)
    assert 100 < (retry_after_s({"retry-after": later}) or 0) <= 120


async def test_least_loaded_assignment_by_capacity_and_stickiness(servers: Any) -> None:
    pool = BackendPool()
    small = pool.add(servers()[1].url, capacity=1)
    other = pool.add(servers()[1].url, capacity=1)
    big = pool.add(servers()[1].url, capacity=2)
    chosen = [pool.backend_for(f"s{i}") for i in range(8)]
    counts = {b.id: sum(c.id == b.id for c in chosen) for b in (small, other, big)}
    assert counts == {small.id: 2, other.id: 2, big.id: 4}
    assert all(pool.backend_for(f"s{i}") is chosen[i] for i in range(8))  # sticky
    gens = [await pool.generate("s0", PROMPT, PARAMS) for _ in range(3)]
    assert {g.backend for g in gens} == {chosen[0].url}
    for i in range(8):
        pool.release(f"s{i}")
    assert small.sessions == other.sessions == big.sessions == 0
    await pool.stop()


async def test_a_new_backend_takes_its_share_without_being_flooded(servers: Any) -> None:
    pool = BackendPool()
    a = pool.add(servers()[1].url, capacity=4)
    for i in range(4):
        pool.backend_for(f"old{i}")
    late = pool.add(servers()[1].url, capacity=4)
    new = [pool.backend_for(f"new{i}").id for i in range(8)]
    # late gets sessions until it is as loaded as a, then they alternate (ties to the older).
    assert new[:4] == [late.id] * 4
    assert sorted(new[4:]) == sorted([a.id, late.id] * 2)
    assert a.sessions == late.sessions == 6
    await pool.stop()


async def test_a_backend_that_dies_mid_rollout_hands_the_session_over(servers: Any) -> None:
    pool = BackendPool(PoolConfig(backoff_s=0, retries=1))
    first, second = servers()[1], servers()[1]
    a, b = pool.add(first.url), pool.add(second.url)
    pinned = pool.backend_for("job")
    turn1 = await pool.generate("job", PROMPT, PARAMS)
    (first if pinned is a else second).stop()  # the pinned server dies between turns
    turn2 = await pool.generate("job", PROMPT + turn1.token_ids, PARAMS)
    survivor = b if pinned is a else a
    assert turn2.backend == survivor.url
    assert turn2.token_ids == scripted(PROMPT + turn1.token_ids, 5, [])[0]
    assert [(m.session, m.from_backend, m.to_backend) for m in pool.moves] == [
        ("job", pinned.url, survivor.url)
    ]
    assert pool.backend_for("job") is survivor and not pinned.healthy
    assert pinned.sessions == 0 and survivor.sessions == 1
    await pool.stop()


async def test_all_backends_down_is_a_clear_failure(servers: Any) -> None:
    pool = BackendPool(PoolConfig(backoff_s=0, retries=0))
    threads = [servers()[1], servers()[1]]
    for t in threads:
        pool.add(t.url)
        t.stop()
    with pytest.raises(NoBackendAvailable) as exc:
        await pool.generate("job", PROMPT, PARAMS)
    assert all(t.url in str(exc.value) for t in threads)
    with pytest.raises(NoBackendAvailable, match="no LLM backend is registered"):
        await BackendPool().generate("x", PROMPT, PARAMS)
    await pool.stop()


async def test_health_checks_take_backends_out_and_back(servers: Any) -> None:
    _, server = servers()
    pool = BackendPool()
    backend = pool.add(server.url)
    await pool.check_health()
    assert backend.healthy
    server.stop()
    await pool.check_health()
    assert backend.healthy  # one missed check is not enough
    await pool.check_health()
    assert not backend.healthy
    with pytest.raises(NoBackendAvailable, match=r"down: health check: unreachable \(.+\)"):
        pool.backend_for("s")
    await pool.stop()


async def test_one_backend_whose_check_raises_leaves_the_others_checked(servers: Any) -> None:
    _, alive = servers()
    _, dead = servers()
    _, broken = servers()
    pool = BackendPool(PoolConfig(misses_to_down=1))
    good, gone, odd = pool.add(alive.url), pool.add(dead.url), pool.add(broken.url)

    async def raises() -> str | None:
        raise httpx.InvalidURL("Invalid non-printable ASCII character in URL")

    odd.client.health = raises  # type: ignore[method-assign]
    dead.stop()
    await pool.check_health()
    assert good.healthy and not gone.healthy and not odd.healthy
    assert odd.last_error is not None and "InvalidURL" in odd.last_error
    assert pool.backend_for("s") is good
    await pool.stop()


@pytest.mark.parametrize("address", ["http://bad\u0001host:1", "http://:8000", "http://h:port"])
def test_the_pool_refuses_a_url_its_client_cannot_use(address: str) -> None:
    pool = BackendPool()
    with pytest.raises(ValueError, match="not a usable URL"):
        pool.add(address)
    assert pool.backends() == []


# -- streamed generations -------------------------------------------------------------------


@pytest.mark.parametrize("old_vllm", [False, True])
async def test_a_streamed_answer_is_the_whole_answer(servers: Any, old_vllm: bool) -> None:
    _, whole_server = servers(old_vllm=old_vllm)
    streamed, stream_server = servers(old_vllm=old_vllm)
    streamed.streams = True
    gens, lives = [], []
    for url in (whole_server.url, stream_server.url):
        client, live = VLLMClient(url), LiveCall(url, time.monotonic())
        try:
            gens.append(await client.generate(PROMPT, PARAMS, live=live))
        finally:
            await client.aclose()
        lives.append(live)
    assert gens[1].token_ids == gens[0].token_ids == scripted(PROMPT, 5, [])[0]
    assert gens[1].logprobs == pytest.approx(gens[0].logprobs)
    assert gens[1].finish_reason == gens[0].finish_reason == "length"
    assert gens[1].cached_tokens == 2  # from the usage chunk the stream asked for
    assert streamed.requests[0]["stream_options"] == {"include_usage": True}
    # Tokens counted as they came where the server streamed; none where it answered whole.
    assert (lives[1].tokens, lives[1].streaming) == (5, True)
    assert (lives[0].tokens, lives[0].streaming) == (0, False)


async def test_the_tokens_of_a_stream_are_counted_while_it_runs(servers: Any) -> None:
    fake, server = servers()
    fake.streams, fake.hold_after = True, 3
    client, live = VLLMClient(server.url), LiveCall(server.url, time.monotonic())
    try:
        call = asyncio.create_task(client.generate(PROMPT, PARAMS, live=live))
        assert await asyncio.to_thread(fake.holding.wait, 30)
        deadline = time.monotonic() + 30  # the three chunks sent reach the client
        while live.tokens < 3 and time.monotonic() < deadline:  # noqa: ASYNC110 - a socket's
            await asyncio.sleep(0.01)
        assert (live.tokens, live.streaming, call.done()) == (3, True, False)
        fake.released.set()
        gen = await asyncio.wait_for(call, 30)
    finally:
        fake.released.set()
        await client.aclose()
    assert len(gen.token_ids) == live.tokens == 5


async def test_a_stream_that_sends_nothing_is_a_stall_and_moves_elsewhere(
    servers: Any,
) -> None:
    stalled, stalled_server = servers()
    stalled.streams, stalled.hold_after = True, 0
    healthy, healthy_server = servers()
    healthy.streams = True
    pool = BackendPool(PoolConfig(retries=0, backoff_s=0.0, stall_timeout_s=0.5))
    pool.add(stalled_server.url, capacity=1)
    # The healthy one under a long stall timeout: a loaded machine may pause its server a moment.
    pool.add(healthy_server.url, capacity=1).client.stall_timeout_s = 60.0
    try:
        client = pool.backends()[0].client
        with pytest.raises(BackendError, match=r"stalled: sent nothing for 0\.5 s") as caught:
            await client.generate(PROMPT, PARAMS)
        assert caught.value.transient and caught.value.backend == stalled_server.url
        gen = await pool.generate("s1", PROMPT, PARAMS)  # pinned to the first, moved on
    finally:
        stalled.released.set()
        await pool.stop()
    assert gen.backend == healthy_server.url and len(gen.token_ids) == 5
    assert [(m.from_backend, m.to_backend) for m in pool.moves] == [
        (stalled_server.url, healthy_server.url)
    ]
    assert pool.live_call("s1") is None  # nothing in flight once answered


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        ({"message": "bad things", "type": "BadRequestError", "code": 400}, False),
        ({"message": "bad things", "type": "InternalServerError", "code": 500}, True),
    ],
)
async def test_an_error_in_a_stream_is_a_backend_error(
    servers: Any, error: dict[str, Any], transient: bool
) -> None:
    fake, server = servers()
    fake.streams, fake.stream_error = True, error
    client = VLLMClient(server.url)
    try:
        with pytest.raises(BackendError, match="error in its stream: bad things") as caught:
            await client.generate(PROMPT, PARAMS)
    finally:
        await client.aclose()
    assert caught.value.transient is transient


async def test_a_stream_cut_before_its_end_is_a_transient_failure(servers: Any) -> None:
    fake, server = servers()
    fake.streams, fake.cut = True, True
    client = VLLMClient(server.url)
    try:
        with pytest.raises(BackendError, match=r"ended before its \[DONE\]") as caught:
            await client.generate(PROMPT, PARAMS)
    finally:
        await client.aclose()
    assert caught.value.transient


async def test_a_pool_call_counts_streamed_tokens_and_a_failed_try_takes_its_back(
    servers: Any,
) -> None:
    fake, server = servers()
    fake.streams, fake.cut = True, True  # five tokens streamed, then no [DONE]: fails
    pool = BackendPool(PoolConfig(retries=1, backoff_s=0.0))
    pool.add(server.url)
    seen: list[int] = []
    try:
        real = pool.backends()[0].client.generate

        async def watched(*args: Any, **kw: Any) -> Any:
            live = kw.get("live") or args[3]
            seen.append(live.tokens)  # what the try starts from
            return await real(*args, **kw)

        pool.backends()[0].client.generate = watched  # type: ignore[method-assign]
        with pytest.raises(NoBackendAvailable):
            await pool.generate("s1", PROMPT, PARAMS)
    finally:
        await pool.stop()
    assert seen == [0, 0]  # the retry starts from nothing: the failed try's five are gone


async def test_a_pool_told_not_to_stream_asks_for_whole_answers(servers: Any) -> None:
    fake, server = servers()
    fake.streams = True  # it would stream if asked
    pool = BackendPool(PoolConfig(stream=False))
    pool.add(server.url)
    try:
        gen = await pool.generate("s1", PROMPT, PARAMS)
    finally:
        await pool.stop()
    assert gen.token_ids == scripted(PROMPT, 5, [])[0]
    assert "stream" not in fake.requests[0] and "stream_options" not in fake.requests[0]


async def test_a_stream_of_more_tokens_than_asked_is_refused_as_it_comes(servers: Any) -> None:
    fake, server = servers()
    fake.streams, fake.extra_tokens = True, 1000
    client, live = VLLMClient(server.url), LiveCall(server.url, time.monotonic())
    try:
        with pytest.raises(BackendError, match="streamed more than max_tokens=5") as caught:
            await client.generate(PROMPT, PARAMS, live=live)
    finally:
        await client.aclose()
    assert not caught.value.transient and live.tokens == 5  # the sixth was never kept


async def test_a_stream_event_with_no_end_is_refused(
    servers: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("raas.llm.clients.MAX_EVENT_BYTES", 8 * 1024)
    fake, server = servers()
    fake.streams, fake.endless_event = True, True
    client = VLLMClient(server.url)
    try:
        with pytest.raises(BackendError, match="a stream event longer than 8192 bytes"):
            await client.generate(PROMPT, PARAMS)
    finally:
        await client.aclose()
