"""No drift across a multi-turn tool-using rollout: the tiny model behind the embedded engine,
over HTTP through the backend pool, with SmolLM2's real tokenizer and chat template."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from raas.agent.tools import BUILTIN_TOOLS, schema
from raas.llm.chat import encode, render_text, turn_delta
from raas.llm.engine import create_engine_app
from raas.llm.models import load_model
from raas.llm.pool import BackendPool
from raas.llm.types import SamplingParams
from raas.wire import Trajectory
from tests.support.llm_servers import ServerThread


@pytest.fixture(scope="module")
def engine_url() -> Iterator[str]:
    server = ServerThread(create_engine_app("tiny")).start()
    yield server.url
    server.stop()


async def test_four_turns_keep_every_token_the_model_saw_and_produced(engine_url: str) -> None:
    model, tok = load_model("tiny")
    pool = BackendPool()
    pool.add(engine_url, "vllm")
    tools = [schema(BUILTIN_TOOLS[n]) for n in ("bash", "finish")]
    messages = [
        {"role": "system", "content": "You are a careful engineer."},
        {"role": "user", "content": "Find the failing test and fix it."},
    ]
    traj = Trajectory(prompt_ids=encode(tok, render_text(tok, messages, tools, True)))
    params = SamplingParams(temperature=0.9, max_tokens=12, seed=5, stop_token_ids=(2,))
    cached = []
    try:
        for turn in range(4):
            prompt = traj.next_prompt()
            gen = await pool.generate("rollout", prompt, params)
            cached.append(gen.cached_tokens)
            traj.add_generated(gen.token_ids, gen.logprobs)
            if turn < 3:
                observation = [{"role": "tool", "content": f"tests: {turn} failed"}]
                traj.add_inserted(turn_delta(tok, traj.response_ids, observation))
    finally:
        await pool.stop()
    assert traj.invariant_error() is None
    assert len(cached) == 4 and traj.loss_mask.count(0) > 0
    assert all(c > 0 for c in cached[1:])  # sticky: each turn reused the previous one's KV
    # Re-score the final sequence in one forward pass: each generated token's logprob is what the
    # engine returned during the rollout, so the model saw exactly these tokens.
    ids = traj.ids
    with torch.no_grad():
        logprobs = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)
    start = len(traj.prompt_ids)
    for i, (token, mask, lp) in enumerate(
        zip(traj.response_ids, traj.loss_mask, traj.logprobs, strict=True)
    ):
        if mask:
            assert float(logprobs[start + i - 1, token]) == pytest.approx(lp, abs=1e-3)
        else:
            assert lp == 0.0
