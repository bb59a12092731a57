"""``countdown``: reach a target number from given numbers, one arithmetic step per turn.

A real multi-turn environment that needs no model: a scripted policy plays it, so the whole
pipeline (and HTTP API) can be exercised end to end on any machine. Each turn the policy combines
two of the numbers it holds with + - * / (exact division, positive results only); the two are
replaced by the result. The episode ends when the target appears, when one number is left, or at
``max_turns``. EVAL replays the recorded moves from the original numbers, so the reward does not
trust anything RUN computed.

Instance (``CountdownInstance``): ``numbers`` (2 to 6 positive integers) and ``target`` (a
positive integer). sampling_params (``CountdownParams``, nothing else): ``temperature`` (0..1,
the chance each turn that the policy explores with a random legal move instead of a solving
one), ``seed`` (makes exploration repeatable) and ``max_turns``.
"""

from __future__ import annotations

import asyncio
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from typing import Annotated, Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, StrictFloat

from raas.judge.reasons import with_reason
from raas.llm.types import WHOLE, Seed
from raas.tasks.protocol import (
    RewardInfo,
    TaskContext,
    TaskInstance,
    TaskJob,
    parse_instance,
    parse_params,
)
from raas.wire import Trajectory

OPS = ("+", "-", "*", "/")
MOVE_RE = re.compile(r"^\s*(\d+)\s*([-+*/])\s*(\d+)\s*$")
SYSTEM_PROMPT = (
    "Reach the target number. Each turn, combine two of your numbers with + - * or / "
    "(exact division, positive results only) by answering 'a op b'; they are replaced by "
    "the result."
)


@dataclass(frozen=True)
class Move:
    a: int
    op: str
    b: int

    def __str__(self) -> str:
        return f"{self.a} {self.op} {self.b}"


def apply(a: int, op: str, b: int) -> int | None:
    """The result of ``a op b``, or None when the rules forbid it."""
    if op == "+":
        return a + b
    if op == "*":
        return a * b
    if op == "-":
        return a - b if a > b else None
    if op == "/":
        return a // b if b > 0 and a % b == 0 else None
    raise ValueError(f"unknown operator {op!r}")


def play(numbers: list[int], move: Move) -> list[int]:
    """The numbers after ``move``; raises ValueError when the move is not legal."""
    pool = list(numbers)
    for n in (move.a, move.b):
        if n not in pool:
            raise ValueError(f"{n} is not among the numbers {sorted(numbers)}")
        pool.remove(n)
    result = apply(move.a, move.op, move.b)
    if result is None:
        raise ValueError(f"{move} is not allowed (results must be positive whole numbers)")
    return [*pool, result]


def legal_moves(numbers: list[int]) -> list[Move]:
    moves = []
    for i, a in enumerate(numbers):
        for j, b in enumerate(numbers):
            if i == j:
                continue
            for op in OPS:
                if op in "+*" and i > j:
                    continue  # commutative: one order is enough
                if apply(a, op, b) is not None:
                    moves.append(Move(a, op, b))
    return moves


@lru_cache(maxsize=65536)
def _solve(pool: tuple[int, ...], target: int, depth: int) -> tuple[Move, ...] | None:
    if target in pool:
        return ()
    if depth == 0:
        return None
    for move in legal_moves(list(pool)):
        rest = _solve(tuple(sorted(play(list(pool), move))), target, depth - 1)
        if rest is not None:
            return (move, *rest)
    return None


def solve(numbers: list[int], target: int) -> list[Move] | None:
    """A shortest sequence of moves reaching ``target`` (iterative deepening), or None."""
    pool = tuple(sorted(numbers))
    for depth in range(len(numbers)):
        plan = _solve(pool, target, depth)
        if plan is not None:
            return list(plan)
    return None


def parse_move(text: object) -> Move:
    # A message's content as a trajectory holds it: text, or whatever a replayed one has.
    m = MOVE_RE.match(text) if isinstance(text, str) else None
    if not m:
        raise ValueError(f"not a move of the form 'a op b': {text!r}")
    return Move(int(m.group(1)), m.group(2), int(m.group(3)))


