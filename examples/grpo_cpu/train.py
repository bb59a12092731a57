"""GRPO on the CPU, end to end: a trainer that only talks HTTP to raas and to an inference engine.

Three processes:

    raas engine  (SmolLM2-135M-Instruct, vLLM's protocol)  <-- generates, takes /update_weights
    raas serve   (the rollout service: sandboxes, agent loop, reward)  --> calls the engine
    this script  (the policy in torch)  --> submits tasks to raas, trains on the results

Each step: DAPO dynamic sampling fills B groups of n rollouts whose rewards differ (the groups
with one reward everywhere carry no GRPO signal and are dropped; jobs still running when B are in
hand are cancelled); one clipped policy-gradient step on the GRPO advantages; the new weights go
to a safetensors file, and the engine loads them with POST /update_weights before the next step.

The task is raas's ``stem`` task with two-choice addition questions ("What is 7 + 15?  A) 22
B) 24"): the reward is 1 when the answer names the right letter. SmolLM2-135M gets some right
from the start, so groups carry signal from step one.

    python examples/grpo_cpu/train.py --steps 20      # starts the engine and the service
    python examples/grpo_cpu/train.py --raas URL --engine URL --steps 20

Writes ``OUT/rewards.csv`` (one row a step) and ``OUT/rewards.png`` (needs matplotlib).
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import os
import random
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import torch

from raas.client import RolloutClient, collect_groups, reward_varies, to_batch
from raas.client.rollout_client import Group
from raas.launch import EngineProcess, ServerProcess
from raas.llm.models import load_model

CSV_FIELDS = [
    "step", "mean_reward", "rollouts", "groups_kept", "groups_dropped", "jobs_cancelled",
    "rollout_s", "train_s", "loss", "weight_version",
]  # fmt: skip


def addition_questions(seed: int) -> Iterator[dict[str, Any]]:
    """Endless two-choice addition questions in the ``stem`` task's instance format."""
    rng = random.Random(seed)
    i = 0
    while True:
        a, b = rng.randint(2, 20), rng.randint(2, 20)
        wrong = a + b + rng.choice([-3, -2, -1, 1, 2, 3])
        right_first = rng.random() < 0.5
        choices = {"A": str(a + b), "B": str(wrong)} if right_first else {
            "A": str(wrong), "B": str(a + b)}  # fmt: skip
        yield {
            "data_source": "stem",
            "instance_id": f"add-{seed}-{i}",
            "question": f"What is {a} + {b}?",
            "choices": choices,
            "answer": "A" if right_first else "B",
        }
        i += 1


def policy_loss(model: Any, rows: dict[str, torch.Tensor], clip: float, micro_batch: int) -> float:
    """Clipped policy gradient (PPO's surrogate) over the batch, backward in micro-batches.

    The loss weights from ``to_batch`` already sum to one over the batch, so micro-batch losses
    add up to the batch's loss. Logits are computed only where the loss mask is 1: the vocabulary
    projection of every prompt token would cost a fifth of the forward pass for nothing.
    """
    total = 0.0
    for start in range(0, rows["input_ids"].shape[0], micro_batch):
        part = {k: v[start : start + micro_batch] for k, v in rows.items()}
        hidden = model.model(
            input_ids=part["input_ids"], attention_mask=part["attention_mask"]
        ).last_hidden_state[:, :-1]
        where = part["loss_mask"][:, 1:].bool()
        targets = part["input_ids"][:, 1:][where]
        logits = model.lm_head(hidden[where]).float()
        logprobs = torch.log_softmax(logits, -1).gather(-1, targets[:, None]).squeeze(-1)
        ratio = torch.exp(logprobs - part["old_logprobs"][:, 1:][where])
        advantage = part["token_advantages"][:, 1:][where]
        surrogate = torch.minimum(
            ratio * advantage, torch.clamp(ratio, 1 - clip, 1 + clip) * advantage
        )
        loss = -(surrogate * part["loss_weights"][:, 1:][where]).sum()
        loss.backward()
        total += float(loss.detach())
    return total


def save_weights(model: Any, out: Path) -> Path:
    """The whole state dict as one safetensors file, replaced atomically."""
    from safetensors.torch import save_model

    path = out / "policy.safetensors"
    staging = out / "policy.safetensors.tmp"
    save_model(model, str(staging))  # drops one name of each tied pair; the engine knows both
    staging.replace(path)
    return path


