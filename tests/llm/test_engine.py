"""The embedded CPU engine on the tiny random model: vLLM's protocol over real HTTP, logprobs that
match a teacher-forced forward pass, batching, the prefix cache, weight updates, validation,
aborting the generations of clients that left, and a prompt exit on SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
from safetensors.torch import save_file

from raas.launch import EngineProcess
from raas.llm.clients import VLLMClient
from raas.llm.engine import Engine, GenerationParams, engine_app
from raas.llm.engine.generator import EngineStopped
from raas.llm.engine.prefix_cache import PrefixCache, common_prefix_len
from raas.llm.models import load_model
from raas.llm.types import SamplingParams
from raas.wire import POLICY_VERSION, POLICY_VERSIONS, Trajectory, policy_version_fields
from tests.support.llm_servers import ServerThread

Tiny = tuple[Any, Any]
KEY = "engine-test-key"
ADMIN = {"Authorization": f"Bearer {KEY}"}


@pytest.fixture(scope="module")
def tiny() -> Tiny:
    return load_model("tiny")


@pytest.fixture
def serve(tiny: Tiny) -> Iterator[Any]:
    """``serve(model=None, api_key=None, weight_dirs=None, **engine_kwargs) -> (url, engine)``:
    an engine app on a real port."""
    started: list[ServerThread] = []

    def start(
        model: Any = None,
        api_key: str | None = None,
        weight_dirs: list[Path] | None = None,
        **kwargs: Any,
    ) -> tuple[str, Engine]:
        engine = Engine(model if model is not None else tiny[0], tiny[1], **kwargs)
        app = engine_app(engine, "tiny", api_key=api_key, weight_dirs=weight_dirs)
        server = ServerThread(app).start()
        started.append(server)
        return server.url, engine

    yield start
    for server in started:
        server.stop()


def prompt_of(length: int, salt: int = 0) -> list[int]:
    g = torch.Generator().manual_seed(1000 + 17 * length + salt)
    return torch.randint(3, 49152, (length,), generator=g).tolist()


def teacher_forced(model: Any, prompt: list[int], tokens: list[int]) -> list[float]:
    """Each generated token's logprob from one forward pass over prompt + tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].float()
    logprobs = torch.log_softmax(logits, dim=-1)
    return [float(logprobs[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def tokens_of(data: dict[str, Any]) -> list[int]:
    tokens: list[int] = data["choices"][0]["token_ids"]
    return tokens


async def complete(http: httpx.AsyncClient, url: str, prompt: Any, **body: Any) -> dict[str, Any]:
    payload = {"prompt": prompt, "return_token_ids": True, "logprobs": 0, **body}
    response = await http.post(url + "/v1/completions", json=payload, timeout=60)
    assert response.status_code == 200, response.text
    data: dict[str, Any] = response.json()
    return data


async def test_logprobs_match_a_teacher_forced_forward_pass(serve: Any, tiny: Tiny) -> None:
    url, _ = serve()
    prompt = prompt_of(11)
    async with httpx.AsyncClient() as http:
        greedy = await complete(http, url, prompt, max_tokens=24, temperature=0)
        sampled = await complete(http, url, prompt, max_tokens=24, temperature=0.8, seed=5)
    for data in (greedy, sampled):
        choice = data["choices"][0]
        tokens = choice["token_ids"]
        assert len(tokens) == 24 and choice["prompt_token_ids"] == prompt
        assert choice["logprobs"]["token_logprobs"] == pytest.approx(
            teacher_forced(tiny[0], prompt, tokens), abs=1e-3
        )
    assert greedy["choices"][0]["token_ids"] != sampled["choices"][0]["token_ids"]


async def test_concurrent_requests_are_batched_and_each_equals_its_solo_run(
    serve: Any, tiny: Tiny
) -> None:
    url, engine = serve(prefix_cache_tokens=0)
    prompts = [prompt_of(n) for n in (3, 17, 5, 40, 9, 1, 26, 12)]
    async with httpx.AsyncClient() as http:
        solo = [await complete(http, url, p, max_tokens=16, temperature=0) for p in prompts]
        steps_before = engine.stats.decode_steps
        together = await asyncio.gather(
            *[complete(http, url, p, max_tokens=16, temperature=0) for p in prompts]
        )
        sampled = await asyncio.gather(
            *[
                complete(http, url, p, max_tokens=8, temperature=0.8, seed=i)
                for i, p in enumerate(prompts)
            ]
        )
    # Batched: far fewer decode steps than 8 requests x 15 steps one after another.
    assert engine.stats.decode_steps - steps_before < 4 * 15
    for prompt, one, batched, drawn in zip(prompts, solo, together, sampled, strict=True):
        a, b = one["choices"][0], batched["choices"][0]
        assert b["token_ids"] == a["token_ids"]
        assert b["logprobs"]["token_logprobs"] == pytest.approx(
            a["logprobs"]["token_logprobs"], abs=1e-3
        )
        tokens = drawn["choices"][0]["token_ids"]
        assert drawn["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(
            teacher_forced(tiny[0], prompt, tokens), abs=1e-3
        )


async def test_the_response_has_vllms_shape(serve: Any) -> None:
    url, _ = serve()
    prompt = prompt_of(6)
    async with httpx.AsyncClient() as http:
        data = await complete(
            http, url, prompt, max_tokens=5, temperature=0, return_tokens_as_token_ids=True
        )
        plain = (
            await http.post(url + "/v1/completions", json={"prompt": prompt, "max_tokens": 3})
        ).json()
        top = await complete(http, url, prompt, max_tokens=3, temperature=0, logprobs=2)
        text = await complete(http, url, "Hello, world", max_tokens=2, temperature=0)
    assert data["id"].startswith("cmpl-") and data["object"] == "text_completion"
    assert data["model"] == "tiny" and isinstance(data["created"], int)
    choice = data["choices"][0]
    assert choice["index"] == 0 and choice["finish_reason"] == "length"
    assert choice["stop_reason"] is None and isinstance(choice["text"], str)
    logprobs = choice["logprobs"]
    assert logprobs["tokens"] == [f"token_id:{t}" for t in choice["token_ids"]]
    assert logprobs["top_logprobs"] is None and len(logprobs["text_offset"]) == 5
    assert logprobs["text_offset"][1] == len(logprobs["tokens"][0])
    assert data["usage"] == {
        "prompt_tokens": 6,
        "completion_tokens": 5,
        "total_tokens": 11,
        "prompt_tokens_details": {"cached_tokens": 0},
    }
    assert plain["choices"][0]["token_ids"] is None and plain["choices"][0]["logprobs"] is None
    # raas's own fields (vLLM has none): the weights every token was sampled under, as spans.
    assert data["weight_version"] == 0
    assert data["weight_versions"] == [{"version": 0, "start": 0, "end": 5}]
    assert plain["choices"][0]["prompt_token_ids"] is None
    first = top["choices"][0]["logprobs"]
    assert all(len(alternatives) >= 2 for alternatives in first["top_logprobs"])
    best = max(first["top_logprobs"][0].values())
    assert first["token_logprobs"][0] == pytest.approx(best)  # greedy took the top token
    assert text["usage"]["prompt_tokens"] > 0 and len(text["choices"][0]["token_ids"]) == 2


async def test_the_same_seed_gives_the_same_tokens(serve: Any) -> None:
    url, _ = serve()
    prompt = prompt_of(8)
    async with httpx.AsyncClient() as http:
        runs = [
            tokens_of(await complete(http, url, prompt, max_tokens=12, temperature=1.0, seed=s))
            for s in (3, 3, 4)
        ]
        top = [
            tokens_of(
                await complete(
                    http, url, prompt, max_tokens=12, temperature=0.7, top_p=0.9, top_k=50, seed=9
                )
            )
            for _ in range(2)
        ]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert top[0] == top[1]


async def test_stop_tokens_eos_and_length(serve: Any) -> None:
    url, engine = serve()
    prompt = prompt_of(10)
    async with httpx.AsyncClient() as http:
        full = (await complete(http, url, prompt, max_tokens=10, temperature=0))["choices"][0]
        tokens = full["token_ids"]
        assert full["finish_reason"] == "length" and full["stop_reason"] is None
        assert len(tokens) == 10 and len(full["logprobs"]["token_logprobs"]) == 10
        stop = tokens[4]
        cut = tokens.index(stop) + 1
        stopped = (
            await complete(http, url, prompt, max_tokens=10, temperature=0, stop_token_ids=[stop])
        )["choices"][0]
        assert stopped["token_ids"] == tokens[:cut]  # the stop token is included
        assert len(stopped["logprobs"]["token_logprobs"]) == cut
        assert stopped["finish_reason"] == "stop" and stopped["stop_reason"] == stop
        with_stop = (
            await complete(
                http,
                url,
                prompt,
                max_tokens=10,
                temperature=0,
                stop_token_ids=[stop],
                include_stop_str_in_output=True,
            )
        )["choices"][0]
        assert len(with_stop["text"]) > len(stopped["text"])

        engine.eos_token_ids = frozenset({stop})  # pretend the model's EOS is that token
        eos = (await complete(http, url, prompt, max_tokens=10, temperature=0))["choices"][0]
        assert eos["token_ids"] == tokens[:cut] and eos["token_ids"][-1] == stop
        assert eos["finish_reason"] == "stop" and eos["stop_reason"] is None
        ignored = (
            await complete(http, url, prompt, max_tokens=10, temperature=0, ignore_eos=True)
        )["choices"][0]
        assert ignored["token_ids"] == tokens and ignored["finish_reason"] == "length"
        one = (await complete(http, url, prompt, max_tokens=1, temperature=0))["choices"][0]
        assert one["token_ids"] == tokens[:1]


async def test_the_prefix_cache_serves_the_next_turn_with_the_same_tokens(serve: Any) -> None:
    url, engine = serve()
    fresh_url, fresh = serve(prefix_cache_tokens=0)
    prompt = prompt_of(30)
    async with httpx.AsyncClient() as http:
        first = await complete(http, url, prompt, max_tokens=12, temperature=0)
        assert first["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
        output = first["choices"][0]["token_ids"]
        turn2 = prompt + output + prompt_of(7, salt=1)  # the observation of the next turn
        cached = await complete(http, url, turn2, max_tokens=12, temperature=0)
        uncached = await complete(http, fresh_url, turn2, max_tokens=12, temperature=0)
    # Everything but the last generated token (whose keys were never computed) is reused.
    assert cached["usage"]["prompt_tokens_details"]["cached_tokens"] == len(prompt) + 11
    assert uncached["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    a, b = cached["choices"][0], uncached["choices"][0]
    assert a["token_ids"] == b["token_ids"]
    assert a["logprobs"]["token_logprobs"] == pytest.approx(
        b["logprobs"]["token_logprobs"], abs=1e-4
    )
    stats = engine.snapshot()
    assert stats["prefix_cache_hits"] == 1 and stats["cached_tokens"] == len(prompt) + 11
    assert fresh.snapshot()["prefix_cache_hits"] == 0


def test_prefix_cache_bookkeeping() -> None:
    assert common_prefix_len((1, 2, 3, 4), (1, 2, 9)) == 2
    assert common_prefix_len((1, 2), (1, 2, 3)) == 2 and common_prefix_len((5,), (6,)) == 0
    kv = [(torch.zeros(1, 1, n, 2), torch.zeros(1, 1, n, 2)) for n in (4,)]
    cache = PrefixCache(max_tokens=10)
    cache.insert([1, 2, 3, 4], kv)
    n, hit = cache.lookup([1, 2, 3, 4])
    assert n == 3 and hit is not None and hit[0][0].shape[-2] == 3  # the last token is recomputed
    assert cache.lookup([1, 2, 7, 8, 9])[0] == 2 and cache.lookup([9, 9])[0] == 0
    longer = [(torch.zeros(1, 1, 6, 2), torch.zeros(1, 1, 6, 2))]
    cache.insert([1, 2, 3, 4, 5, 6], longer)  # supersedes [1, 2, 3, 4]
    assert len(cache) == 1 and cache.tokens == 6
    cache.insert([1, 2], kv)  # already covered
    assert len(cache) == 1
    cache.insert([7, 8, 9, 10, 11], [(torch.zeros(1, 1, 5, 2), torch.zeros(1, 1, 5, 2))])
    assert len(cache) == 1 and cache.tokens == 5  # the least recently used one was evicted


async def test_update_weights_between_batches(serve: Any, tmp_path: Path) -> None:
    model, _ = load_model("tiny")  # its own copy: this test changes the weights
    url, engine = serve(model=model, api_key=KEY, weight_dirs=[tmp_path])
    original = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    g = torch.Generator().manual_seed(0)
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in original.items()}
    good = tmp_path / "perturbed.safetensors"
    save_file(perturbed, str(good))
    missing = tmp_path / "missing.safetensors"
    save_file({k: v for k, v in perturbed.items() if k != "model.norm.weight"}, str(missing))
    wrong_shape = tmp_path / "wrong_shape.safetensors"
    save_file({**perturbed, "model.norm.weight": torch.ones(3)}, str(wrong_shape))
    extra = tmp_path / "extra.safetensors"
    save_file({**perturbed, "model.surprise": torch.ones(3)}, str(extra))
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"not a checkpoint")
    prompt = prompt_of(9)

    async with httpx.AsyncClient() as http:

        async def greedy(max_tokens: int = 12) -> list[int]:
            data = await complete(http, url, prompt, max_tokens=max_tokens, temperature=0)
            tokens: list[int] = data["choices"][0]["token_ids"]
            return tokens

        async def update(path: Path) -> httpx.Response:
            return await http.post(
                url + "/update_weights", json={"path": str(path)}, headers=ADMIN, timeout=60
            )

        before = await greedy(200)
        # An update sent while a generation runs waits for it: the whole generation keeps the
        # old weights.
        running = asyncio.create_task(greedy(200))
        # Only once the generation is admitted does the update have to wait for it.
        deadline = time.monotonic() + 60
        while engine.snapshot()["running"] == 0 and not running.done():
            assert time.monotonic() < deadline, "the generation was never admitted"
            await asyncio.sleep(0.001)
        response = await update(good)
        assert response.status_code == 200, response.text
        assert response.json() == {"ok": True, "weight_version": 1}
        assert await running == before
        after = await greedy()
        assert after != before[:12]
        assert engine.snapshot()["weight_version"] == 1

        for bad, needle in [
            (missing, "model.norm.weight"),
            (wrong_shape, "model.norm.weight"),
            (extra, "model.surprise"),
            (garbage, "garbage.safetensors"),
            (tmp_path / "nowhere", "nowhere"),
        ]:
            response = await update(bad)
            assert response.status_code == 422, response.text
            assert needle in response.json()["detail"][0]["msg"]
            assert response.json()["detail"][0]["loc"] == ["body", "path"]
        assert await greedy() == after  # the failed updates changed nothing
        assert engine.snapshot()["weight_version"] == 1

        # A directory written by save_pretrained (tied lm_head left out) brings the original back.
        model.load_state_dict({**original, "lm_head.weight": original["model.embed_tokens.weight"]})
        model.save_pretrained(str(tmp_path / "ckpt"))
        model.load_state_dict(
            {**perturbed, "lm_head.weight": perturbed["model.embed_tokens.weight"]}
        )
        response = await update(tmp_path / "ckpt")
        assert response.json() == {"ok": True, "weight_version": 2}
        assert await greedy() == before[:12]


def tiny_checkpoint(tiny: Tiny, path: Path) -> Path:
    """The tiny model's own weights as a checkpoint file that fits it."""
    state = {k: v for k, v in tiny[0].state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(path))
    return path


@pytest.mark.parametrize(
    ("weight_updates", "max_tokens"), [("between_batches", 4), ("between_steps", 16)]
)
async def test_weight_updates_every_50_ms_lose_no_turn_and_tag_every_token(
    serve: Any, tmp_path: Path, weight_updates: str, max_tokens: int
) -> None:
    """32 jobs of 4 turns each run while a task loads new weights every 50 ms (alternating two
    checkpoints, A on even versions, B on odd ones) until they are done. No job fails or loses a
    turn; every turn names the versions of its tokens; each token's logprob is what the weights
    of its version give (so that version generated it, and was served); and the versions never
    decrease along a trajectory. Between steps, updates land mid-generation: some turns have
    more than one version (those turns' later tokens were sampled with keys and values of the
    older weights, so only the turns of one version are teacher-forced)."""
    model, _ = load_model("tiny")  # its own copy: the updates change its weights
    weights = {"A": copy.deepcopy(model), "B": copy.deepcopy(model)}
    g = torch.Generator().manual_seed(1)
    state = {k: v for k, v in model.state_dict().items() if k != "lm_head.weight"}
    perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=g) for k, v in state.items()}
    weights["B"].load_state_dict(
        {**perturbed, "lm_head.weight": perturbed["model.embed_tokens.weight"]}
    )
    files = {"A": tmp_path / "a.safetensors", "B": tmp_path / "b.safetensors"}
    save_file(state, str(files["A"]))
    save_file(perturbed, str(files["B"]))
    url, engine = serve(
        model=model,
        api_key=KEY,
        weight_dirs=[tmp_path],
        max_batch=4,
        weight_updates=weight_updates,
    )
    client = VLLMClient(url + "/v1")
    done = asyncio.Event()
    loaded = [0]  # every version the engine answered an update with

    async def updates(http: httpx.AsyncClient) -> None:
        while not done.is_set():
            path = files["B" if len(loaded) % 2 else "A"]  # the next version's weights
            response = await http.post(
                url + "/update_weights", json={"path": str(path)}, headers=ADMIN, timeout=60
            )
            assert response.status_code == 200, response.text
            loaded.append(response.json()["weight_version"])
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), 0.05)

    async def job(i: int) -> Trajectory:
        traj = Trajectory(prompt_ids=prompt_of(4 + i % 7, salt=i))
        for turn in range(4):
            prompt = traj.next_prompt()
            params = SamplingParams(max_tokens=max_tokens, temperature=1.0, seed=100 * i + turn)
            gen = await client.generate(prompt, params, vocab_size=engine.vocab_size)
            traj.add_generated(gen.token_ids, gen.logprobs)
            traj.turns.append(
                {"prompt_tokens": len(prompt), "output_tokens": len(gen.token_ids)}
                | policy_version_fields(gen.policy_versions)
            )
            traj.add_inserted([11, 12, 13])  # an observation
        return traj

    try:
        async with httpx.AsyncClient() as http:
            updater = asyncio.create_task(updates(http))
            try:
                trajectories = await asyncio.gather(*[job(i) for i in range(32)])
            finally:
                done.set()
                await updater
    finally:
        await client.aclose()

    assert loaded == list(range(len(loaded))) and engine.snapshot()["weight_version"] == loaded[-1]
    seen: set[int] = set()
    mixed = 0  # turns whose tokens came from more than one version
    for traj in trajectories:
        assert traj.invariant_error() is None and len(traj.turns) == 4
        versions: list[int] = []
        for turn in traj.turns:
            n, start = turn["output_tokens"], turn["prompt_tokens"]
            tagged = turn.get(POLICY_VERSIONS) or [turn[POLICY_VERSION]] * n
            assert len(tagged) == n and set(tagged) <= set(loaded), turn
            versions += tagged
            if len(set(tagged)) > 1:
                mixed += 1
                continue
            version = tagged[0]
            prompt, tokens = traj.ids[:start], traj.ids[start : start + n]
            served = weights["B" if version % 2 else "A"]
            assert traj.logprobs[start - len(traj.prompt_ids) :][:n] == pytest.approx(
                teacher_forced(served, prompt, tokens), abs=1e-3
            ), f"turn tagged version {version} was not generated by its weights"
        assert versions == sorted(versions), versions
        seen.update(versions)
    # Between batches a generation has one version; between steps updates land inside them.
    assert (mixed > 0) == (weight_updates == "between_steps"), mixed
    assert len(seen) >= 2, f"no update landed while the jobs ran: {seen}"
    # The two checkpoints really differ, so the logprob check above tells versions apart.
    traj = trajectories[0]
    n, start = traj.turns[0]["output_tokens"], traj.turns[0]["prompt_tokens"]
    a, b = (teacher_forced(weights[w], traj.ids[:start], traj.ids[start : start + n]) for w in "AB")
    assert a != pytest.approx(b, abs=1e-2)


