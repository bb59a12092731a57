"""Rollout metrics for trainers (raas.client.metrics): computed from real results of the real
pipeline (agent rollouts in bwrap sandboxes with a scripted model, and failures of every kind),
written to TensorBoard and read back with TensorBoard's own reader, and to an offline W&B run
read back from its transaction log."""

from __future__ import annotations

import asyncio
import glob
import math
import struct
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from raas.client import Group, MetricsLogger, RolloutResult, dapo_metrics, rollout_metrics
from raas.client.dapo import DapoReport
from raas.llm.models import load_tokenizer
from raas.pipeline import JobRequest, Pipeline, PipelineConfig
from raas.sandbox import BwrapConfig
from raas.store.sqlite import ResultStore
from raas.tasks import TaskRegistry
from raas.tasks.math import MathTask
from raas.tasks.services import TaskServices
from tests.support.policies import ScriptedPolicy, call
from tests.support.probe import WAIT_S, ProbeTask, probe_instance

FOUR = {"data_source": "math", "problem": "What is 2 + 2?", "answer": "4"}
EIGHT = {"data_source": "math", "problem": "What is 3 + 5?", "answer": "8"}
# Three groups of a batch: each job's instance, request options and scripted turns.
PLAN: dict[str, list[tuple[str, dict[str, Any], dict[str, Any], list[str]]]] = {
    "four": [
        ("four-0", FOUR, {}, [call("finish", answer="4")]),
        ("four-1", FOUR, {}, [call("finish", answer="4")]),
    ],
    "eight": [
        ("eight-0", EIGHT, {}, [call("finish", answer="8")]),
        # writes a call that cannot be read, and runs out of turns: no answer, reward 0
        (
            "eight-1",
            EIGHT,
            {"sampling_params": {"max_turns": 1}},
            ["<tool_call>{think</tool_call>"],
        ),
    ],
    "probe": [
        ("probe-init", probe_instance(init="raise"), {}, []),  # infra, in INIT
        ("probe-policy", probe_instance(run="policy"), {}, []),  # policy, in RUN
        ("probe-ok", probe_instance(), {}, []),  # done, reward 0.5
        ("probe-slow", probe_instance(run="block"), {"timeout_s": 0.3}, []),  # timeout
    ],
}


async def _run_plan(db: Path) -> dict[str, list[RolloutResult]]:
    scripts = {job: turns for group in PLAN.values() for job, _, _, turns in group}
    policy = ScriptedPolicy(load_tokenizer("smollm2"), scripts)
    services = TaskServices(llm=policy, sandbox_config=BwrapConfig())
    registry = TaskRegistry()
    registry.register(MathTask())
    registry.register(ProbeTask())
    store = ResultStore(db)
    await store.open()
    pipeline = Pipeline(
        registry,
        store,
        PipelineConfig(job_timeout_s=120, cancel_grace_s=0.05, max_attempts=1),
        services=services,
    )
    await pipeline.start()
    try:
        requests = [
            JobRequest.of(instance, job_id=job, **options)
            for group in PLAN.values()
            for job, instance, options, _ in group
        ]
        await pipeline.submit(requests)
        groups: dict[str, list[RolloutResult]] = {}
        for name, group in PLAN.items():
            for job, *_ in group:
                view = await pipeline.wait(job, WAIT_S * 6)
                assert view is not None and view.result is not None, view
                groups.setdefault(name, []).append(view.result)
        return groups
    finally:
        await pipeline.stop(grace_s=0)
        await services.close()
        await store.close()


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[RolloutResult]]:
    return asyncio.run(_run_plan(tmp_path_factory.mktemp("metrics") / "raas.db"))


def test_the_plan_ran_as_planned(groups: dict[str, list[RolloutResult]]) -> None:
    got = {
        r.job_id: (r.state, r.reward, r.error.kind if r.error else None)
        for g in groups.values()
        for r in g
    }
    assert got == {
        "four-0": ("done", 1.0, None),
        "four-1": ("done", 1.0, None),
        "eight-0": ("done", 1.0, None),
        "eight-1": ("done", 0.0, None),
        "probe-init": ("failed", None, "infra"),
        "probe-policy": ("failed", None, "policy"),
        "probe-ok": ("done", 0.5, None),
        "probe-slow": ("timeout", None, "policy"),
    }