def write_csv_row(path: Path, row: dict[str, Any] | None) -> None:
    """Append a step's row (None: start the file with the header)."""
    with open(path, "w" if row is None else "a", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        if row is None:
            writer.writeheader()
        else:
            writer.writerow(row)


def plot(csv_path: Path, png_path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot, the CSV has it all")
        return False
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    steps = [int(r["step"]) for r in rows]
    rewards = [float(r["mean_reward"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(steps, rewards, marker="o")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward of the step's rollouts")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.set_title("SmolLM2-135M, two-choice addition (stem task), raas on 2 CPU cores")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return True


class Trainer:
    """The policy in torch: only the top layers train (a backward pass through all 30 layers of
    SmolLM2-135M costs minutes a step on 2 cores)."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(args.seed)
        self.args = args
        self.model, tokenizer = load_model(args.model)
        self.model.train()
        for p in self.model.parameters():
            p.requires_grad_(False)
        top = self.model.model.layers[-args.train_layers :]
        self.trainable = [p for layer in top for p in layer.parameters()]
        for p in self.trainable:
            p.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.trainable, lr=args.lr, weight_decay=0.0)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    def step(self, groups: list[Group]) -> tuple[float, Path]:
        """One GRPO step on the groups; returns the loss and the new weights' file."""
        batch = to_batch(groups, advantage="grpo", pad_token_id=self.pad)
        self.optimizer.zero_grad()
        loss = policy_loss(self.model, batch.to_torch(), self.args.clip, self.args.micro_batch)
        torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        self.optimizer.step()
        return loss, save_weights(self.model, self.args.out)


async def train(args: argparse.Namespace, raas_url: str, engine_url: str) -> None:
    trainer = Trainer(args)
    csv_path = args.out / "rewards.csv"
    write_csv_row(csv_path, None)
    questions = addition_questions(args.seed)
    sampling = {"max_tokens": args.max_tokens, "temperature": 1.0, "max_turns": 1}
    version = 0

    def weight_version() -> int:
        return version

    async with RolloutClient([raas_url]) as client, httpx.AsyncClient(timeout=300) as http:
        for step in range(1, args.steps + 1):
            seen: list[float] = []

            def keep(group: Group, seen: list[float] = seen) -> bool:
                seen.extend(group.rewards)  # every finished group: the step's true mean reward
                return reward_varies(group)

            started = time.perf_counter()
            groups, report = await collect_groups(
                client,
                questions,
                n=args.n,
                batch_size=args.groups,
                max_in_flight=args.groups * args.n + args.n,
                sampling_params=sampling,
                keep=keep,
                policy_version=weight_version,
                max_staleness=0,
            )
            rollout_s = time.perf_counter() - started
            loss, train_s = float("nan"), 0.0
            if groups:
                started = time.perf_counter()
                loss, path = trainer.step(groups)
                reply = await http.post(engine_url + "/update_weights", json={"path": str(path)})
                reply.raise_for_status()
                version = int(reply.json()["weight_version"])
                train_s = time.perf_counter() - started
            row = {
                "step": step,
                "mean_reward": round(statistics.fmean(seen), 4) if seen else "",
                "rollouts": len(seen),
                "groups_kept": report.groups_kept,
                "groups_dropped": report.groups_dropped,
                "jobs_cancelled": report.jobs_cancelled,
                "rollout_s": round(rollout_s, 1),
                "train_s": round(train_s, 1),
                "loss": round(loss, 5),
                "weight_version": version,
            }
            write_csv_row(csv_path, row)
            print(
                f"step {step}: reward {row['mean_reward']} over {len(seen)} rollouts,"
                f" kept {report.groups_kept} groups, dropped {report.groups_dropped},"
                f" cancelled {report.jobs_cancelled}; rollouts {rollout_s:.0f} s,"
                f" train {train_s:.0f} s; engine weights v{version}",
                flush=True,
            )
    if plot(csv_path, args.out / "rewards.png"):
        print(f"plot: {args.out / 'rewards.png'}")
    print(f"per-step figures: {csv_path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--groups", type=int, default=4, help="B: informative groups a step.")
    parser.add_argument("--n", type=int, default=8, help="Samples a prompt.")
    parser.add_argument("--lr", type=float, default=5e-5)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--train-layers", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raas", help="A running raas server (default: start one).")
    parser.add_argument("--engine", help="A running raas engine (default: start one).")
    parser.add_argument("--out", type=Path, default=Path("out/grpo_cpu"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so the engine and the server started here are stopped too.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    with ExitStack() as stack:
        engine_url = args.engine
        if engine_url is None:
            engine = EngineProcess(
                args.model, args.out / "engine.log", extra_args=["--max-batch", "16"]
            )
            stack.callback(engine.stop)
            engine.wait_ready(timeout_s=600)
            engine_url = engine.url
        raas_url = args.raas
        if raas_url is None:
            (args.out / "raas.db").unlink(missing_ok=True)  # a fresh run, not a restart
            server = ServerProcess(
                args.out / "raas.db",
                args.out / "raas.log",
                ["--llm", engine_url, "--llm-capacity", "16", "--run-workers", "16"]
                + ["--tokenizer", args.model],
                env=dict(os.environ),
            )
            stack.callback(server.stop)
            server.wait_ready()
            raas_url = server.url
        asyncio.run(train(args, raas_url, engine_url))


if __name__ == "__main__":
    main()