def stats_of(engine: Engine) -> Callable[[], Awaitable[dict[str, Any]]]:
    async def stats() -> dict[str, Any]:
        return dict(engine.snapshot())

    return stats


def spans_of(data: dict[str, Any]) -> list[tuple[int, int, int]]:
    return [(s["version"], s["start"], s["end"]) for s in data["weight_versions"]]


async def test_an_update_between_steps_lands_mid_generation(
    serve: Any, tiny: Tiny, tmp_path: Path
) -> None:
    """With weight_updates="between_steps" an update lands while a long generation runs: the
    generation is not aborted and does not hold the update back; it goes on to its full length,
    and its spans say where the version changed."""
    model, _ = load_model("tiny")
    url, engine = serve(
        model=model, api_key=KEY, weight_dirs=[tmp_path], weight_updates="between_steps"
    )
    ckpt = tiny_checkpoint(tiny, tmp_path / "w.safetensors")
    async with httpx.AsyncClient() as http:
        running = asyncio.create_task(
            complete(http, url, prompt_of(6), max_tokens=150, ignore_eos=True, temperature=0)
        )
        await until(stats_of(engine), lambda s: s["generated_tokens"] >= 3, "it started")
        response = await http.post(
            url + "/update_weights", json={"path": str(ckpt)}, headers=ADMIN, timeout=60
        )
        assert response.json() == {"ok": True, "weight_version": 1}
        assert not running.done()  # answered before the generation ended: no drain
        data = await running
    assert data["choices"][0]["finish_reason"] == "length"
    assert len(tokens_of(data)) == 150
    (v0, s0, e0), (v1, s1, e1) = spans_of(data)
    assert (v0, s0, v1, e1) == (0, 0, 1, 150) and e0 == s1 and 3 <= e0 < 150


