"""The oracle tier (make test-oracle): every bundled task through a real `raas serve` (real bwrap
sandboxes, real HTTP) with the oracle policy, once gold and once sabotaged.

Two oracles (``raas.oracle``: a vLLM-protocol server answering gold tool-call trajectories) run
here, one that never sabotages and one that always does, each behind its own `raas serve`
process. Every gold trajectory must score 1.0 and every sabotaged one 0.0, with the judge's
metrics showing what the sabotage broke (the failing test, the patch that did not apply, the
wrong answer or the two values read), not only the reward; a task that does not is listed,
with why. The token bookkeeping of every multi-turn trajectory is checked against
what the oracle really generated: loss_mask 1 exactly on generated tokens, their logprobs in
place, and prompt_ids + response_ids equal to the last prompt plus the last output.

A small sample (a few tasks of each kind, every kind of sabotage) runs in the default suite.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from raas.client import RolloutClient
from raas.client.task_files import run_requests
from raas.judge.answers import check_math
from raas.launch import ServerProcess
from raas.llm.models import load_tokenizer
from raas.oracle import sabotage
from raas.oracle.app import oracle_app
from raas.oracle.catalogue import SETS, GoldTask, gold_tasks
from raas.oracle.model import Oracle
from raas.oracle.sabotage import SABOTAGES, sabotage_of
from raas.wire import RolloutRequest, RolloutResult
from tests.support.llm_servers import ServerThread

DEADLINE_S = 1800.0  # a safety net for a broken run, never an assertion on speed


@dataclass
class Side:
    """One oracle and the `raas serve` in front of it."""

    oracle: Oracle
    backend: ServerThread
    server: ServerProcess


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Side]]:
    tmp = tmp_path_factory.mktemp("oracle")
    tokenizer = load_tokenizer("oracle")
    made: dict[str, Side] = {}
    try:
        for name, fraction in (("gold", 0.0), ("sabotaged", 1.0)):
            oracle = Oracle(tokenizer, sabotage=fraction, seed=0)
            backend = ServerThread(oracle_app(oracle)).start()
            # Three attempts: a rare infra failure (a sandbox that did not start) is no verdict.
            args = [
                "--llm",
                backend.url,
                "--tokenizer",
                "oracle",
                "--run-workers",
                "8",
                "--max-attempts",
                "3",
            ]
            server = ServerProcess(tmp / f"{name}.db", tmp / f"{name}.log", args)
            made[name] = Side(oracle, backend, server)
            server.wait_ready()
        yield made
    finally:
        for side in made.values():
            side.server.stop()
            side.backend.stop()


def expected_reward(side: str) -> float:
    return 1.0 if side == "gold" else 0.0


def problems_of(result: RolloutResult, oracle: Oracle, want: float) -> list[str]:
    """Everything wrong with one rollout: its reward, and its token bookkeeping."""
    if result.state != "done":
        error = result.error.message if result.error else ""
        return [f"{result.state} ({result.stage_failed}): {error[:300]}"]
    found = []
    if result.reward != want:
        metrics = {k: v for k, v in result.metrics.items() if k != "artifact"}
        found.append(f"reward {result.reward}, not {want}: {str(metrics)[:600]}")
    found += bookkeeping_problems(result, oracle)
    return found


def _stem_wrong(task: GoldTask, metrics: dict[str, Any]) -> bool:
    """The judge read the wrong letter, or the number five tolerances off, that was given."""
    instance = task.instance
    if isinstance(instance.get("choices"), dict):
        return bool(
            metrics["read"] == sabotage.wrong_letter(task.solution, list(instance["choices"]))
        )
    off = sabotage.off_by_tolerance(float(task.solution), float(instance.get("rel_tol", 0.01)))
    return bool(metrics["read"] == [float(off)])


def _stem_hedge(task: GoldTask, metrics: dict[str, Any]) -> bool:
    """The judge read no one letter, or two numbers."""
    if isinstance(task.instance.get("choices"), dict):
        return metrics["read"] is None
    return len(metrics["read"]) == 2


def _some_test_failed(metrics: dict[str, Any]) -> bool:
    return any(outcome != "ok" for outcome in metrics.get("FAIL_TO_PASS", {}).values())


# What each way of sabotage leaves in the judge's metrics when it took effect.
EVIDENCE: dict[tuple[str, str], Callable[[GoldTask, dict[str, Any]], bool]] = {
    # the tests ran, and one of them failed on a value the wrapped function returned
    ("code", "wrong_value"): lambda t, m: "AssertionError" in m.get("test_output", ""),
    ("code", "syntax_error"): lambda t, m: "SyntaxError" in m.get("test_output", ""),
    ("code", "exit_early"): lambda t, m: "SystemExit" in m.get("test_output", ""),
    # the patch did not apply in the agent's sandbox: no change reached the judge, the bug stayed
    ("swe", "broken_patch"): lambda t, m: m.get("patch_bytes") == 0 and _some_test_failed(m),
    ("swe", "wrong_fix"): lambda t, m: bool(m.get("patch_applied")) and _some_test_failed(m),
    # the edited test files were put back, and the failing tests failed again
    ("swe", "edit_tests"): lambda t, m: bool(m.get("dropped")) and _some_test_failed(m),
    # the answer judged is the sabotaged value (the right one plus 1)
    ("math", "wrong_value"): lambda t, m: check_math(
        m["artifact"]["answer"], sabotage.wrong_number(t.solution)
    ),
    ("math", "hedge"): lambda t, m: str(m.get("read", "")).startswith("not one value"),
    ("stem", "wrong_value"): _stem_wrong,
    ("stem", "hedge"): _stem_hedge,
}


def sabotage_problems(task: GoldTask, way: str, result: RolloutResult) -> list[str]:
    """Whether the judge's metrics show that the sabotage took effect, not only a reward of 0."""
    if result.state != "done":
        return []  # problems_of says so
    metrics = dict(result.metrics)
    try:
        shown = EVIDENCE[(task.kind, way)](task, metrics)
    except (KeyError, TypeError, ValueError):
        shown = False
    if shown:
        return []
    metrics.pop("artifact", None)
    return [f"the metrics do not show the {way} sabotage: {str(metrics)[:600]}"]


