"""A weight sync through the pool, against protocol fakes of SGLang and vLLM over real HTTP.

Each fake speaks its server's routes as their source has them: SGLang's ``POST
/pause_generation {"mode": "abort" | "retract" | "in_place"}``, ``POST /continue_generation``,
``POST /update_weights_from_disk {"model_path", "weight_version"}`` and ``meta_info``'s
``weight_versions`` spans; vLLM's ``POST /pause?mode=abort|wait|keep`` and ``POST /resume``
(development routes), its ``finish_reason`` ``abort``, and no word of its weights in a completion.
A fake generates the first ``HELD`` tokens of a request, then holds it where a pause finds it:
a keep (SGLang's retract) lets it go on after the resume under the weights loaded meanwhile, an
abort answers it at once with the tokens it has.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from raas.llm.pool import BackendPool
from raas.llm.types import SamplingParams
from tests.support.llm_servers import ServerThread, scripted

PROMPT = [5, 6, 7]
HELD = 2  # tokens a held request has generated when a pause finds it
WAIT_S = 60.0


class PausingFake:
    """A server of ``protocol`` ("sglang" or "vllm") that pauses as that server does; every
    control call and generation is logged in order in ``log``. ``pause_route=False``: a vLLM
    started without its development routes (``/pause`` is a 404)."""

    def __init__(self, protocol: str, pause_route: bool = True) -> None:
        self.protocol = protocol
        self.version = 0
        self.log: list[str] = []
        self.requests: list[dict[str, Any]] = []
        self.paused: str | None = None
        self.hold_next = True  # the next request is held (the one a test pauses under)
        self.holding = threading.Event()
        self._wake = threading.Event()  # a pause, a resume or a release
        self._released = False
        app = self.app = FastAPI()

        @app.get("/health")
        async def health() -> Any:
            # SGLang's /health generates a token, which a paused server does not do.
            if self.paused and protocol == "sglang":
                return JSONResponse({}, status_code=503)
            return {}

        @app.get("/v1/models")
        async def models() -> dict[str, Any]:
            return {"object": "list", "data": [{"id": "fake", "object": "model"}]}

        if protocol == "sglang":

            @app.post("/pause_generation")
            async def pause_generation(request: Request) -> Any:
                return self._pause((await request.json()).get("mode", "abort"))

            @app.post("/continue_generation")
            async def continue_generation() -> Any:
                return self._resume({"message": "Generation continued successfully."})

            @app.post("/update_weights_from_disk")
            async def update_weights_from_disk(request: Request) -> Any:
                body = await request.json()
                self.version = int(body["weight_version"])
                self.log.append(f"update {body['model_path']} {self.version}")
                return {"success": True, "message": "ok", "num_paused_requests": 0}

            @app.post("/generate")
            async def generate(request: Request) -> Any:
                body = await request.json()
                sp = body["sampling_params"]
                ids, lps, finish, spans = await self._generate(
                    body["input_ids"], sp["max_new_tokens"], body
                )
                meta = {
                    "finish_reason": {"type": finish},
                    "output_token_logprobs": [
                        [lp, t, None] for lp, t in zip(lps, ids, strict=True)
                    ],
                    "cached_tokens": 0,
                    "weight_version": str(self.version),
                    "weight_versions": [
                        {"version": str(v), "start": a, "end": b} for v, a, b in spans
                    ],
                }
                return {"text": "", "output_ids": ids, "meta_info": meta}

        else:
            if pause_route:

                @app.post("/pause")
                async def pause(mode: str = "abort") -> Any:
                    return self._pause(mode)

                @app.post("/resume")
                async def resume() -> Any:
                    return self._resume({"status": "resumed"})

            else:

                @app.post("/pause")
                async def no_pause() -> Any:
                    self.log.append("pause refused")
                    return JSONResponse({"detail": "Not Found"}, status_code=404)

            @app.post("/update_weights")
            async def update_weights(request: Request) -> Any:
                self.version += 1
                self.log.append(f"update {self.version}")
                return {"message": "Weights updated"}

            @app.post("/v1/completions")
            async def completions(request: Request) -> Any:
                body = await request.json()
                ids, lps, finish, _ = await self._generate(body["prompt"], body["max_tokens"], body)
                choice = {
                    "index": 0,
                    "text": "",
                    "token_ids": ids,
                    "logprobs": {"token_logprobs": lps},
                    "finish_reason": finish,
                }
                return {"id": "cmpl-1", "choices": [choice], "usage": {}}

    def _pause(self, mode: str) -> Any:
        self.paused = mode
        self.log.append(f"pause {mode}")
        self._wake.set()
        return {"status": "ok"}

    def _resume(self, answer: dict[str, Any]) -> Any:
        self.paused = None
        self.log.append("resume")
        self._wake.set()
        return answer

    def release(self) -> None:
        """Let a held request finish without a pause."""
        self._released = True
        self._wake.set()

    async def _generate(
        self, prompt: list[int], max_tokens: int, body: dict[str, Any]
    ) -> tuple[list[int], list[float], str, list[tuple[int, int, int]]]:
        self.requests.append(body)
        self.log.append(f"generate {len(prompt)}+{max_tokens}")
        ids, lps, finish = scripted(prompt, max_tokens, [])
        hold, self.hold_next = self.hold_next, False
        if not hold:
            return ids, lps, finish, [(self.version, 0, len(ids))]
        before = self.version
        self.holding.set()
        while True:  # held until a pause or a release says what becomes of it
            await asyncio.to_thread(self._wake.wait, WAIT_S)
            self._wake.clear()
            if self._released or self.paused == "abort":
                break
            if self.paused is None:  # a keep (SGLang: retract) pause has been resumed
                break
        if self.paused == "abort":
            self.log.append(f"aborted after {HELD}")
            return ids[:HELD], lps[:HELD], "abort", [(before, 0, HELD)]
        self.log.append("answered")
        return ids, lps, finish, [(before, 0, HELD), (self.version, HELD, len(ids))]


@pytest.fixture
def fakes() -> Iterator[Any]:
    started: list[ServerThread] = []

    def start(protocol: str, **kw: Any) -> tuple[PausingFake, str]:
        fake = PausingFake(protocol, **kw)
        thread = ServerThread(fake.app).start()
        started.append(thread)
        return fake, thread.url

    yield start
    for thread in started:
        thread.stop()


async def _held(fake: PausingFake) -> None:
    assert await asyncio.to_thread(fake.holding.wait, WAIT_S), "the request never arrived"


async def _update(fake: PausingFake, url: str, version: int) -> None:
    """The trainer's own update call (raas never pushes weights here)."""
    import httpx

    async with httpx.AsyncClient() as http:
        if fake.protocol == "sglang":
            body = {"model_path": "/ckpt/step-1", "weight_version": str(version)}
            response = await http.post(url + "/update_weights_from_disk", json=body)
        else:
            response = await http.post(url + "/update_weights", json={"update_info": {}})
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_pause_keep_update_resume_continues_the_generation_under_the_new_weights(
    fakes: Any, protocol: str
) -> None:
    """keep: the pool pauses the server through its route (SGLang: retract, vLLM: keep), the
    trainer updates, the pool resumes: the server sees pause, update, resume in that order; the
    generation in flight comes back whole, with the versions the server reports (SGLang's spans;
    vLLM says none); a request made while paused reaches the server only after the resume."""
    fake, url = fakes(protocol)
    pool = BackendPool()
    backend = pool.add(url, protocol)
    params = SamplingParams(max_tokens=5)
    try:
        running = asyncio.create_task(pool.generate("job-1", PROMPT, params))
        await _held(fake)
        assert await pool.pause("keep") == {url: "paused"}
        later = asyncio.create_task(pool.generate("job-2", [9, 9], params))
        await _update(fake, url, 1)
        for _ in range(pool.config.misses_to_down):  # a paused server is not taken out
            await pool.check_health()
        assert backend.healthy
        await pool.resume()
        gen, second = await running, await later
    finally:
        await pool.stop()
    mode = "retract" if protocol == "sglang" else "keep"
    update = "update /ckpt/step-1 1" if protocol == "sglang" else "update 1"
    assert fake.log[:4] == ["generate 3+5", f"pause {mode}", update, "resume"]
    # After the resume, the held request's answer and the request made while paused reach the
    # server in either order (two handlers on its loop).
    assert sorted(fake.log[4:]) == ["answered", "generate 2+5"]
    assert gen.token_ids == scripted(PROMPT, 5, [])[0] and gen.finish_reason == "length"
    if protocol == "sglang":
        assert gen.policy_versions == [0, 0, 1, 1, 1]
        assert second.policy_versions == [1] * 5
    else:
        assert gen.policy_versions is None and second.policy_versions is None


