"""The oracle as a model: prompt token ids in, the next gold step's token ids out.

It decodes the prompt with the tokenizer raas renders with (SmolLM2's ChatML), finds the bundled
task by its user message, counts the turns so far and answers the plan's next step, encoded and
closed with the end-of-turn token, as a model's output would be. A prompt that is no bundled
task gets a plain-text reply (no tool call), so the rollout ends instead of failing.

The logprobs are not a model's (the oracle is certain): each is a function of its token id, so
that a logprob shifted against its token shows in a check. Every generation is kept (per task,
the last few), so a test can compare a trajectory's tokens with what the oracle really produced.
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from pathlib import Path
from typing import Any

from raas.llm.chat import encode
from raas.llm.engine.completion import GenerationResult
from raas.oracle.catalogue import GoldTask, catalogue
from raas.oracle.policy import UNKNOWN, chatml, next_reply, turns_after_task
from raas.oracle.sabotage import sabotage_of

KEPT_PER_TASK = 64


def token_logprob(token: int) -> float:
    """The logprob the oracle reports for ``token``: in [-0.1, -0.001], a function of the id."""
    return -((token * 7919) % 100 + 1) / 1000


class Oracle:
    def __init__(
        self, tokenizer: Any, sabotage: float = 0.0, seed: int = 0, rows: tuple[Path, ...] = ()
    ) -> None:
        if not 0.0 <= sabotage <= 1.0:
            raise ValueError(f"sabotage is a fraction from 0 to 1, not {sabotage}")
        self.tokenizer = tokenizer
        self.sabotage = sabotage
        self.seed = seed
        self.tasks = catalogue(rows)  # the bundles, and the SWE rows of these files
        self.counts: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._kept: dict[str, deque[GenerationResult]] = {}

    def way(self, task: GoldTask) -> str | None:
        """How ``task`` is sabotaged here, or None (gold)."""
        return sabotage_of(task.kind, task.instance_id, self.sabotage, self.seed)

    def find(self, messages: list[tuple[str, str]]) -> GoldTask | None:
        users = [content for role, content in messages if role == "user"]
        if not users:
            return None
        found = self.tasks.get(users[-1])
        if found is None:  # a tokenizer that does not give the text back exactly
            found = next((t for key, t in self.tasks.items() if key in users[-1]), None)
        return found

    def reply(self, prompt_ids: list[int]) -> tuple[GoldTask | None, str]:
        """The task the prompt is, and the text of the next step."""
        text = self.tokenizer.decode(
            prompt_ids, skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        messages = chatml(str(text))
        task = self.find(messages)
        if task is None:
            return None, UNKNOWN
        return task, next_reply(task, self.way(task), turns_after_task(messages))

    def generate(
        self, prompt_ids: list[int], max_tokens: int, stop_token_ids: frozenset[int] = frozenset()
    ) -> GenerationResult:
        task, text = self.reply(prompt_ids)
        ids = encode(self.tokenizer, text) + [self.tokenizer.eos_token_id]
        finish, stop_reason = "stop", None
        for i, token in enumerate(ids[:-1]):
            if token in stop_token_ids:
                ids, stop_reason = ids[: i + 1], token
                break
        if len(ids) > max_tokens:
            ids, finish, stop_reason = ids[:max_tokens], "length", None
        logprobs = [token_logprob(t) for t in ids]
        out = GenerationResult(
            prompt_token_ids=list(prompt_ids),
            token_ids=ids,
            logprobs=logprobs,
            # The oracle is certain: the token it gives is its only candidate.
            top_logprobs=[[(t, lp)] for t, lp in zip(ids, logprobs, strict=True)],
            finish_reason=finish,
            stop_reason=stop_reason,
            stopped_on_token=finish == "stop",
        )
        name = task.instance_id if task is not None else ""
        with self._lock:
            self.counts["generations"] += 1
            self.counts["unknown" if task is None else task.kind] += 1
            if task is not None:
                self._kept.setdefault(name, deque(maxlen=KEPT_PER_TASK)).append(out)
        return out

    def generations(self, instance_id: str) -> list[GenerationResult]:
        """What the oracle generated for a task, oldest first (the last ``KEPT_PER_TASK``)."""
        with self._lock:
            return list(self._kept.get(instance_id, ()))