def bookkeeping_problems(result: RolloutResult, oracle: Oracle) -> list[str]:
    """The trajectory against the oracle's own record of what it generated for this task."""
    traj = result.trajectory
    ids = traj.prompt_ids + traj.response_ids
    if not len(traj.response_ids) == len(traj.loss_mask) == len(traj.logprobs):
        return ["response_ids, loss_mask and logprobs differ in length"]
    # The generations of this rollout: those whose prompt the trajectory starts with (an earlier
    # attempt's first turn has the same prompt, and the oracle the same answer).
    generated = {}
    for gen in oracle.generations(str(result.instance_id)):
        if ids[: len(gen.prompt_token_ids)] == gen.prompt_token_ids:
            generated[len(gen.prompt_token_ids)] = gen
    gens = [generated[n] for n in sorted(generated)]
    if len(gens) != len(traj.turns):
        return [f"{len(traj.turns)} turns but {len(gens)} generations of the oracle match"]
    found = []
    mask = [0] * len(traj.response_ids)
    start = len(traj.prompt_ids)
    for turn, gen in zip(traj.turns, gens, strict=True):
        at, end = len(gen.prompt_token_ids), len(gen.prompt_token_ids) + len(gen.token_ids)
        if ids[at:end] != gen.token_ids:
            found.append(f"turn {turn['turn']}: the tokens are not those the oracle generated")
        if traj.logprobs[at - start : end - start] != gen.logprobs:
            found.append(f"turn {turn['turn']}: the logprobs are not the oracle's, in place")
        if (turn["prompt_tokens"], turn["output_tokens"]) != (at, len(gen.token_ids)):
            found.append(f"turn {turn['turn']}: the turn record's token counts are off")
        mask[at - start : end - start] = [1] * len(gen.token_ids)
    if traj.loss_mask != mask:
        found.append("loss_mask is not 1 exactly on the tokens the oracle generated")
    if any(lp != 0.0 for lp, m in zip(traj.logprobs, mask, strict=True) if not m):
        found.append("an inserted token has a logprob")
    last = gens[-1] if gens else None
    if last is not None and ids != last.prompt_token_ids + last.token_ids:
        found.append("prompt_ids + response_ids is not the last prompt plus the last output")
    return found