def test_metrics_of_a_batch_with_failures(groups: dict[str, list[RolloutResult]]) -> None:
    results = [r for g in groups.values() for r in g]
    m = rollout_metrics(results)
    assert m["rollout/count"] == 8
    assert m["rollout/state/done"] == 5 / 8
    assert m["rollout/state/failed"] == 2 / 8
    assert m["rollout/state/timeout"] == 1 / 8
    assert m["rollout/state/cancelled"] == 0.0
    assert m["rollout/error_kind/infra"] == 1 / 8
    assert m["rollout/error_kind/policy"] == 2 / 8
    assert m["rollout/stage_failed/init"] == 1 / 8
    assert m["rollout/stage_failed/run"] == 2 / 8
    assert m["rollout/stage_failed/eval"] == 0.0
    types = {k: v for k, v in m.items() if k.startswith("rollout/error_type/")}
    assert sum(types.values()) == 3 / 8 and len(types) >= 2  # RuntimeError, PolicyError, timeout
    assert m["rollout/stop_reason/finish"] == 4 / 8  # three math answers and the probe
    assert m["rollout/stop_reason/max_turns"] == 1 / 8
    # rewards over the five scored rollouts: 1, 1, 1, 0, 0.5 (failures are not zeros)
    assert m["rollout/reward_mean"] == pytest.approx(0.7)
    assert m["rollout/reward_std"] == pytest.approx(math.sqrt(0.16))
    assert (m["rollout/reward_min"], m["rollout/reward_max"]) == (0.0, 1.0)
    assert m["rollout/pass_rate"] == pytest.approx(3 / 5)
    # lengths from the agent rollouts' real token ids
    agent = groups["four"] + groups["eight"]
    assert m["rollout/prompt_tokens_max"] == max(len(r.trajectory.prompt_ids) for r in agent)
    assert m["rollout/prompt_tokens_max"] > 50  # the system prompt and tool schemas
    assert m["rollout/generated_tokens_mean"] > 0
    assert m["rollout/turns_max"] == 2  # the probe's two recorded turns
    # one tool call could not be read (eight-1's), over the rollouts with turns
    with_turns = sum(bool(r.trajectory.turns) for r in results)
    assert m["rollout/malformed_tool_calls_mean"] == m["rollout/malformed_tool_calls_frac"]
    assert m["rollout/malformed_tool_calls_frac"] == pytest.approx(1 / with_turns)
    malformed = {r.job_id: r.metrics.get("malformed_tool_calls") for r in agent}
    assert malformed == {"four-0": 0, "four-1": 0, "eight-0": 0, "eight-1": 1}
    assert m["rollout/attempts_mean"] == 1.0
    for stage in ("queue", "init", "run", "eval", "total"):
        assert m[f"rollout/time/{stage}_s_mean"] >= 0
    assert m["rollout/time/total_s_max"] >= m["rollout/time/total_s_mean"] > 0
    assert m["rollout/time/generate_s_mean"] >= 0 and "rollout/time/tools_s_mean" in m
    assert all(isinstance(v, float) and math.isfinite(v) for v in m.values())
    assert "rollout/groups" not in m  # a flat batch has no groups


def test_group_metrics_and_every_input_shape(groups: dict[str, list[RolloutResult]]) -> None:
    objects = [Group({"name": k}, results=v) for k, v in groups.items()]
    lists = [[r.model_dump(mode="json") for r in g] for g in groups.values()]
    m = rollout_metrics(objects)
    assert rollout_metrics(lists) == m  # dicts as the JSON holds them, in plain lists
    assert m["rollout/groups"] == 3
    # four: rewards 1, 1 (no signal); eight: 1, 0; probe: one scored rollout (not counted)
    assert m["rollout/group_zero_std_frac"] == 0.5
    assert m["rollout/group_reward_std_mean"] == pytest.approx(math.sqrt(0.5) / 2)
    assert m["rollout/group_solved_frac"] == pytest.approx(2 / 3)
    assert m["rollout/count"] == 8 and m["rollout/reward_mean"] == pytest.approx(0.7)


def test_a_batch_of_failures_only_has_no_reward_statistics(
    groups: dict[str, list[RolloutResult]],
) -> None:
    failed = [r for r in groups["probe"] if r.state != "done"]
    m = rollout_metrics(failed, prefix="train/")
    assert m["train/count"] == 3 and m["train/state/done"] == 0.0
    assert not any(k.startswith("train/reward") or k == "train/pass_rate" for k in m)
    assert rollout_metrics([]) == {"rollout/count": 0.0}


def test_a_mix_of_results_and_groups_is_refused(groups: dict[str, list[RolloutResult]]) -> None:
    with pytest.raises(TypeError, match="not a mix"):
        rollout_metrics([groups["four"][0], groups["eight"]])


