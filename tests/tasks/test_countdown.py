"""The countdown task: rules, solver, scripted policy and an EVAL that trusts nothing of RUN."""

from __future__ import annotations

import pytest

from raas.tasks import InvalidInstance, TaskJob
from raas.tasks.countdown import (
    CountdownTask,
    Move,
    generate_instances,
    legal_moves,
    parse_move,
    play,
    solve,
)
from raas.wire import Trajectory


def job(instance: dict[str, object], **params: object) -> TaskJob:
    return TaskJob("j", {"data_source": "countdown", **instance}, dict(params))


def test_rules() -> None:
    assert play([3, 5, 7], Move(5, "-", 3)) == [7, 2]
    assert play([6, 3], Move(6, "/", 3)) == [2]
    with pytest.raises(ValueError, match="not allowed"):
        play([3, 5], Move(3, "-", 5))
    with pytest.raises(ValueError, match="not allowed"):
        play([7, 2], Move(7, "/", 2))
    with pytest.raises(ValueError, match="not among"):
        play([3, 5], Move(3, "+", 3))
    assert Move(5, "+", 3) not in legal_moves([3, 5])  # one order of a commutative move
    assert parse_move(" 12 * 3 ") == Move(12, "*", 3)
    with pytest.raises(ValueError):
        parse_move("12 ^ 3")


def test_solver_finds_a_shortest_plan() -> None:
    assert solve([3, 4, 100], 7) == [Move(3, "+", 4)]
    plan = solve([2, 3, 5], 25)
    assert plan is not None and len(plan) == 2
    assert solve([1, 1], 5) is None


def test_generated_instances_are_solvable_and_repeatable() -> None:
    instances = generate_instances(20, seed=7)
    assert instances == generate_instances(20, seed=7)
    for inst in instances:
        assert inst["target"] not in inst["numbers"]
        assert solve(inst["numbers"], inst["target"]) is not None


async def test_greedy_policy_always_solves_and_exploration_varies() -> None:
    task = CountdownTask()
    rewards = []
    for inst in generate_instances(12, seed=5):
        ctx = await task.init(job(inst, temperature=0.0))
        traj = await task.run(ctx)
        rewards.append((await task.eval(ctx, traj)).reward)
        assert traj.stop_reason == "finish"
    assert rewards == [1.0] * 12
    explored = []
    for i, inst in enumerate(generate_instances(12, seed=5)):
        ctx = await task.init(job(inst, temperature=1.0, seed=i))
        explored.append((await task.eval(ctx, await task.run(ctx))).reward)
    assert 0.0 in explored


async def test_eval_replays_moves_and_rejects_illegal_ones() -> None:
    task = CountdownTask()
    ctx = await task.init(job({"numbers": [3, 4, 100], "target": 7}))
    good = Trajectory(messages=[{"role": "assistant", "content": "3 + 4"}])
    forged = Trajectory(messages=[{"role": "assistant", "content": "5 + 2"}])
    short = Trajectory(messages=[{"role": "assistant", "content": "100 - 4"}])
    assert (await task.eval(ctx, good)).reward == 1.0
    bad = await task.eval(ctx, forged)
    assert bad.reward == 0.0 and bad.metrics["valid"] is False
    assert "5 is not among" in bad.metrics["error"]
    assert (await task.eval(ctx, short)).reward == 0.0


@pytest.mark.parametrize(
    ("instance", "params", "field"),
    [
        ({"numbers": [1], "target": 2}, {}, "instance.numbers"),
        ({"numbers": [1, -2], "target": 2}, {}, "instance.numbers.1"),
        ({"numbers": [1, 2.5], "target": 2}, {}, "instance.numbers.1"),
        ({"numbers": [1, 2], "target": True}, {}, "instance.target"),
        ({"numbers": [1, 2], "target": 3}, {"max_turns": 2.5}, "sampling_params.max_turns"),
        ({"numbers": [1, 2], "target": 3}, {"seed": 2**63}, "sampling_params.seed"),
        ({"numbers": [1, 2], "target": 3}, {"seed": float("inf")}, "sampling_params.seed"),
        ({"numbers": [1, 2], "target": "3"}, {}, "instance.target"),
        ({"numbers": [1, 2], "target": 3}, {"top_k": 5}, "sampling_params.top_k"),
        ({"numbers": [1, 2], "target": 3}, {"temperature": 2}, "sampling_params.temperature"),
        ({"numbers": [1, 2], "target": 3}, {"max_turns": 0}, "sampling_params.max_turns"),
    ],
)
def test_validation_names_the_field(
    instance: dict[str, object], params: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInstance) as exc:
        CountdownTask().validate(job(instance, **params))
    assert exc.value.field == field


async def test_a_reward_below_a_pass_says_why_and_a_pass_says_nothing() -> None:
    task = CountdownTask()
    ctx = await task.init(job({"numbers": [3, 4, 100], "target": 7}))

    def moves(*texts: str) -> Trajectory:
        return Trajectory(messages=[{"role": "assistant", "content": t} for t in texts])

    solved = await task.eval(ctx, moves("3 + 4"))
    assert solved.reward == 1.0 and "reason" not in solved.metrics
    short = await task.eval(ctx, moves("100 - 4"))
    assert short.metrics["reason"] == (
        "target 7 not reached: the numbers left are [3, 96] after 1 move(s)"
    )
    illegal = await task.eval(ctx, moves("3 + 4", "7 ^ 2"))
    assert illegal.metrics["reason"] == (
        "move 2 of 2 is illegal: not a move of the form 'a op b': '7 ^ 2'"
    )
    assert (await task.eval(ctx, moves())).metrics["reason"] == "no moves made"