async def run_side(side: Side, tasks: list[GoldTask], tag: str) -> list[RolloutResult]:
    run = uuid.uuid4().hex[:8]  # the servers live for the module: ids of their own a run
    requests = [
        RolloutRequest.model_validate({"instance": t.instance, "job_id": f"{tag}-{run}-{i}"})
        for i, t in enumerate(tasks)
    ]
    async with RolloutClient(side.server.url) as client:
        return await asyncio.wait_for(run_requests(client, requests), DEADLINE_S)


def run_both(sides: dict[str, Side], tasks: dict[str, list[GoldTask]]) -> dict[str, Any]:
    """Run ``tasks[side]`` on each side; the failures, per-kind counts and the wall time."""

    async def go() -> list[list[RolloutResult]]:
        return list(
            await asyncio.gather(*(run_side(sides[s], tasks[s], s) for s in ("gold", "sabotaged")))
        )

    start = time.perf_counter()
    gold, sabotaged = asyncio.run(go())
    wall = time.perf_counter() - start
    failures: list[str] = []
    retried: list[str] = []  # infra failures (no verdict on the task), run again
    passed: Counter[str] = Counter()
    total: Counter[str] = Counter()
    for name, results in (("gold", gold), ("sabotaged", sabotaged)):
        side = sides[name]
        for task, result in zip(tasks[name], results, strict=True):
            key = f"{task.kind} {name}"
            total[key] += 1
            retried += [f"{task.instance_id} ({name}): {e.message}" for e in result.attempt_errors]
            problems = problems_of(result, side.oracle, expected_reward(name))
            way = side.oracle.way(task)
            if way is not None:
                problems += sabotage_problems(task, way, result)
            if problems:
                label = f"{task.instance_id} ({name}{': ' + way if way else ''})"
                failures += [f"{label}: {p}" for p in problems]
            else:
                passed[key] += 1
    return {
        "failures": failures,
        "retried": retried,
        "passed": passed,
        "total": total,
        "wall_s": wall,
    }


def report(outcome: dict[str, Any]) -> str:
    lines = [
        f"{key}: {outcome['passed'][key]}/{n} as expected" for key, n in outcome["total"].items()
    ]
    lines.append(f"{sum(outcome['total'].values())} rollouts in {outcome['wall_s']:.0f} s")
    lines += [f"run again after an infra failure: {r}" for r in outcome["retried"]]
    return "\n".join(lines)


def check(outcome: dict[str, Any]) -> None:
    print("\n" + report(outcome))
    failures = outcome["failures"]
    assert not failures, f"{len(failures)} problems:\n" + "\n".join(failures)


@pytest.mark.oracle
@pytest.mark.parametrize("bundled_set", list(SETS))
def test_every_bundled_task_gold_scores_one_and_sabotaged_zero(
    sides: dict[str, Side], bundled_set: str
) -> None:
    tasks = gold_tasks(bundled_set)
    check(run_both(sides, {"gold": tasks, "sabotaged": tasks}))


def sample() -> dict[str, list[GoldTask]]:
    """Two gold tasks of each kind; for sabotage, the first task of each kind of sabotage."""
    gold: list[GoldTask] = []
    sabotaged: list[GoldTask] = []
    probe = Oracle(load_tokenizer("oracle"), sabotage=1.0, seed=0)
    for name, kind in SETS.items():
        tasks = gold_tasks(name)
        gold += tasks[:2]
        for way in SABOTAGES[kind]:
            sabotaged.append(next(t for t in tasks if probe.way(t) == way))
    return {"gold": gold, "sabotaged": sabotaged}


def test_a_sample_of_each_kind_gold_scores_one_and_sabotaged_zero(
    sides: dict[str, Side],
) -> None:
    check(run_both(sides, sample()))


def test_the_sample_covers_every_way_of_sabotage() -> None:
    tasks = sample()
    probe = Oracle(load_tokenizer("oracle"), sabotage=1.0, seed=0)
    ways = {(t.kind, probe.way(t)) for t in tasks["sabotaged"]}
    # The image sets' sabotage (harbor's no-op) runs in the images tier, beside their images.
    kinds = set(SETS.values())
    assert ways == {(k, way) for k, all_ways in SABOTAGES.items() if k in kinds for way in all_ways}
    assert {t.kind for t in tasks["gold"]} == set(SETS.values())