async def test_pause_keep_freezes_a_generation_that_goes_on_under_the_new_weights(
    serve: Any, tiny: Tiny, tmp_path: Path
) -> None:
    """vLLM's /pause?mode=keep, an update, /resume: the generation in flight is frozen (the
    update does not wait for it, even in the default between_batches mode), then finishes under
    the new weights; a request sent while paused waits for /resume."""
    model, _ = load_model("tiny")
    url, engine = serve(model=model, api_key=KEY, weight_dirs=[tmp_path])
    ckpt = tiny_checkpoint(tiny, tmp_path / "w.safetensors")
    async with httpx.AsyncClient() as http:
        running = asyncio.create_task(
            complete(http, url, prompt_of(6), max_tokens=150, ignore_eos=True, temperature=0)
        )
        await until(stats_of(engine), lambda s: s["generated_tokens"] >= 3, "it started")
        assert (await http.post(url + "/pause", params={"mode": "keep"})).json() == {
            "status": "paused"
        }
        assert (await http.get(url + "/is_paused")).json() == {"is_paused": True}
        frozen = engine.snapshot()["generated_tokens"]
        response = await http.post(
            url + "/update_weights", json={"path": str(ckpt)}, headers=ADMIN, timeout=60
        )
        assert response.json() == {"ok": True, "weight_version": 1}
        waiting = asyncio.create_task(complete(http, url, prompt_of(5), max_tokens=3))
        await until(stats_of(engine), lambda s: s["waiting"] == 1, "the new request queued")
        assert engine.snapshot()["generated_tokens"] == frozen and not running.done()
        assert (await http.post(url + "/resume")).json() == {"status": "resumed"}
        data, later = await running, await waiting
    assert len(tokens_of(data)) == 150
    assert spans_of(data) == [(0, 0, frozen), (1, frozen, 150)]
    assert spans_of(later) == [(1, 0, 3)]
    assert (await asyncio.to_thread(httpx.get, url + "/is_paused")).json() == {"is_paused": False}


