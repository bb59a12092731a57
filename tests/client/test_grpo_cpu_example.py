"""examples/grpo_cpu: its task, its held-out split, its interval, and the shared-prefix forward."""

from __future__ import annotations

import asyncio
import copy
import csv
import importlib.util
import itertools
import json
import os
import signal
import sys
import threading
import types
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

from raas.client import Group, RolloutResult, to_batch
from raas.llm.models import load_model
from raas.tasks.lookup import LookupInstance, in_text, prompt_text
from raas.tasks.stem import StemInstance

TRAIN_PY = Path(__file__).resolve().parents[2] / "examples" / "grpo_cpu" / "train.py"


@pytest.fixture(scope="module")
def example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("grpo_cpu_train", TRAIN_PY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_questions_are_valid_stem_instances_with_exact_answers(example: ModuleType) -> None:
    task = example.question(347, 4, "t")
    instance = StemInstance.model_validate(task)
    assert instance.answer == 3470000 and instance.rel_tol == 0.0
    assert task["finish_only"] is True
    assert task["prompt"][-1] == {"role": "user", "content": "What is 347 * 10000?"}
    # The worked examples are tool calls with the right products.
    shots = [m["content"] for m in task["prompt"] if m["role"] == "assistant"]
    assert shots == [example.finish_call(4230), example.finish_call(58000)]


def test_the_trainer_never_samples_a_heldout_question(example: ModuleType) -> None:
    pairs = example.heldout_pairs(150, seed=0)
    assert len(set(pairs)) == 150 and pairs == example.heldout_pairs(150, seed=0)
    held = {example.question(x, k, "heldout")["question"] for x, k in pairs}
    stream = example.training_questions(0, set(pairs))
    seen = {q["question"] for q in itertools.islice(stream, 3000)}
    shots = {example.question(x, k, "shot")["question"] for x, k in example.SHOTS}
    assert len(seen) > 1000 and not seen & held and not (seen | held) & shots


def test_lookup_questions_hold_the_product_in_the_named_file_alone(example: ModuleType) -> None:
    """x * 10^k is written in the file the question names and neither factor nor the answer is
    in any message: only reading it gives the answer; the other files hold other products; no
    worked example gives the answer away."""
    task = example.TASKS["lookup"]
    pairs = example.heldout_pairs(150, 0, task)
    questions = [task.build(x, k, "heldout") for x, k in pairs]
    questions += list(itertools.islice(example.training_questions(0, set(pairs), task), 500))
    names = set()
    for q in questions:
        instance = LookupInstance.model_validate(q)
        name = q["question"].split("written in ")[1].rstrip("?")
        names.add(name)
        x, multiplier = (int(v) for v in instance.files[name].split(" * "))
        assert instance.answer == x * multiplier and multiplier in (10, 100, 1000)
        for f, v in instance.files.items():
            if f != name:
                a, m = (int(n) for n in v.split(" * "))
                assert a != x and a * m != instance.answer
        text = prompt_text(instance)
        assert not in_text(x, text) and not in_text(instance.answer, text), q["instance_id"]
    assert names == {"red.txt", "green.txt", "blue.txt"}
    assert {k for _, k in pairs} == set(task.powers) == {1, 2, 3}
    # 580 * 100 is a worked example's answer (58 * 1000): never asked.
    assert (580, 2) in task.skip and (580, 2) not in pairs


def result_of(messages: list[dict[str, Any]], calls: list[dict[str, Any]], reward: float) -> Any:
    return RolloutResult.model_validate(
        {
            "job_id": "j",
            "state": "done",
            "reward": reward,
            "trajectory": {"messages": messages, "turns": [{"tool_calls": calls}]},
            "data_source": "lookup",
            "timing": {"queue_s": 0, "init_s": 0, "run_s": 0, "eval_s": 0, "total_s": 0},
        }
    )


def test_the_tricks_audit_flags_an_answer_not_read_from_the_file(example: ModuleType) -> None:
    task = example.lookup_question(347, 2, "t")
    name = task["question"].split("written in ")[1].rstrip("?")
    read = {"name": "bash", "arguments": {"command": f"cat {name}"}}
    finish = {"name": "finish", "arguments": {"answer": "34700"}}
    shown = {"role": "tool", "name": "bash", "content": "347 * 100\n[exit code 0]"}
    other = {"role": "tool", "name": "bash", "content": "347 * 10\n[exit code 0]"}
    honest = result_of([shown], [read, finish], 1.0)
    assert example.trick(task, honest) is None and example.tool_calls(honest) == 1
    assert example.trick(task, result_of([], [finish], 1.0)) is not None  # never read
    assert example.trick(task, result_of([other], [read, finish], 1.0)) is not None
    hedge = {"name": "finish", "arguments": {"answer": "34700 or 3470"}}
    assert example.trick(task, result_of([shown], [read, hedge], 1.0)) is not None
    assert example.trick(task, result_of([], [finish], 0.0)) is None  # unsolved: nothing to say


def test_training_questions_take_the_powers_in_turn(example: ModuleType) -> None:
    """Any window of len(POWERS) questions asks for every power once, so no step's groups all
    pull the count of zeros one way."""
    stream = example.training_questions(1, set())
    powers = [
        q["question"].count("0", q["question"].index("*")) for q in itertools.islice(stream, 50)
    ]
    for start in range(0, 50 - len(example.POWERS)):
        assert sorted(powers[start : start + len(example.POWERS)]) == sorted(example.POWERS)


def test_the_power_cap_keeps_two_powers_a_step_until_its_budget_is_spent(
    example: ModuleType,
) -> None:
    """At most half a step's groups of one power (B = 4: 2), so a third informative group of
    k = 3 is dropped; once the budget's rollouts are seen it is kept. Each question's recorded
    power is the one its named file holds."""
    task = example.TASKS["lookup"]
    powers: dict[str, int] = {}
    stream = example.training_questions(0, set(), task, powers)
    questions = list(itertools.islice(stream, 12))
    for q in questions:
        named = q["question"].rsplit(" ", 1)[1].rstrip("?")
        assert q["files"][named].split(" * ")[1].strip() == str(10 ** powers[q["instance_id"]])
    by_power = {k: [q for q in questions if powers[q["instance_id"]] == k] for k in (1, 2, 3)}
    cap = example.PowerCap(powers, cap=2, budget=40)
    groups = [Group(task=q) for q in by_power[3]]
    assert [cap.admits(g, seen=8) for g in groups[:3]] == [True, True, False]
    assert cap.admits(Group(task=by_power[1][0]), seen=12)  # another power: kept
    assert (cap.said(), cap.capped) == ("1:1 3:2", 1)
    assert cap.admits(groups[3], seen=40)  # the budget spent: the cap lifts
    uncapped = example.PowerCap(powers, cap=None, budget=0)
    assert all(uncapped.admits(g, seen=0) for g in groups)  # the default: no cap


def test_wilson_interval(example: ModuleType) -> None:
    assert example.wilson(0, 10) == pytest.approx((0.0, 0.2775), abs=1e-4)
    low, high = example.wilson(30, 150)
    assert low == pytest.approx(0.1438, abs=1e-4) and high == pytest.approx(0.2711, abs=1e-4)
    assert example.wilson(150, 150)[1] == 1.0


def test_shared_prefix_forward_matches_the_plain_one(example: ModuleType) -> None:
    """Logits and gradients of the prefix-shared forward are those of a plain forward."""
    model, _ = load_model("tiny")
    model.float()
    torch.manual_seed(0)
    prefix = torch.randint(5, 1000, (12,)).tolist()
    rows = [prefix + torch.randint(5, 1000, (n,)).tolist() for n in (6, 9, 4)]
    width = max(map(len, rows))
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    attention = torch.zeros_like(ids)
    loss_mask = torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        loss_mask[i, 14 : len(row)] = 1  # two prompt tokens after the prefix, then the response
    batch = {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "prompt_lengths": torch.full((3,), 14),
    }
    assert example.shared_prefix(batch) == 12

    def grads(prefix_len: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        logits, targets = example.response_logits(model, batch, prefix_len)
        torch.log_softmax(logits, -1).gather(-1, targets[:, None]).sum().backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]

    shared, shared_grads = grads(12)
    plain, plain_grads = grads(0)
    assert shared.shape == plain.shape == (int(loss_mask[:, 1:].sum()), model.config.vocab_size)
    torch.testing.assert_close(shared, plain, atol=1e-4, rtol=1e-4)
    assert len(shared_grads) == len(plain_grads) > 0
    for a, b in zip(shared_grads, plain_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-3)


def test_the_asynchronous_mode_trains_on_batches_at_most_one_version_behind(
    example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two asynchronous steps with the tiny model, through a real engine and raas server: step
    2's rollouts were submitted before step 1's weights loaded, and no batch lags more than one
    version (every rollout's versions known)."""
    # The tiny model's answers all score 0: keep every group, or no batch ever fills.
    monkeypatch.setattr(example, "reward_varies", lambda group: True)
    previous_sigterm = signal.getsignal(signal.SIGTERM)
    # --max-minutes stops the run before a step that would not fit: an hour, so that a loaded
    # machine never ends it after step 1 (the steps take seconds here).
    try:
        example.main(
            ["--model", "tiny", "--async", "--task", "lookup", "--steps", "2", "--groups", "2"]
            + ["--n", "2"]
            + ["--heldout", "2", "--eval-every", "2", "--max-tokens", "6", "--train-layers", "1"]
            + ["--max-minutes", "60", "--max-power-share", "0.5", "--out", str(tmp_path)]
        )
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
    with open(tmp_path / "grpo.csv") as f:
        steps = [row for row in csv.DictReader(f) if row["step"] != "0"]
    assert [row["step"] for row in steps] == ["1", "2"]
    assert [row["weight_version"] for row in steps] == ["1", "2"]
    assert [row["submit_lag_max"] for row in steps] == ["0", "1"]
    for row in steps:
        assert row["staleness_known"] == "1.0" and int(row["staleness_max"]) <= 1
        assert int(row["groups_kept"]) == 2
        # One group a power at most (B = 2, a share of 0.5): the questions take the powers in
        # turn, so the first two groups are of two powers unless the cap held one back.
        kept = dict(pair.split(":") for pair in row["groups_by_power"].split())
        assert sorted(kept.values()) == ["1", "1"], row["groups_by_power"]
    assert steps[-1]["heldout_n"] == "2"
    # The multi-turn task's held-out columns and trajectories (the tiny model calls no tool).
    assert steps[-1]["heldout_tool_calls"] == "0.0" and steps[-1]["heldout_tricks"] == "0"
    records = (tmp_path / "heldout_last.jsonl").read_text().splitlines()
    assert len(records) == 2 and json.loads(records[0])["question"].startswith("What is the")


def rollout(job_id: str, reward: float, response: list[int], turn: dict[str, Any]) -> RolloutResult:
    trajectory = {
        "prompt_ids": [1, 2, 3],
        "response_ids": response,
        "loss_mask": [1] * len(response),
        "logprobs": [-1.0] * len(response),
        "turns": [{"output_tokens": len(response), **turn}],
    }
    return RolloutResult.model_validate(
        {
            "job_id": job_id,
            "state": "done",
            "reward": reward,
            "trajectory": trajectory,
            "data_source": "stem",
            "timing": {"queue_s": 0, "init_s": 0, "run_s": 0, "eval_s": 0, "total_s": 0},
        }
    )


def test_stale_tokens_are_those_sampled_before_the_trainer_s_version(example: ModuleType) -> None:
    """A weight update landed in the middle of the first rollout: only its first token, sampled
    one version back, is stale; the second rollout's are on-policy."""
    group = Group(
        {},
        [
            rollout("a", 1.0, [7, 8, 9], {"policy_versions": [4, 5, 5]}),
            rollout("b", 0.0, [7, 8], {"policy_version": 5}),
        ],
    )
    batch = to_batch([group], pad_token_id=0, policy_version=5, max_staleness=1)
    stale = example.stale_tokens(batch, [group], 5)
    assert stale.tolist() == [
        [False, False, False, True, False, False],
        [False, False, False, False, False, False],
    ]
    assert batch.staleness.tolist() == [1, 0]


def padded_rows(rows: list[list[int]], advantages: list[float]) -> dict[str, torch.Tensor]:
    """The trainer's batch tensors for ``rows`` right-padded: a prompt of 4 tokens, the rest
    generated, each row's advantage on its generated tokens."""
    ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long)
    attention, loss_mask = torch.zeros_like(ids), torch.zeros_like(ids)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row)
        attention[i, : len(row)] = 1
        loss_mask[i, 4 : len(row)] = 1
    return {
        "input_ids": ids,
        "attention_mask": attention,
        "loss_mask": loss_mask,
        "prompt_lengths": torch.full((len(rows),), 4),
        "token_advantages": loss_mask * torch.tensor(advantages)[:, None],
        "loss_weights": loss_mask / loss_mask.sum(),
    }


def test_with_the_same_weights_one_version_back_the_asynchronous_loss_is_the_synchronous_one(
    example: ModuleType,
) -> None:
    """Tokens marked stale get their ratio from ``previous``: with the weights unchanged it is 1,
    PPO's clip does not bind, and loss and gradients are the synchronous ones."""
    model, _ = load_model("tiny")
    model.float()
    reference = copy.deepcopy(model)
    torch.manual_seed(0)
    rows = [torch.randint(5, 1000, (n,)).tolist() for n in (9, 7)]
    batch = padded_rows(rows, [1.0, -1.0])
    batch["stale_tokens"] = batch["loss_mask"].bool()

    def run(previous: Any) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        stats = example.grpo_loss(model, reference, batch, 0.7, 0.02, 16, previous)
        return stats.loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    sync_loss, sync_grads = run(None)
    async_loss, async_grads = run(copy.deepcopy(model))
    assert async_loss == pytest.approx(sync_loss, abs=1e-6)
    for a, b in zip(async_grads, sync_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_a_long_rollout_trains_in_a_micro_batch_of_its_own_cut_to_its_length(
    example: ModuleType,
) -> None:
    """A rollout that explored (a long observation) would make every row of its micro-batch pay
    for its length: it goes into one of its own, each micro-batch is cut to its longest row, and
    the loss and gradients are those of one row at a time."""
    model, _ = load_model("tiny")
    model.float()
    reference = copy.deepcopy(model)
    torch.manual_seed(0)
    prompt = torch.randint(5, 1000, (4,)).tolist()
    rows = [prompt + torch.randint(5, 1000, (n,)).tolist() for n in (3, 4, 5, 30)]
    batch = padded_rows(rows, [1.0, -1.0, 0.5, -0.5])
    parts = example.micro_batches(batch, 16, example.shared_prefix(batch))
    assert [p["attention_mask"].sum(dim=1).tolist() for p in parts] == [[7, 8, 9], [34]]
    assert [p["input_ids"].shape[1] for p in parts] == [9, 34]

    def run(micro_batch: int) -> tuple[float, list[torch.Tensor]]:
        model.zero_grad()
        stats = example.grpo_loss(model, reference, batch, 0.7, 0.02, micro_batch)
        return stats.loss, [p.grad.clone() for p in model.parameters() if p.grad is not None]

    together_loss, together_grads = run(16)
    alone_loss, alone_grads = run(1)
    assert together_loss == pytest.approx(alone_loss, abs=1e-6)
    for a, b in zip(together_grads, alone_grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-4)


def test_a_stopped_step_gives_up_before_its_next_micro_batch(example: ModuleType) -> None:
    model, _ = load_model("tiny")
    model.float()
    reference = copy.deepcopy(model)
    torch.manual_seed(0)
    prompt = torch.randint(5, 1000, (4,)).tolist()
    batch = padded_rows([prompt + [7, 8], prompt + [9]], [1.0, -1.0])
    stop = threading.Event()
    assert example.grpo_loss(model, reference, batch, 0.7, 0.02, 16, stop=stop).loss != 0
    model.zero_grad(set_to_none=True)
    stop.set()
    with pytest.raises(example.StepAbandoned):
        example.grpo_loss(model, reference, batch, 0.7, 0.02, 16, stop=stop)
    assert all(p.grad is None for p in model.parameters())  # no backward ran


async def test_cancelling_a_step_in_a_thread_tells_the_thread_to_stop(example: ModuleType) -> None:
    """Ctrl-C while a step trains in a worker thread: torch cannot be interrupted, and the
    interpreter waits for the thread before it exits, so the step is told to give up."""

    class Trainer:
        stop = threading.Event()

        def step(self, groups: list[Group], version: int) -> None:
            assert self.stop.wait(timeout=60), "the thread was never told to stop"
            raise example.StepAbandoned

    run = types.SimpleNamespace(trainer=Trainer(), version=0)
    training = asyncio.create_task(example.train_and_push(run, [Group(task={})]))
    await asyncio.sleep(0)  # it runs up to its wait on the thread
    training.cancel()
    with pytest.raises(asyncio.CancelledError):
        await training
    assert run.trainer.stop.is_set()


def test_asynchronous_with_the_engine_here_splits_the_cores_between_trainer_and_engine(
    example: ModuleType,
) -> None:
    """Both work at once, so each gets half the cores; a given --threads wins, and where they
    take turns (synchronous) or the engine is elsewhere, torch keeps its own default."""
    half = max(1, len(os.sched_getaffinity(0)) // 2)
    assert example.torch_threads(None, True, engine_here=True) == half
    assert example.torch_threads(3, True, engine_here=True) == 3
    assert example.torch_threads(None, False, engine_here=True) is None
    assert example.torch_threads(None, True, engine_here=False) is None


def test_against_a_running_engine_a_missing_or_refused_key_stops_the_run_at_start(
    example: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--raas URL --engine URL`` as the README shows: without a key (it crashed after one
    step with ``Illegal header value b'Bearer '``) or with one the engine refuses, one line
    saying what to set, before anything trains; the engine's key (RAAS_API_KEY, or the file
    RAAS_API_KEY_FILE names, as ``raas engine`` reads it) trains, and goes to raas too."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse

    from raas.llm.engine.admin_key import AdminKeyMiddleware
    from raas.llm.engine.weight_dirs import REFUSED, PathRefused, WeightDirs
    from tests.support.llm_servers import ServerThread

    app = FastAPI()  # an engine and a raas server as far as the trainer's start is concerned
    app.add_middleware(AdminKeyMiddleware, api_key="sesame")
    for path in ("/health", "/healthz"):
        app.get(path)(lambda: {})
    allowed = WeightDirs.of([tmp_path / "weights"])  # the engine's --weights-dir

    @app.post("/update_weights")
    def update_weights(body: dict[str, str]) -> JSONResponse:  # the engine's checks, in order
        try:
            allowed.check(body["path"])
        except PathRefused as e:
            error = {"message": str(e), "type": "PermissionDeniedError"}
            return JSONResponse({"error": error}, status_code=403)
        return JSONResponse({"detail": "no such checkpoint"}, status_code=422)

    server = ServerThread(app).start()
    trained: list[tuple[str, str]] = []

    async def train(args: object, raas_url: str, engine_url: str, key: str, t0: float) -> None:
        trained.append((engine_url, key))

    monkeypatch.setattr(example, "train", train)
    monkeypatch.delenv("RAAS_API_KEY", raising=False)
    monkeypatch.delenv("RAAS_API_KEY_FILE", raising=False)
    out = tmp_path / "weights" / "run"
    argv = ["--raas", server.url, "--engine", server.url, "--out", str(out)]
    previous_sigterm = signal.getsignal(signal.SIGTERM)

    def stopped() -> str:
        with pytest.raises(SystemExit) as stop:
            example.main(argv)
        assert isinstance(stop.value.code, str) and not trained, stop.value.code
        return stop.value.code

    try:
        for unset in ("", "  "):
            monkeypatch.setenv("RAAS_API_KEY", unset)
            line = stopped()
            assert line == (
                f"--engine {server.url}: loading new weights needs an engine started with a key:"
                f" start it as RAAS_API_KEY=KEY raas engine ... --weights-dir {out.resolve()},"
                " and set the same RAAS_API_KEY (or RAAS_API_KEY_FILE) here"
            )
        monkeypatch.setenv("RAAS_API_KEY", "wrong")
        line = stopped()
        assert "\n" not in line and line.startswith(f"--engine {server.url} refuses the key")
        assert "missing or wrong API key" in line
        monkeypatch.setenv("RAAS_API_KEY", "sesame")  # the control: the engine's key
        # ... but an --out outside the engine's --weights-dir: it crashed with a 403 after a
        # step's rollouts and training (minutes); now one line before anything runs.
        x = (tmp_path / "x").resolve()
        elsewhere = ["--raas", server.url, "--engine", server.url, "--out", str(x)]
        with pytest.raises(SystemExit) as stop:
            example.main(elsewhere)
        assert not trained
        assert stop.value.code == (
            f"--engine {server.url} would refuse this run's weights in {x}: {REFUSED}; start it"
            f" with --weights-dir {x}, or give --out a directory among its --weights-dir"
        )
        example.main(argv)
        monkeypatch.delenv("RAAS_API_KEY")
        (tmp_path / "key").write_text("sesame\n")
        monkeypatch.setenv("RAAS_API_KEY_FILE", str(tmp_path / "key"))
        example.main(argv)
        assert example.env_key() == "sesame"  # what raas is sent too
    finally:
        signal.signal(signal.SIGTERM, previous_sigterm)
        server.stop()
    assert trained == [(server.url, "sesame")] * 2
