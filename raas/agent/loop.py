"""The agent loop: generate, parse tool calls, run them in the sandbox, append, repeat.

One loop for every task. It works on token ids end to end (see raas.llm.chat): what goes into
the trajectory is exactly what the model saw and produced. It writes into the trajectory it is
given as it goes, so a job that is cancelled or runs out of time keeps every finished turn; the
pipeline checks the trajectory's invariant when it writes the job's result.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Annotated, Any, Protocol

from pydantic import Field

from raas.agent.tools import Tool, call_tool, schema, touches_sandbox
from raas.llm.chat import encode, render_text, turn_delta
from raas.llm.toolcalls import ToolCallParser, get_parser
from raas.llm.types import WHOLE, Generation, SamplingParams
from raas.sandbox import Sandbox
from raas.wire import Trajectory, policy_version_fields

# Bounds far above any real run, so that a typo (or 1e18) is a 422, not a loop that never ends.
MAX_TURNS = 10_000
MAX_CONTEXT_TOKENS = 2**24
MAX_SNAPSHOTS = 1_000


class LoopParams(SamplingParams):
    """The sampling_params an agent task takes: the sampling keys plus the loop's own limits.

    Its fields are the one list of accepted keys; any other key is an error naming it.
    """

    max_turns: Annotated[int, Field(strict=True, ge=1, le=MAX_TURNS), WHOLE] = 10
    max_context_tokens: Annotated[int, Field(strict=True, ge=1, le=MAX_CONTEXT_TOKENS), WHOLE] = (
        4096
    )
    # Snapshots kept of this job's state after each turn, for branches (raas.agent.snapshots).
    keep_snapshots: Annotated[int, Field(strict=True, ge=0, le=MAX_SNAPSHOTS), WHOLE] = 0

    def sampling(self) -> SamplingParams:
        """The part that goes to the backend on every turn."""
        return SamplingParams(**self.model_dump(include=set(SamplingParams.model_fields)))


# Called after each turn the loop goes on from (its observations appended): the number of turns
# done and the trajectory so far.
AfterTurn = Callable[[int, Trajectory], Awaitable[None]]
# Called before a turn's tools run (they may change the sandbox): a checkpoint of the turn before
# may still be reading it.
BeforeTools = Callable[[], Awaitable[None]]


class Generator(Protocol):
    """What the loop needs of the LLM side (the BackendPool is one)."""

    async def generate(
        self, session: str, prompt_ids: list[int], params: SamplingParams
    ) -> Generation: ...


@dataclass(frozen=True)
class LoopConfig:
    max_turns: int = 10
    max_tokens: int = 512  # per turn
    max_context_tokens: int = 4096
    keep_snapshots: int = 0
    repeat_limit: int = 3  # the same action this many times in a row ends the loop
    sampling: SamplingParams = field(default_factory=SamplingParams)

    @classmethod
    def of(cls, params: LoopParams, repeat_limit: int = 3) -> LoopConfig:
        return cls(
            max_turns=params.max_turns,
            max_tokens=params.max_tokens,
            max_context_tokens=params.max_context_tokens,
            keep_snapshots=params.keep_snapshots,
            repeat_limit=repeat_limit,
            sampling=params.sampling(),
        )


@dataclass
class LoopResult:
    stop_reason: str
    answer: str | None = None  # the finish tool's answer, when the model called it


@dataclass
class AgentLoop:
    llm: Generator
    tokenizer: Any
    tools: dict[str, Tool]
    sandbox: Sandbox | None
    config: LoopConfig
    tool_format: str = "hermes"
    after_turn: AfterTurn | None = None
    before_tools: BeforeTools | None = None
    parser: ToolCallParser = field(init=False)

    def __post_init__(self) -> None:
        self.parser = get_parser(self.tool_format)

    async def run(
        self, session: str, messages: list[dict[str, Any]], traj: Trajectory
    ) -> LoopResult:
        """Run the loop on ``traj`` from ``messages``; where ``traj`` already holds turns (a
        branch: a copy of another job's trajectory after a turn), it goes on from the last of
        them, and ``messages`` is ignored for the trajectory's own conversation."""
        tok, cfg = self.tokenizer, self.config
        if not traj.turns:
            schemas = [schema(t) for t in self.tools.values()]
            # Written into as it goes, so the trajectory is complete at every await.
            traj.prompt_ids = encode(tok, render_text(tok, messages, schemas, True))
            traj.messages = messages
        messages = traj.messages
        traj.stop_reason = None  # said when the loop ends; a failure (no backend...) leaves none
        recent: list[str] = []
        for turn in range(len(traj.turns), cfg.max_turns):
            room = cfg.max_context_tokens - len(traj.ids)
            if room <= 0:
                traj.stop_reason = "max_context"
                break
            prompt = traj.next_prompt()
            params = _with_max_tokens(cfg.sampling, min(cfg.max_tokens, room))
            start = time.perf_counter()
            gen = await self.llm.generate(session, prompt, params)
            traj.add_generated(gen.token_ids, gen.logprobs)
            text = tok.decode(gen.token_ids, skip_special_tokens=True)
            parsed = self.parser.parse(text)
            messages.append({"role": "assistant", "content": text})
            record: dict[str, Any] = {
                "turn": turn,
                "backend": gen.backend,
                "prompt_tokens": len(prompt),
                "output_tokens": len(gen.token_ids),
                "cached_tokens": gen.cached_tokens,
                "finish_reason": gen.finish_reason,
                "generate_s": gen.latency_s,
                **policy_version_fields(gen.policy_versions),
                "text": text,
                "content": parsed.content,  # the text around the calls
                "tool_calls": [
                    {"id": c.id, "name": c.name, "arguments": c.arguments} for c in parsed.calls
                ],
                "format_errors": parsed.errors,
                "malformed_tool_calls": len(parsed.errors),
            }
            traj.turns.append(record)
            observations = [{"role": "tool", "content": _format_error(e)} for e in parsed.errors]
            finished = False
            if self.before_tools is not None and any(
                touches_sandbox(self.tools.get(c.name)) for c in parsed.calls
            ):
                await self.before_tools()
            for call in parsed.calls:  # parallel calls run in order
                outcome = await call_tool(self.tools, call.name, call.arguments, self.sandbox)
                observations.append(
                    {
                        "role": "tool",
                        "tool_call_id": call.id,
                        "name": call.name,
                        "content": outcome.observation,
                    }
                )
                if outcome.finish:
                    finished = True
                    record["answer"] = outcome.answer
                    break
            record["tools_s"] = time.perf_counter() - start - gen.latency_s
            if finished:
                traj.stop_reason = "finish"
                return LoopResult("finish", record.get("answer"))
            if not parsed.calls and not parsed.errors:
                # Plain text: the model's answer, or a reply cut at max_tokens before it got to
                # (or through) a tool call, which is the limit's doing, not the model's choice.
                traj.stop_reason = "length" if gen.finish_reason == "length" else "no_tool_call"
                return LoopResult(traj.stop_reason)
            calls = [{"name": c.name, "arguments": c.arguments} for c in parsed.calls]
            action = json.dumps(calls or parsed.errors, sort_keys=True, default=str)
            recent = [*recent[-(cfg.repeat_limit - 1) :], action]
            if len(recent) == cfg.repeat_limit and len(set(recent)) == 1:
                traj.stop_reason = "loop"
                return LoopResult("loop")
            if turn == cfg.max_turns - 1:
                break
            inserted = turn_delta(tok, traj.response_ids, observations)
            if len(traj.ids) + len(inserted) >= cfg.max_context_tokens:
                traj.stop_reason = "max_context"
                break
            traj.add_inserted(inserted)
            messages += observations
            if self.after_turn is not None:
                await self.after_turn(turn + 1, traj)
        traj.stop_reason = traj.stop_reason or "max_turns"
        return LoopResult(traj.stop_reason)


def _format_error(error: str) -> str:
    return (
        f"Format error: {error}. Call tools as"
        ' <tool_call>{"name": ..., "arguments": {...}}</tool_call>.'
    )


def _with_max_tokens(params: SamplingParams, max_tokens: int) -> SamplingParams:
    # No re-validation needed: max_tokens is min(validated max_tokens, room > 0).
    return params.model_copy(update={"max_tokens": max_tokens})