async def test_pause_abort_ends_generations_with_their_tokens_and_the_pool_resumes_them(
    serve: Any, tiny: Tiny, tmp_path: Path
) -> None:
    """The pool's pause "abort" on the engine: the generation in flight comes back from the
    engine as finish_reason "abort" with the tokens it had, and the pool, once resumed, goes on
    from that prefix: the caller gets one generation of every token asked for, the first ones
    under version 0, the rest under the weights loaded during the pause."""
    from raas.llm.pool import BackendPool

    model, _ = load_model("tiny")
    url, engine = serve(model=model, api_key=KEY, weight_dirs=[tmp_path])
    ckpt = tiny_checkpoint(tiny, tmp_path / "w.safetensors")
    pool = BackendPool(vocab_size=lambda: engine.vocab_size)
    pool.add(url, "vllm")
    params = SamplingParams(max_tokens=150, temperature=1.0, seed=5)
    prompt = prompt_of(6)
    try:
        running = asyncio.create_task(pool.generate("job-1", prompt, params))
        await until(stats_of(engine), lambda s: s["generated_tokens"] >= 3, "it started")
        assert await pool.pause("abort") == {url: "paused"}
        cut = engine.snapshot()["generated_tokens"]
        async with httpx.AsyncClient() as http:
            response = await http.post(
                url + "/update_weights", json={"path": str(ckpt)}, headers=ADMIN, timeout=60
            )
        assert response.json() == {"ok": True, "weight_version": 1}
        assert not running.done()  # aborted by the engine, held by the pool
        await pool.resume()
        gen = await running
    finally:
        await pool.stop()
    assert gen.finish_reason == "length" and len(gen.token_ids) == len(gen.logprobs) == 150
    assert gen.policy_versions == [0] * cut + [1] * (150 - cut)
    assert 3 <= cut < 150
    stats = engine.snapshot()
    assert stats["requests"] == 2 and stats["generated_tokens"] == 150  # nothing generated twice