@pytest.mark.parametrize("protocol", ["sglang", "vllm"])
async def test_pause_abort_resumes_the_aborted_generation_from_its_prefix(
    fakes: Any, protocol: str
) -> None:
    """abort: the server ends the generation in flight with finish_reason "abort" and the
    tokens it had; the pool holds it through the update and, once resumed, asks for the rest
    with the prompt and those tokens: the caller gets one generation of all its tokens, each
    with the version that generated it."""
    fake, url = fakes(protocol)
    pool = BackendPool()
    pool.add(url, protocol)
    try:
        running = asyncio.create_task(pool.generate("job-1", PROMPT, SamplingParams(max_tokens=5)))
        await _held(fake)
        assert await pool.pause("abort") == {url: "paused"}
        await _update(fake, url, 1)
        assert not running.done()
        await pool.resume()
        gen = await running
    finally:
        await pool.stop()
    first = scripted(PROMPT, 5, [])[0][:HELD]
    rest = scripted(PROMPT + first, 5 - HELD, [])[0]
    assert gen.token_ids == first + rest and len(gen.logprobs) == 5
    assert gen.finish_reason == "length"
    update = "update /ckpt/step-1 1" if protocol == "sglang" else "update 1"
    assert fake.log == [
        "generate 3+5",
        "pause abort",
        f"aborted after {HELD}",
        update,
        "resume",
        f"generate {3 + HELD}+{5 - HELD}",
    ]
    if protocol == "sglang":
        assert gen.policy_versions == [0, 0, 1, 1, 1]
        assert fake.requests[1]["input_ids"] == PROMPT + first
    else:
        assert gen.policy_versions is None
        assert fake.requests[1]["prompt"] == PROMPT + first


