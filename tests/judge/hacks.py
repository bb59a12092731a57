"""Issue 32's red team: tricks a policy may find to earn reward without solving the task.

This module is the machinery the red-team files share; the tricks are in
``test_reward_hacks_humaneval.py``, ``test_reward_hacks_contest.py``,
``test_reward_hacks_answers.py`` (with its table ``answer_hacks.toml``) and
``test_reward_hacks_harness.py``.

Every attempt goes through its task's own judge, with real bwrap sandboxes: HumanEval and
contest code through ``CodeTask.judge`` on the solution the agent left, math, stem, lookup and
the verl formats through the task's ``artifact`` (the finish tool's answer and the reply, as the
agent loop leaves them) and then its ``judge``, countdown through its ``eval`` of a trajectory,
harness tasks as whole jobs through a pipeline (the agent program is a shell command line). Each
family has controls on the same tasks, gold scoring 1 and an honest wrong answer 0, so that a
judge that scores everything 0 fails the suite too. Each attempt's comment names its trick, and
its test id is its name. SWE's tricks are in test_reward_hacks_swe.py.

The attempts of a family run together, concurrently, in the event loop of a module fixture, and
each test reads its own verdict: the judges are the same as one at a time, and the suite takes
seconds rather than minutes.

No verdict here depends on the machine's speed. An attempt that never ends (``hangs``) is judged
under tiny deadlines and must end on one; every other attempt is judged under deadlines of
minutes and must not: a deadline it reached fails its test, naming the deadline, rather than
passing as the 0 a judge would give (or failing a gold control as a 0).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass, field
from typing import Any

import pytest

import raas.tasks.code
from raas.judge.reasons import REASON_CHARS
from raas.sandbox import BwrapConfig
from raas.tasks.protocol import RewardInfo
from raas.tasks.services import TaskServices
from raas.wire import PASS_REWARD

# Tiny limits for the attempts that never end (a sleep of an hour, a stopped parent, a daemon
# that holds the case's output for more than CASE_TIMEOUT_S), so that each costs the suite a
# second or two: the judges' own deadlines are what is tried, not their length.
TEST_TIMEOUT_S = 2.0
CASE_TIMEOUT_S = 1.0
# Every other attempt ends by itself: limits of minutes, so that a slow or loaded machine never
# decides its verdict.
GENEROUS_S = 300.0
CONCURRENCY = 4
# The harness family's agents end by themselves in seconds: minutes, so that a loaded machine
# never makes a gold agent's 0 (nor a trick's), and a job that reaches it fails as a timeout
# (assert_reward).
AGENT_TIMEOUT_S = 300.0


class NoModel:
    """The judges need no model: a task that asked one would fail here."""

    async def generate(self, *args: Any) -> Any:
        raise AssertionError("a judge asked for a generation")

    def release(self, session: str) -> None:
        pass


Outcome = RewardInfo | BaseException
Run = Callable[[TaskServices], Awaitable[RewardInfo]]


def run_family(runs: dict[str, Run], hanging: Collection[str] = ()) -> dict[str, Outcome]:
    """Every attempt of a family, a few at a time, each with the same fresh TaskServices (real
    bwrap sandboxes, a warm pool); an attempt that raises has that exception as its outcome.
    The code judges' limits are generous; the attempts named in ``hanging`` run after the
    others, under tiny ones."""

    async def go(patch: pytest.MonkeyPatch) -> dict[str, Outcome]:
        services = TaskServices(llm=NoModel(), sandbox_config=BwrapConfig(), warm_sandboxes=2)
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(run: Run) -> Outcome:
            async with gate:
                try:
                    return await run(services)
                except Exception as e:  # the verdict is that it raised
                    return e

        outcomes: dict[str, Outcome] = {}
        try:
            for tier in (False, True):
                test_s, case_s = (TEST_TIMEOUT_S, CASE_TIMEOUT_S) if tier else (GENEROUS_S,) * 2
                patch.setattr(raas.tasks.code, "TEST_TIMEOUT_S", test_s)
                patch.setattr(raas.tasks.code, "CASE_TIMEOUT_S", case_s)
                patch.setattr(raas.tasks.code, "CONTEST_TIMEOUT_S", 4 * case_s)
                names = [name for name in runs if (name in hanging) is tier]
                results = await asyncio.gather(*(one(runs[name]) for name in names))
                outcomes.update(zip(names, results, strict=True))
        finally:
            await services.close()
        return {name: outcomes[name] for name in runs}

    with pytest.MonkeyPatch.context() as patch:
        return asyncio.run(go(patch))


def run_attempts(
    attempts: list[Attempt], judged: Callable[[dict[str, Any]], Run]
) -> dict[str, Outcome]:
    """``run_family`` on a family's attempts, those that hang marked so."""
    runs = {a.name: judged(a.given) for a in attempts}
    return run_family(runs, hanging={a.name for a in attempts if a.hangs})


def deadline_reached(metrics: dict[str, Any], test_timeout_s: float) -> str | None:
    """What deadline the job or its judging ended on, as its metrics say, or None."""
    failure = metrics.get("failure")
    why = str(failure.get("why", "")) if isinstance(failure, dict) else ""
    if "timed out" in why or "took more than" in why:
        return why
    if metrics.get("timed_out"):
        return f"the tests ran out of their {test_timeout_s:g}s"
    if metrics.get("stop_reason") == "agent_timeout":
        return f"the agent ran out of its {AGENT_TIMEOUT_S:g}s"
    return None


def assert_reward(outcome: Outcome, attempt: Attempt) -> None:
    if isinstance(outcome, BaseException):
        raise AssertionError(f"the judge raised instead of judging: {outcome!r}") from outcome
    metrics = {k: v for k, v in outcome.metrics.items() if k != "artifact"}
    shown = str(metrics)[:1500]
    deadline = deadline_reached(metrics, TEST_TIMEOUT_S if attempt.hangs else GENEROUS_S)
    if attempt.hangs:
        assert deadline is not None, (
            f"an attempt that never ends ended before its deadline: {shown}"
        )
    else:
        # A deadline is the machine's verdict, not the judge's: fail, saying so.
        assert deadline is None, f"timed out ({deadline}), so no verdict of the judge: {shown}"
    want = attempt.want
    assert outcome.reward == want, f"reward {outcome.reward}, not {want}: {shown}"
    # Whatever the trick, a reward below a pass says why in one short line; a pass says nothing.
    reason = metrics.get("reason")
    if want < PASS_REWARD:
        assert isinstance(reason, str) and 0 < len(reason) <= REASON_CHARS, f"no reason: {shown}"
        assert "\n" not in reason, reason
    else:
        assert reason is None, f"a pass with a reason: {shown}"


@dataclass(frozen=True)
class Attempt:
    """One try: its name (the test id), the reward it must get, and what it gives the judge."""

    name: str
    want: float
    given: dict[str, Any] = field(default_factory=dict)
    gap: str | None = None  # a known way it does not get ``want`` yet (a strict xfail)
    hangs: bool = False  # it never ends: its 0 must be the judge's deadline (kept tiny)


def params(attempts: list[Attempt]) -> list[Any]:
    names = [a.name for a in attempts]
    assert len(names) == len(set(names)), "two attempts of a family share a name"
    return [
        pytest.param(a, id=a.name, marks=[pytest.mark.xfail(reason=a.gap, strict=True)])
        if a.gap
        else pytest.param(a, id=a.name)
        for a in attempts
    ]