async def test_update_weights_needs_the_engine_key(serve: Any, tiny: Tiny, tmp_path: Path) -> None:
    """Without the key (or with another, or on an engine given none) /update_weights is a 401
    that reads nothing, not even the body; generation needs no key, as on vLLM without one."""
    good = {"path": str(tiny_checkpoint(tiny, tmp_path / "w.safetensors"))}
    keyed, engine = serve(api_key=KEY, weight_dirs=[tmp_path])
    keyless, _ = serve(weight_dirs=[tmp_path])
    async with httpx.AsyncClient(timeout=60) as http:
        for url, headers in [
            (keyed, {}),
            (keyed, {"Authorization": "Bearer not-the-key"}),
            (keyed, {"Authorization": f"Basic {KEY}"}),
            (keyed, {"Authorization": "Bearer \u00e9".encode("latin-1")}),  # a 401, not a 500
            (keyless, ADMIN),
            (keyless, {}),
        ]:
            response = await http.post(url + "/update_weights", json=good, headers=headers)
            assert response.status_code == 401, response.text
            assert response.headers["www-authenticate"] == "Bearer"
        refused = await http.post(keyless + "/update_weights", json=good, headers=ADMIN)
        assert "started without an API key" in refused.json()["error"]["message"]
        # Refused before the body is parsed: a body that is no JSON is no 422.
        garbled = await http.post(keyed + "/update_weights", content=b"{", headers={})
        assert garbled.status_code == 401
        assert engine.snapshot()["weight_version"] == 0
        await complete(http, keyed, prompt_of(4), max_tokens=2)  # generation stays open
        ok = await http.post(keyed + "/update_weights", json=good, headers=ADMIN)
        assert ok.status_code == 200, ok.text
    assert engine.snapshot()["weight_version"] == 1