async def test_an_agent_turn_aborted_by_a_sync_is_one_turn_of_all_its_tokens(fakes: Any) -> None:
    """Through the agent loop: a turn whose generation SGLang aborted in a sync is recorded as
    one turn, its tokens all there (the aborted part and the rest), each with its version."""
    from raas.agent.loop import AgentLoop, LoopConfig
    from raas.llm.models import load_tokenizer
    from raas.wire import POLICY_VERSIONS, Trajectory

    fake, url = fakes("sglang")
    pool = BackendPool()
    pool.add(url, "sglang")
    config = LoopConfig(max_turns=1, max_tokens=6)
    loop = AgentLoop(pool, load_tokenizer("tiny"), {}, None, config)
    traj = Trajectory()
    try:
        running = asyncio.create_task(loop.run("job-1", [{"role": "user", "content": "hi"}], traj))
        await _held(fake)
        await pool.pause("abort")
        await _update(fake, url, 1)
        await pool.resume()
        await running
    finally:
        await pool.stop()
    (turn,) = traj.turns
    assert turn["output_tokens"] == 6 and turn["finish_reason"] == "length"
    assert turn[POLICY_VERSIONS] == [0] * HELD + [1] * (6 - HELD)
    first = scripted(traj.prompt_ids, 6, [])[0][:HELD]
    assert traj.response_ids == first + scripted(traj.prompt_ids + first, 6 - HELD, [])[0]
    assert traj.loss_mask == [1] * 6 and traj.invariant_error() is None


