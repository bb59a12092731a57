"""Scripted policies: an LLM stand-in that answers with prepared text, per job."""

from __future__ import annotations

import json
from typing import Any

from raas.llm.chat import encode
from raas.llm.types import Generation, SamplingParams


def call(name: str, **arguments: Any) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


class ScriptedPolicy:
    """Each job (session) gets the next scripted turn; the end-of-turn token is appended."""

    def __init__(self, tokenizer: Any, scripts: dict[str, list[str]]) -> None:
        self.tok = tokenizer
        self.scripts = {k: list(v) for k, v in scripts.items()}
        self.prompts: dict[str, list[list[int]]] = {}
        self.released: list[str] = []

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation:
        self.prompts.setdefault(session, []).append(list(prompt_ids))
        turns = self.scripts.get(session) or ["Nothing more to do."]
        text = turns.pop(0) if turns else "Nothing more to do."
        ids = encode(self.tok, text) + [self.tok.eos_token_id]
        return Generation(ids, [-0.1] * len(ids), "stop", backend="scripted")

    def release(self, session: str) -> None:
        self.released.append(session)