@pytest.mark.oracle
def test_the_oracle_demo_scores_its_sabotage_zero(tmp_path: Path) -> None:
    """raas demo --oracle --sabotage 0.5: the engine, a service, the demo set; the rewards are
    1.0 but where the oracle answered wrong on purpose."""
    from raas.demo import run_demo

    assert run_demo("oracle", workdir=tmp_path, engine_args=["--sabotage", "0.5"]) == 0
    results = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    want = [
        0.0 if sabotage_of(r["data_source"], r["instance_id"], 0.5, 0) else 1.0 for r in results
    ]
    assert [r["reward"] for r in results] == want and 0.0 in want and 1.0 in want


class OracleGenerator:
    """The oracle in-process, as the agent loop's LLM."""

    def __init__(self, oracle: Oracle) -> None:
        self.oracle = oracle

    async def generate(self, session: str, prompt_ids: list[int], params: Any) -> Any:
        from raas.llm.types import Generation

        out = self.oracle.generate(prompt_ids, params.max_tokens, frozenset(params.stop_token_ids))
        return Generation(out.token_ids, out.logprobs, out.finish_reason, backend="oracle")


async def test_the_bookkeeping_check_catches_a_misplaced_mask_or_logprob() -> None:
    """The tier's check of the tokens, on a trajectory of the real loop (stem: no sandbox)."""
    from raas.agent.loop import AgentLoop, LoopConfig
    from raas.agent.tools import select_tools
    from raas.oracle.catalogue import HANDLERS
    from raas.wire import Trajectory

    oracle = Oracle(load_tokenizer("oracle"))
    task = gold_tasks("stem")[0]
    handler = HANDLERS["stem"]
    loop = AgentLoop(
        OracleGenerator(oracle),
        oracle.tokenizer,
        select_tools(list(handler.tools)),
        None,
        LoopConfig(),
    )
    traj = Trajectory()
    await loop.run("s", handler.messages(task.instance), traj)
    result = RolloutResult.model_validate(
        {
            "job_id": "s",
            "state": "done",
            "reward": 1.0,
            "instance_id": task.instance_id,
            "trajectory": traj.model_dump(),
            "data_source": "stem",
            "timing": {"queue_s": 0, "init_s": 0, "run_s": 0, "eval_s": 0, "total_s": 0},
        }
    )
    assert problems_of(result, oracle, 1.0) == []
    assert problems_of(result, oracle, 0.0)[0].startswith("reward 1.0, not 0.0")
    masked = result.model_copy(deep=True)
    masked.trajectory.loss_mask[0] = 0
    assert "loss_mask is not 1 exactly" in " ".join(bookkeeping_problems(masked, oracle))
    shifted = result.model_copy(deep=True)
    shifted.trajectory.logprobs = shifted.trajectory.logprobs[1:] + [0.0]
    assert "logprobs are not the oracle's" in " ".join(bookkeeping_problems(shifted, oracle))


def test_the_evidence_check_wants_the_sabotage_in_the_metrics() -> None:
    """A sabotaged rollout scoring 0 is not enough: its metrics must show why."""

    def result(metrics: dict[str, Any]) -> RolloutResult:
        timing = {"queue_s": 0, "init_s": 0, "run_s": 0, "eval_s": 0, "total_s": 0}
        return RolloutResult.model_validate(
            {
                "job_id": "s",
                "state": "done",
                "reward": 0.0,
                "metrics": metrics,
                "timing": timing,
                "trajectory": {},
                "data_source": "math",
            }
        )

    math = gold_tasks("math")[0]
    hedged = result({"correct": False, "read": "not one value: {48, 49}"})
    assert sabotage_problems(math, "hedge", hedged) == []
    read_one = result({"correct": False, "read": "48"})  # a hedge read as one value
    assert "do not show the hedge sabotage" in sabotage_problems(math, "hedge", read_one)[0]
    wrong = sabotage.wrong_number(math.solution)
    assert sabotage_problems(math, "wrong_value", result({"artifact": {"answer": wrong}})) == []
    assert sabotage_problems(math, "wrong_value", result({"artifact": {"answer": "x"}}))
    code = gold_tasks("humaneval")[0]
    syntax = result({"test_output": "the solution failed: SyntaxError: '(' was never closed"})
    assert sabotage_problems(code, "syntax_error", syntax) == []
    assert sabotage_problems(code, "wrong_value", syntax)  # no test ran to fail