async def test_a_server_without_a_pause_route_is_drained(fakes: Any) -> None:
    """A vLLM without its development routes answers /pause with a 404: the pool drains it
    instead, so its pause returns only once the request in flight has been answered."""
    fake, url = fakes("vllm", pause_route=False)
    pool = BackendPool()
    pool.add(url, "vllm")
    try:
        running = asyncio.create_task(pool.generate("job-1", PROMPT, SamplingParams(max_tokens=5)))
        await _held(fake)
        pausing = asyncio.create_task(pool.pause("keep"))
        deadline = time.monotonic() + WAIT_S
        while "pause refused" not in fake.log:
            assert time.monotonic() < deadline, "the pool never tried /pause"
            await asyncio.sleep(0.001)
        assert not pausing.done()  # draining: the held request is still in flight
        fake.release()
        assert await pausing == {url: "drained"}
        await pool.resume()  # nothing to resume on the server: only the pool opens
        gen = await running
    finally:
        await pool.stop()
    assert fake.log == ["generate 3+5", "pause refused", "answered"]
    assert gen.token_ids == scripted(PROMPT, 5, [])[0]


@pytest.fixture
def raas_behind(fakes: Any, tmp_path: Any) -> Iterator[Any]:
    """``raas_behind(protocol) -> (fake, fake_url, raas_url)``: a raas server whose pool routes
    to one fake."""
    from raas.api.app import create_app
    from raas.settings import ServeSettings

    started: list[ServerThread] = []

    def start(protocol: str) -> tuple[PausingFake, str, str]:
        fake, url = fakes(protocol)
        settings = ServeSettings(
            db=tmp_path / "raas.db", llm=[url], llm_protocol=protocol, tokenizer="tiny"
        )
        server = ServerThread(create_app(settings)).start()
        started.append(server)
        return fake, url, server.url

    yield start
    for server in started:
        server.stop()


def test_weight_sync_pauses_raas_around_the_load_and_names_sglang_the_step(
    raas_behind: Any, tmp_path: Any
) -> None:
    """TRL's WeightSync with raas_servers: the raas server pauses the SGLang server (retract)
    before the load, which carries the step as SGLang's weight_version, and resumes it after."""
    from types import SimpleNamespace

    from raas.client.integrations.trl import WeightSync
    from raas.llm.models import load_model

    fake, url, raas_url = raas_behind("sglang")
    model, _ = load_model("tiny")
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3), model=model)
    sync = WeightSync([url], tmp_path / "w", protocol="sglang", raas_servers=[raas_url])
    assert sync.push_if_stepped(trainer)
    assert fake.log == ["pause retract", f"update {tmp_path / 'w' / 'step-3'} 3", "resume"]
    assert fake.version == 3


def test_routing_paused_pauses_and_resumes_verls_servers_through_raas(raas_behind: Any) -> None:
    """verl's routing_paused: the raas server pauses verl's vLLM server (keep) for the block,
    the backend stays registered (rollouts in flight are not failed), and resumes it after."""
    import httpx

    from raas.client.integrations.verl_bridge import routing_paused

    fake, url, raas_url = raas_behind("vllm")
    with routing_paused(raas_url, [url], protocol="vllm"):
        fake.log.append("verl updates its weights")
        listed = httpx.get(raas_url + "/v1/backends").json()
    assert [b["url"] for b in listed] == [url]
    assert fake.log == ["pause keep", "verl updates its weights", "resume"]
    assert [b["url"] for b in httpx.get(raas_url + "/v1/backends").json()] == [url]


async def test_a_pause_that_resumes_itself_at_once_resumes_the_server_it_paused(
    fakes: Any,
) -> None:
    """`resume_after_s` as small as a float goes (5e-324: the fuzz tier's random seed found it):
    the pool's own resume ran while the server's pause was still being asked, found nothing
    paused yet, and the server stayed paused for good. The timer starts once the pause is done."""
    fake, url = fakes("vllm")
    pool = BackendPool()
    backend = pool.add(url, "vllm")
    try:
        assert await pool.pause("keep", resume_after_s=5e-324) == {url: "paused"}
        for _ in range(500):  # the auto resume: a task of the pool's, run soon after
            if not pool.paused and not backend.paused:
                break
            await asyncio.sleep(0.01)
        assert not pool.paused and not backend.paused
        assert fake.paused is None and fake.log[-2:] == ["pause keep", "resume"]
    finally:
        await pool.stop()