async def test_weights_load_only_from_the_weight_dirs(
    serve: Any, tiny: Tiny, tmp_path: Path
) -> None:
    """A path outside the weight directories is a 403 that says the same whether it exists or
    not; links are followed first (a link inside pointing out is refused, one pointing in is
    not); a sharded index cannot name a file outside either."""
    allowed, outside = tmp_path / "weights", tmp_path / "elsewhere"
    allowed.mkdir()
    outside.mkdir()
    inside = tiny_checkpoint(tiny, allowed / "inside.safetensors")
    theirs = tiny_checkpoint(tiny, outside / "theirs.safetensors")
    (allowed / "out-link.safetensors").symlink_to(theirs)
    (allowed / "missing-link.safetensors").symlink_to(outside / "missing.safetensors")
    (allowed / "dir-link").symlink_to(outside, target_is_directory=True)
    (outside / "in-link.safetensors").symlink_to(inside)
    sharded = allowed / "sharded"
    sharded.mkdir()
    index = {"weight_map": {"model.norm.weight": "../../elsewhere/theirs.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    linked_dir = allowed / "linked"
    linked_dir.mkdir()
    (linked_dir / "model.safetensors").symlink_to(theirs)
    url, engine = serve(api_key=KEY, weight_dirs=[allowed])

    async with httpx.AsyncClient(timeout=60) as http:

        async def update(path: Path | str) -> httpx.Response:
            body = {"path": str(path)}
            return await http.post(url + "/update_weights", json=body, headers=ADMIN)

        answers = []
        for path in [
            theirs,
            outside / "missing.safetensors",
            outside,
            "/etc/passwd",
            "/no/such/file",
            allowed / ".." / "elsewhere" / "theirs.safetensors",
            allowed / "out-link.safetensors",
            allowed / "missing-link.safetensors",
            allowed / "dir-link" / "theirs.safetensors",
            allowed / "dir-link",
            sharded,
            linked_dir,
        ]:
            response = await update(path)
            assert response.status_code == 403, (path, response.text)
            answers.append(response.json())
        assert all(a == answers[0] for a in answers), answers  # nothing tells them apart
        assert "elsewhere" not in json.dumps(answers[0])
        assert engine.snapshot()["weight_version"] == 0
        # Inside, directly or through a link that leads in: loaded.
        assert (await update(inside)).json() == {"ok": True, "weight_version": 1}
        assert (await update(outside / "in-link.safetensors")).status_code == 200
    assert engine.snapshot()["weight_version"] == 2


async def test_an_engine_process_gets_its_key_through_the_environment(tmp_path: Path) -> None:
    """EngineProcess (raas run, demo, the GRPO example) makes a key, hands it over in the
    environment (ps shows argv to every user) and uses it; its --weights-dir too."""
    weights = tmp_path / "weights"
    weights.mkdir()
    engine = EngineProcess("tiny", tmp_path / "engine.log", weight_dirs=[weights])
    try:
        assert engine.api_key and all(engine.api_key not in arg for arg in engine.proc.args)
        engine.wait_ready()
        tiny_checkpoint(load_model("tiny"), weights / "w.safetensors")
        body = {"path": str(weights / "w.safetensors")}
        async with httpx.AsyncClient(timeout=60) as http:
            refused = await http.post(engine.url + "/update_weights", json=body)
            loaded = await http.post(
                engine.url + "/update_weights", json=body, headers=engine.admin_headers()
            )
        assert refused.status_code == 401
        assert loaded.json() == {"ok": True, "weight_version": 1}, loaded.text
    finally:
        engine.stop(timeout_s=5)


async def test_requests_are_validated(serve: Any) -> None:
    url, engine = serve(api_key=KEY)
    prompt = prompt_of(5)
    cases: list[tuple[dict[str, Any], int, str]] = [
        ({"prompt": prompt, "best_of": 2}, 422, "best_of"),
        ({"prompt": prompt, "n": 2}, 422, "n"),
        ({"prompt": [prompt, prompt]}, 422, "prompt"),
        ({"prompt": []}, 422, "prompt"),
        ({"prompt": prompt, "stream": True, "logprobs": 2}, 422, "stream"),
        ({"prompt": prompt, "stream_options": {"include_usage": True}}, 422, "stream_options"),
        ({"prompt": prompt, "stop": ["\n"]}, 422, "stop"),
        ({"prompt": prompt, "logprobs": 21}, 422, "logprobs"),
        ({"prompt": prompt, "max_tokens": engine.max_model_len}, 400, "max_tokens"),
        ({"prompt": [1, 2, 10**9]}, 400, "prompt"),
        ({"prompt": prompt, "model": "gpt-4"}, 404, "model"),
    ]
    async with httpx.AsyncClient() as http:
        for body, status, field in cases:
            response = await http.post(url + "/v1/completions", json=body)
            assert response.status_code == status, (body, response.text)
            data = response.json()
            if status == 422:
                assert any(e["loc"][:2] == ["body", field] for e in data["detail"]), data
            else:
                assert data["error"]["param"] == field and data["error"]["code"] == status
        lists = await http.post(url + "/v1/completions", json={"prompt": [prompt, prompt]})
        assert "one prompt per request" in lists.text
        too_long = await http.post(
            url + "/v1/completions", json={"prompt": prompt, "max_tokens": engine.max_model_len}
        )
        assert "maximum context length is 4096" in too_long.json()["error"]["message"]
        response = await http.post(
            url + "/update_weights", json={"path": "x", "force": True}, headers=ADMIN
        )
        assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == "force"


async def test_models_health_and_stats(serve: Any) -> None:
    url, _ = serve(max_batch=4)
    async with httpx.AsyncClient() as http:
        models = (await http.get(url + "/v1/models")).json()
        health = await http.get(url + "/health")
        await complete(http, url, prompt_of(4), max_tokens=3)
        stats = (await http.get(url + "/v1/engine/stats")).json()
    card = models["data"][0]
    assert models["object"] == "list" and card["id"] == card["root"] == "tiny"
    assert card["object"] == "model" and card["owned_by"] == "raas"
    assert card["max_model_len"] == 4096
    assert health.status_code == 200 and health.content == b""
    assert stats["requests"] == 1 and stats["generated_tokens"] == 3 and stats["batches"] == 1
    assert stats["max_batch"] == 4 and stats["weight_version"] == 0
    assert {"prefix_cache_hits", "cached_tokens"} <= stats.keys()


async def test_the_vllm_client_speaks_to_the_engine(serve: Any, tiny: Tiny) -> None:
    url, _ = serve()
    prompt = prompt_of(7)
    client = VLLMClient(url + "/v1")
    try:
        gen = await client.generate(prompt, SamplingParams(temperature=0.0, max_tokens=6))
    finally:
        await client.aclose()
    assert len(gen.token_ids) == 6 and gen.finish_reason == "length"
    assert gen.logprobs == pytest.approx(teacher_forced(tiny[0], prompt, gen.token_ids), abs=1e-3)


def events_of(text: str) -> list[Any]:
    """The events of a server-sent stream: each ``data:`` line's JSON, ``[DONE]`` as is."""
    data = [line[5:].strip() for line in text.splitlines() if line.startswith("data:")]
    return [d if d == "[DONE]" else json.loads(d) for d in data]


async def test_a_streamed_completion_is_the_whole_one_in_chunks(serve: Any) -> None:
    url, _ = serve()
    prompt = prompt_of(9)
    ask = {"max_tokens": 12, "temperature": 0, "return_tokens_as_token_ids": True}
    async with httpx.AsyncClient(timeout=60) as http:
        whole = await complete(http, url, prompt, **ask)
        response = await http.post(
            url + "/v1/completions",
            json={
                "prompt": prompt,
                "return_token_ids": True,
                "logprobs": 0,
                "stream": True,
                "stream_options": {"include_usage": True},
                **ask,
            },
        )
    assert response.headers["content-type"].startswith("text/event-stream")
    *chunks, usage, done = events_of(response.text)
    assert done == "[DONE]" and usage["choices"] == []
    counts = usage["usage"]
    assert (counts["prompt_tokens"], counts["completion_tokens"]) == (9, 12)
    assert counts["prompt_tokens_details"]["cached_tokens"] == 8  # the whole one's prefix
    choices = [c["choices"][0] for c in chunks]
    assert [t for c in choices for t in c["token_ids"]] == tokens_of(whole)
    values = [v for c in choices for v in c["logprobs"]["token_logprobs"]]
    assert values == pytest.approx(whole["choices"][0]["logprobs"]["token_logprobs"])
    names = [n for c in choices for n in c["logprobs"]["tokens"]]
    assert names == whole["choices"][0]["logprobs"]["tokens"]
    # Only the last chunk ends it, with the weights of the whole generation, as the whole one.
    assert [c["finish_reason"] for c in choices] == [None] * (len(choices) - 1) + ["length"]
    assert chunks[-1]["weight_versions"] == whole["weight_versions"]
    assert all("weight_versions" not in c for c in chunks[:-1])
    assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]


async def test_a_stream_is_read_while_it_runs_and_a_reader_that_leaves_aborts_it(
    serve: Any,
) -> None:
    url, _ = serve(max_batch=2)
    long = {"max_tokens": 4000, "temperature": 0, "ignore_eos": True}  # minutes to finish
    body = {"prompt": prompt_of(5), "return_token_ids": True, "stream": True, **long}
    async with httpx.AsyncClient(timeout=60) as http:
        seen: list[int] = []
        async with http.stream("POST", url + "/v1/completions", json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data:"):
                    seen += json.loads(line[5:])["choices"][0]["token_ids"]
                if len(seen) >= 5:
                    break  # five tokens of 4000 read: the generation is under way; leave

        async def stats() -> dict[str, Any]:
            data: dict[str, Any] = (await http.get(url + "/v1/engine/stats")).json()
            return data

        gone = await until(stats, lambda s: s["aborted"] == 1, "the stream's generation ended")
    assert gone["running"] == 0 and gone["requests"] == 0
    assert gone["generated_tokens"] < 4000


async def test_the_engine_without_http(tiny: Tiny) -> None:
    engine = Engine(*tiny, max_batch=2)
    try:
        results = await asyncio.gather(
            *[
                engine.generate(prompt_of(n), GenerationParams(max_tokens=4, temperature=0))
                for n in (2, 3, 4)
            ]
        )
    finally:
        engine.shutdown()
    assert [len(r.token_ids) for r in results] == [4, 4, 4]
    assert engine.stats.batches >= 2  # max_batch 2: the third waited for a free slot


async def until(
    check: Callable[[], Awaitable[dict[str, Any]]],
    condition: Callable[[dict[str, Any]], bool],
    what: str,
    timeout_s: float = 60.0,
) -> dict[str, Any]:
    """Poll ``check()`` until its answer meets ``condition``; fail after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = await check()
        if condition(got):
            return got
        assert time.monotonic() < deadline, f"{what}: still {got}"
        await asyncio.sleep(0.01)


async def drop(client: httpx.AsyncClient, task: asyncio.Task[Any]) -> None:
    """The client goes away mid-request: its task is cancelled and its connections closed."""
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    await client.aclose()


async def test_a_client_that_leaves_aborts_its_generation(serve: Any) -> None:
    url, _ = serve(max_batch=2)
    long = {"max_tokens": 4000, "temperature": 0, "ignore_eos": True}  # minutes to finish
    clients = [httpx.AsyncClient() for _ in range(3)]
    tasks = [
        asyncio.create_task(complete(client, url, prompt_of(5, salt=i), **long))
        for i, client in enumerate(clients)
    ]
    async with httpx.AsyncClient() as http:

        async def stats() -> dict[str, Any]:
            data: dict[str, Any] = (await http.get(url + "/v1/engine/stats")).json()
            return data

        await until(
            stats,
            lambda s: s["running"] == 2 and s["waiting"] == 1 and s["decode_steps"] >= 10,
            "two generations running and one waiting",
        )
        # Whether the third request is the one queued or one running, dropping it takes it out
        # and the others run.
        await drop(clients[2], tasks[2])
        s = await until(
            stats, lambda s: s["running"] + s["waiting"] == 2, "the third client's request left"
        )
        assert s["aborted"] == 1
        await until(stats, lambda s: s["running"] == 2, "the two others run")
        await drop(clients[0], tasks[0])
        first = await until(
            stats, lambda s: s["running"] == 1, "the first client's generation was aborted"
        )
        assert first["aborted"] == 2 and first["waiting"] == 0
        # Only the remaining sequence generates now: one token a decode step.
        second = await until(
            stats,
            lambda s: s["decode_steps"] >= first["decode_steps"] + 20,
            "the remaining generation goes on",
        )
        assert second["running"] == 1
        assert (
            second["generated_tokens"] - first["generated_tokens"]
            == second["decode_steps"] - first["decode_steps"]
        )
        await drop(clients[1], tasks[1])
        gone = await until(stats, lambda s: s["running"] == 0, "all three were aborted")
        assert gone["aborted"] == 3 and gone["requests"] == 0
        assert gone["generated_tokens"] < 2 * 4000
        # Nothing more is generated for them: a fresh request of 8 tokens is all that runs.
        data = await complete(http, url, prompt_of(4), max_tokens=8, temperature=0)
        assert len(tokens_of(data)) == 8
        after = await stats()
    assert after["requests"] == 1 and after["running"] == 0 and after["aborted"] == 3
    assert after["generated_tokens"] == gone["generated_tokens"] + 8
    assert after["decode_steps"] == gone["decode_steps"] + 7  # the first token comes from prefill


async def test_the_engine_generation_is_aborted_when_its_task_is_cancelled(tiny: Tiny) -> None:
    engine = Engine(*tiny, max_batch=1)
    try:
        long = GenerationParams(max_tokens=4000, temperature=0, ignore_eos=True)
        running = asyncio.create_task(engine.generate(prompt_of(3), long))
        queued = asyncio.create_task(engine.generate(prompt_of(4), long))

        async def stats() -> dict[str, Any]:
            return engine.snapshot()

        await until(stats, lambda s: s["running"] == 1 and s["waiting"] == 1, "one runs, one waits")
        queued.cancel()
        s = await until(stats, lambda s: s["waiting"] == 0, "the queued one left")
        assert s["running"] == 1 and s["aborted"] == 1
        running.cancel()
        s = await until(stats, lambda s: s["running"] == 0, "the running one left")
        assert s["aborted"] == 2 and s["waiting"] == 0
        for task in (running, queued):
            with pytest.raises(asyncio.CancelledError):
                await task
        assert engine.snapshot()["requests"] == 0
    finally:
        engine.shutdown()


def test_a_stop_waits_for_the_prefill_under_way_not_every_one_admitted(tiny: Tiny) -> None:
    """Requests admitted together were prefilled one after another before the worker looked at
    a stop: long prompts on a busy CPU kept a stopped engine alive for tens of seconds."""
    engine = Engine(*tiny, max_batch=4)
    prefilled: list[int] = []
    prefill = engine._prefill

    def stop_during_the_first(request: Any) -> Any:
        prefilled.append(len(request.prompt))
        if len(prefilled) == 1:
            engine.stop()  # as SIGTERM's shutdown does, from another thread
        return prefill(request)

    engine._prefill = stop_during_the_first  # type: ignore[method-assign]
    params = GenerationParams(max_tokens=4, temperature=0)
    try:
        with engine._cond:  # the worker admits all three at once, once this lets go
            futures = [engine.submit(prompt_of(n), params) for n in (2, 3, 4)]
        for future in futures:
            with pytest.raises(EngineStopped):
                future.result(timeout=60)
    finally:
        engine.shutdown()
    assert len(prefilled) == 1


async def test_sigterm_stops_the_generations_in_flight(tmp_path: Path) -> None:
    """`raas engine` with generations that would take minutes: SIGTERM answers them with 503 and
    the process exits (status 0) without waiting for them."""
    engine = EngineProcess("tiny", tmp_path / "engine.log", extra_args=["--max-batch", "4"])
    try:
        engine.wait_ready()
        long = {"max_tokens": 4000, "temperature": 0, "ignore_eos": True}
        async with httpx.AsyncClient(timeout=120) as http:
            requests = [
                asyncio.create_task(
                    http.post(
                        engine.url + "/v1/completions", json={"prompt": prompt_of(5, i), **long}
                    )
                )
                for i in range(6)  # four running, two waiting
            ]

            async def stats() -> dict[str, Any]:
                data: dict[str, Any] = (await http.get(engine.url + "/v1/engine/stats")).json()
                return data

            await until(
                stats,
                lambda s: s["running"] == 4 and s["waiting"] == 2 and s["decode_steps"] >= 10,
                "the generations are under way",
            )
            engine.proc.send_signal(signal.SIGTERM)
            try:
                # Minutes: a deadline for a hang, not a speed (30 s passed on loaded cores).
                code = await asyncio.to_thread(engine.proc.wait, 180)
            except subprocess.TimeoutExpired:
                pytest.fail("the engine was still running 180 s after SIGTERM")
            answers = await asyncio.gather(*requests, return_exceptions=True)
        assert code == 0, (tmp_path / "engine.log").read_text()[-3000:]
        for answer in answers:
            assert isinstance(answer, httpx.Response), answer
            assert answer.status_code == 503, answer.text
            assert answer.json()["error"]["type"] == "ServiceUnavailableError"
    finally:
        engine.stop(timeout_s=5)