def _tensorboard_scalars(directory: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.plugin_event_accumulator import EventAccumulator
    from tensorboard.util.tensor_util import make_ndarray

    reader = EventAccumulator(str(directory))
    reader.Reload()
    return {
        tag: [(e.step, float(make_ndarray(e.tensor_proto))) for e in reader.Tensors(tag)]
        for tag in reader.Tags()["tensors"]
    }


def test_tensorboard_events_read_back(
    groups: dict[str, list[RolloutResult]], tmp_path: Path
) -> None:
    report = DapoReport(prompts_submitted=5, groups_kept=3, wall_s=1.5)
    with MetricsLogger(tensorboard_dir=tmp_path / "tb") as logger:
        assert logger.sinks == ["tensorboard"]
        first = logger.log(list(groups.values()), step=1, report=report, extra={"train/loss": 0.25})
        second = logger.log(groups["four"], step=2)
    scalars = _tensorboard_scalars(tmp_path / "tb")
    assert set(scalars) == set(first) | set(second)
    for step, logged in ((1, first), (2, second)):
        for tag, value in logged.items():
            assert (step, pytest.approx(value)) in scalars[tag], tag
    assert scalars["rollout/reward_mean"] == [(1, pytest.approx(0.7)), (2, 1.0)]
    assert scalars["dapo/groups_kept"] == [(1, 3.0)]
    assert scalars["train/loss"] == [(1, 0.25)]
    assert first["dapo/prompts_submitted"] == 5.0 and dapo_metrics(report)["dapo/wall_s"] == 1.5


def _wandb_history(run_dir: Path) -> list[dict[str, Any]]:
    """The history records of an offline run's transaction log, once wandb has written it all
    (``finish`` returns before wandb's core process has flushed the file; ``teardown`` waits for
    that process to exit).

    The ``.wandb`` file is a LevelDB-style log (7-byte file header, 32 KiB blocks, records cut
    into chunks with a 7-byte header: crc32, length, type) of protobuf ``Record`` messages;
    wandb 0.31 ships no Python reader for it (its core is in Go), so the test reads it here.
    """
    import wandb
    from wandb.proto import wandb_internal_pb2 as pb

    wandb.teardown()
    (path,) = glob.glob(str(run_dir / "wandb" / "offline-run-*" / "*.wandb"))
    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, chunk, records = 32768, 7, b"", []
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if kind == 0:
            break
        chunk += data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL, LAST
            records.append(chunk)
            chunk = b""
    history = []
    for raw in records:
        record = pb.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            items = {"/".join(i.nested_key) or i.key: i.value_json for i in record.history.item}
            history.append(
                {k: float(v) for k, v in items.items() if not k.startswith("_")}
                | {"_step": record.history.step.num}
            )
    return history


@pytest.fixture
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, str]]:
    """wandb.init's arguments for an offline run in tmp_path, nothing written elsewhere."""
    import wandb

    for var, sub in (
        ("WANDB_DIR", ""),
        ("WANDB_CONFIG_DIR", "config"),
        ("WANDB_CACHE_DIR", "cache"),
        ("WANDB_DATA_DIR", "data"),
    ):
        (tmp_path / sub).mkdir(exist_ok=True)
        monkeypatch.setenv(var, str(tmp_path / sub))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    # wandb's settings are read once a process: the directory and mode go in each init too
    yield {"dir": str(tmp_path), "mode": "offline"}
    wandb.teardown()


def test_wandb_offline_run_holds_each_step(
    groups: dict[str, list[RolloutResult]], wandb_offline: dict[str, str]
) -> None:
    import wandb

    init = {"project": "raas-test", **wandb_offline}
    with MetricsLogger(wandb=True, wandb_init=init) as logger:
        assert logger.sinks == ["wandb"]
        first = logger.log(list(groups.values()), step=3)
        second = logger.log(groups["eight"], step=4)
    assert wandb.run is None  # the logger started the run, so it finished it
    history = _wandb_history(Path(wandb_offline["dir"]))
    assert [h["_step"] for h in history] == [3, 4]
    assert history[0] == pytest.approx(first | {"_step": 3})
    assert history[1] == pytest.approx(second | {"_step": 4})


def test_wandb_run_of_the_trainer_is_used_and_left_open(
    groups: dict[str, list[RolloutResult]], wandb_offline: dict[str, str]
) -> None:
    import wandb

    run = wandb.init(project="trainer", **wandb_offline)
    try:
        with MetricsLogger(wandb=True) as logger:
            logger.log(groups["four"], step=1)
        assert wandb.run is run
    finally:
        run.finish()
    assert _wandb_history(Path(wandb_offline["dir"]))[0]["rollout/reward_mean"] == 1.0


def test_a_missing_package_is_said_and_the_others_go_on(
    groups: dict[str, list[RolloutResult]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    with pytest.warns(RuntimeWarning, match=r"wandb is not installed.*pip install 'wandb'"):
        logger = MetricsLogger(tensorboard_dir=tmp_path / "tb", wandb=True)
    with logger:
        assert logger.sinks == ["tensorboard"]
        logged = logger.log(groups["four"], step=1)
    assert logged["rollout/pass_rate"] == 1.0
    assert _tensorboard_scalars(tmp_path / "tb")["rollout/pass_rate"] == [(1, 1.0)]

    monkeypatch.setitem(sys.modules, "tensorboard.summary", None)
    with pytest.warns(RuntimeWarning, match=r"tensorboard is not installed.*raas\[tensorboard\]"):
        bare = MetricsLogger(tensorboard_dir=tmp_path / "tb2")
    assert bare.sinks == [] and bare.log(groups["four"], step=1)["rollout/count"] == 2
    assert not (tmp_path / "tb2").exists()