def generate_instances(n: int, seed: int = 0, size: int = 4) -> list[dict[str, Any]]:
    """``n`` solvable instances: random numbers, target built by random legal moves."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    while len(out) < n:
        numbers = [rng.randint(1, 12) for _ in range(size)]
        pool = list(numbers)
        for _ in range(rng.randint(2, size - 1)):
            pool = play(pool, rng.choice(legal_moves(pool)))
        target = max(pool)
        if target in numbers or target < 10:
            continue
        out.append(
            {
                "data_source": "countdown",
                "instance_id": f"countdown-{seed}-{len(out)}",
                "numbers": numbers,
                "target": target,
            }
        )
    return out


PositiveInt = Annotated[int, Field(strict=True, gt=0), WHOLE]


class CountdownInstance(TaskInstance):
    numbers: list[PositiveInt] = Field(min_length=2, max_length=6)
    target: PositiveInt


class CountdownParams(BaseModel):
    """The only sampling_params countdown takes (its policy is scripted, not a model)."""

    model_config = ConfigDict(frozen=True, extra="forbid", allow_inf_nan=False)

    temperature: StrictFloat = Field(default=0.0, ge=0.0, le=1.0)
    seed: Seed | None = None
    # Each turn consumes a number, so at most 5 turns are ever played; the bound is a sanity one.
    max_turns: Annotated[int, Field(strict=True, ge=1, le=1000), WHOLE] = 8


@dataclass
class CountdownContext(TaskContext):
    numbers: tuple[int, ...] = ()
    target: int = 0
    params: CountdownParams | None = None


class CountdownTask:
    name = "countdown"
    instance_model: ClassVar[type[CountdownInstance]] = CountdownInstance
    params_model: ClassVar[type[CountdownParams]] = CountdownParams

    def _parse(self, job: TaskJob) -> tuple[CountdownInstance, CountdownParams]:
        instance = parse_instance(self.instance_model, job.instance)
        return instance, parse_params(self.params_model, job.sampling_params, self.name)

    def validate(self, job: TaskJob) -> None:
        self._parse(job)

    async def init(self, job: TaskJob) -> CountdownContext:
        instance, params = self._parse(job)
        return CountdownContext(
            job=job, numbers=tuple(instance.numbers), target=instance.target, params=params
        )

    async def run(self, context: TaskContext) -> Trajectory:
        ctx = _as_countdown(context)
        params = ctx.params or self.params_model()
        rng = random.Random(params.seed)
        traj = ctx.trajectory
        pool = list(ctx.numbers)
        traj.messages += [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"Numbers: {pool}. Target: {ctx.target}."},
        ]
        traj.stop_reason = "max_turns"
        for turn in range(params.max_turns):
            moves = legal_moves(pool)
            if not moves:
                traj.stop_reason = "no_moves"
                break
            plan = await asyncio.to_thread(solve, pool, ctx.target)  # 0.3 s unsolvable, 6 numbers
            explored = rng.random() < params.temperature or not plan
            move = rng.choice(moves) if explored or plan is None else plan[0]
            pool = play(pool, move)
            observation = f"{move} = {pool[-1]}. Numbers: {pool}."
            traj.messages += [
                {"role": "assistant", "content": str(move)},
                {"role": "user", "content": observation},
            ]
            traj.turns.append(
                {
                    "turn": turn,
                    "action": str(move),
                    "observation": observation,
                    "explored": explored,
                }
            )
            if ctx.target in pool:
                traj.stop_reason = "finish"
                break
            await asyncio.sleep(0)  # one turn at a time: let cancellation in between turns
        return traj

    async def eval(self, context: TaskContext, trajectory: Trajectory) -> RewardInfo:
        ctx = _as_countdown(context)
        pool = list(ctx.numbers)
        moves = [m["content"] for m in trajectory.messages if m.get("role") == "assistant"]
        for i, text in enumerate(moves):
            try:
                pool = play(pool, parse_move(text))
            except ValueError as e:
                metrics = {"steps": i, "valid": False, "error": f"move {i}: {e}"}
                why = f"move {i + 1} of {len(moves)} is illegal: {e}"
                return RewardInfo(0.0, with_reason(0.0, metrics, why))
        reward = 1.0 if ctx.target in pool else 0.0
        why = (
            f"target {ctx.target} not reached: the numbers left are {sorted(pool)}"
            f" after {len(moves)} move(s)"
            if moves
            else "no moves made"
        )
        return RewardInfo(reward, with_reason(reward, {"steps": len(moves), "valid": True}, why))

    async def cleanup(self, context: TaskContext) -> None:
        return None


def _as_countdown(context: TaskContext) -> CountdownContext:
    if not isinstance(context, CountdownContext):
        raise TypeError(f"countdown got a foreign context: {type(context).__name__}")
    return context
