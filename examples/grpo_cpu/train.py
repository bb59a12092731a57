"""GRPO on the CPU, end to end: a trainer that only talks HTTP to raas and to an inference engine.

Three processes:

    raas engine  (SmolLM2-135M-Instruct, vLLM's protocol)  <-- generates, takes /update_weights
    raas serve   (the rollout service: sandboxes, agent loop, reward)  --> calls the engine
    this script  (the policy in torch)  --> submits tasks to raas, trains on the results

The task: "What is 347 * 10000?", answered by calling the finish tool (raas's ``stem`` task,
numeric, exact, ``finish_only``: a reply in plain text scores 0). The answer depends on both
numbers (chance is about 0); SmolLM2-135M copies the digits and often gets the zeros wrong, so it
succeeds sometimes from the start. Two worked examples in the prompt show the tool call.

With ``--task lookup`` the task is multi-turn: "What is the product written in blue.txt?", that
file of the sandbox holding "347 * 1000" (raas's ``lookup`` task), read with bash, then answered
with finish; the observation between the two turns is masked out of the loss.

Each step: DAPO dynamic sampling fills B groups of n rollouts whose rewards differ (jobs still
running when B are in hand are cancelled); one policy-gradient step on the GRPO advantages of the
tempered policy, with a KL penalty to the initial weights (the guard against collapse); the new
weights go to a safetensors file, and the engine loads them (POST /update_weights). Before
training and every few steps, a held-out set of questions the trainer never samples is answered
greedily through raas, like the rollouts: its pass rate, with a 95% Wilson interval, is the result.

    python examples/grpo_cpu/train.py                 # starts the engine and the service
    RAAS_API_KEY=KEY python examples/grpo_cpu/train.py --raas URL --engine URL

A running engine (``--engine``) needs OUT among its --weights-dir, and its key where ``raas
engine`` reads one (RAAS_API_KEY, or the file RAAS_API_KEY_FILE names): a run without it, or
with a key the engine refuses, stops at start saying so. The same key goes to the raas server
(one started without a key takes any). An engine started here gets a fresh key through its
environment and OUT as its weight directory.

Writes ``OUT/grpo.csv`` (one row a step, written as it goes), ``OUT/heldout.png``, and the first
and last held-out passes' trajectories (``OUT/heldout_first.jsonl``, ``OUT/heldout_last.jsonl``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import csv
import itertools
import json
import math
import os
import random
import re
import signal
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch
from transformers.cache_utils import DynamicCache

from raas.client import (
    Batch,
    DapoReport,
    RolloutClient,
    RolloutResult,
    collect_groups,
    reward_varies,
    to_batch,
)
from raas.client.backends_paused import backends_paused
from raas.client.rollout_client import Group
from raas.client.staleness import staleness_metrics
from raas.helpers.readiness import NotReady, wait_until_answers
from raas.helpers.sigterm import Terminated, stopped_by_sigterm
from raas.launch import EngineProcess, ServerProcess
from raas.llm.models import load_model
from raas.settings import read_key_file

CSV_FIELDS = [
    "step", "wall_s", "train_reward", "rollouts", "groups_kept", "groups_dropped",
    "groups_by_power", "groups_capped", "heldout_n", "heldout_pass", "heldout_ci_low",
    "heldout_ci_high", "heldout_finish",
    "heldout_by_power", "heldout_tool_calls", "heldout_solved_tool_calls", "heldout_tricks",
    "entropy", "kl", "loss", "rollout_s", "train_s", "eval_s", "weight_version",
    "submit_lag_max", "staleness_known", "staleness_mean", "staleness_max", "on_policy_frac",
    "groups_stale",
]  # fmt: skip

SYSTEM = "Answer by calling finish with the number."
SMALLEST, LARGEST = 10, 999  # the first factor
POWERS = (1, 2, 3, 4, 5)  # the second factor is 10 ** k
# The worked examples, (x, k): with general products instead (23 * 47, 512 * 38) the base model
# answers 0 of 48 held-out questions; with these, about a fifth.
SHOTS = ((423, 1), (58, 3))
# The lookup task: three files each hold a product "x * 10^k", and the question names one.
LOOKUP_SYSTEM = "Answer from the files: read them with bash, then call finish with the number."
FILES = ("red", "green", "blue")
LOOKUP_SHOTS = ((423, 1, "green"), (58, 3, "red"))  # (x, k, the file "x * 10^k" is in)
# With the multiplier in the question and the number alone in the file, the count of zeros is
# decided three messages away from the number; trained on k = 1 to 3 that way, the policy moved
# every power to one count of zeros (two, then one) instead of learning which count goes with
# which k. With both factors in the file, the answer follows the observation that shows them, as
# on the single-turn task, which does learn it. Probe of the base model with k = 1 to 4 (40
# questions, greedy): 8/40, k = 2 5/5, k = 3 3/11, k = 1 and 4 none. Trained with k up to 4,
# 6% of the first step's T = 0.7 rollouts were right: 132 rollouts (9.5 minutes) for 8 groups with
# a signal. Up to 3, k = 2 is mostly right and 3 sometimes.
LOOKUP_POWERS = (1, 2, 3)


# -- the task ----------------------------------------------------------------------------------


def tool_call(name: str, **arguments: str) -> str:
    body = json.dumps({"name": name, "arguments": arguments})
    return f"<tool_call>\n{body}\n</tool_call>"


def finish_call(answer: int) -> str:
    return tool_call("finish", answer=str(answer))


def question(x: int, k: int, tag: str) -> dict[str, Any]:
    """One ``stem`` instance: "What is x * 10**k?", with the worked examples before it."""
    text = f"What is {x} * {10**k}?"
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    for a, j in SHOTS:
        messages += [
            {"role": "user", "content": f"What is {a} * {10**j}?"},
            {"role": "assistant", "content": finish_call(a * 10**j)},
            {"role": "tool", "content": "finished"},
        ]
    messages.append({"role": "user", "content": text})
    return {
        "data_source": "stem",
        "instance_id": f"{tag}-{x}x10^{k}",
        "question": text,
        "prompt": messages,
        "answer": x * 10**k,
        "rel_tol": 0.0,
        "finish_only": True,
    }


def product_text(x: int, k: int) -> str:
    return f"{x} * {10**k}"


def lookup_question(x: int, k: int, tag: str) -> dict[str, Any]:
    """One ``lookup`` instance: "What is the product written in blue.txt?", that file of the
    sandbox holding "x * 10^k" and the other two other products; the worked examples read a file
    with bash and answer with finish. Neither x nor k is in any message: only a tool call shows
    them."""
    rng = random.Random(f"{tag}-{x}-{k}")  # the file named and the others' products
    name = rng.choice(FILES)
    texts = {}
    for f in FILES:
        a, j = x, k
        while a == x or a * 10**j == x * 10**k:
            a, j = rng.randint(SMALLEST, LARGEST), rng.choice(LOOKUP_POWERS)
        texts[f] = product_text(a, j)
    texts[name] = product_text(x, k)
    messages: list[dict[str, Any]] = [{"role": "system", "content": LOOKUP_SYSTEM}]
    for a, j, f in LOOKUP_SHOTS:
        messages += [
            {"role": "user", "content": f"What is the product written in {f}.txt?"},
            {"role": "assistant", "content": tool_call("bash", command=f"cat {f}.txt")},
            {"role": "tool", "content": f"{product_text(a, j)}\n[exit code 0]"},
            {"role": "assistant", "content": finish_call(a * 10**j)},
            {"role": "tool", "content": "finished"},
        ]
    text = f"What is the product written in {name}.txt?"
    messages.append({"role": "user", "content": text})
    return {
        "data_source": "lookup",
        "instance_id": f"{tag}-{len(messages)}-{rng.getrandbits(32):08x}",  # says nothing of x
        "question": text,
        "prompt": messages,
        "files": {f"{f}.txt": f"{t}\n" for f, t in texts.items()},
        "answer": x * 10**k,
    }


@dataclass(frozen=True)
class Task:
    """What the run asks: its instances, the turns a rollout may take, the powers k it asks, and
    the (x, k) it never asks (a worked example, or one whose answer a worked example gives
    away)."""

    name: str
    build: Callable[[int, int, str], dict[str, Any]]
    max_turns: int
    title: str
    powers: tuple[int, ...]
    skip: frozenset[tuple[int, int]]


def _given_away(shots: tuple[tuple[int, int, str], ...]) -> frozenset[tuple[int, int]]:
    """The (x, k) whose x or answer a lookup prompt shows: a worked example's number, multiplier
    or answer (580 * 100 is 58 * 1000)."""
    numbers = {a for a, _, _ in shots} | {10**j for _, j, _ in shots}
    answers = {a * 10**j for a, j, _ in shots}
    return frozenset(
        (x, k)
        for x in range(SMALLEST, LARGEST + 1)
        for k in LOOKUP_POWERS
        if x in numbers or x * 10**k in answers
    )


TASKS = {
    "stem": Task("stem", question, 1, "x * 10^k via finish (stem)", POWERS, frozenset(SHOTS)),
    # Two turns at least: the file read with bash, then the answer; a third is a spare.
    "lookup": Task(
        "lookup",
        lookup_question,
        3,
        "the product written in a file (lookup, bash then finish)",
        LOOKUP_POWERS,
        _given_away(LOOKUP_SHOTS),
    ),
}


def heldout_pairs(n: int, seed: int, task: Task | None = None) -> list[tuple[int, int]]:
    """``n`` distinct (x, k), the held-out set of ``task`` (default: stem's): never sampled for
    training, none in its ``skip`` (a worked example)."""
    task = task or TASKS["stem"]
    rng = random.Random(f"heldout-{seed}")
    pairs = [
        (x, k) for x in range(SMALLEST, LARGEST + 1) for k in task.powers if (x, k) not in task.skip
    ]
    return rng.sample(pairs, n)


def training_questions(
    seed: int,
    held: set[tuple[int, int]],
    task: Task = TASKS["stem"],
    powers: dict[str, int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Endless training questions, none of them in ``held`` or the task's ``skip``; each one's
    power k goes to ``powers`` under its instance_id (which says nothing of it).

    The powers take turns: a step's few groups then cover them all. Drawn at random, a step's
    groups could all ask for one power, and its update would move every power's answer toward
    that one's count of zeros (the held-out rate then swings from one power to another).
    """
    rng = random.Random(f"train-{seed}")
    for k in itertools.cycle(task.powers):
        x = rng.randint(SMALLEST, LARGEST)
        while (x, k) in held or (x, k) in task.skip:
            x = rng.randint(SMALLEST, LARGEST)
        built = task.build(x, k, "train")
        if powers is not None:
            powers[built["instance_id"]] = k
        yield built


@dataclass
class PowerCap:
    """At most ``cap`` of a step's groups ask one power, so a step holds groups of two powers
    at least and its update contrasts their counts of zeros; trained on one power alone, a step
    moves every power's count toward that one's. Once ``budget`` rollouts are seen without a
    full batch, the cap lifts: a policy with one power left to learn still gets its steps."""

    powers: dict[str, int]  # instance_id -> k
    cap: int | None  # None: no cap
    budget: int
    kept: dict[int, int] = field(default_factory=dict)  # power -> groups kept this step
    capped: int = 0  # informative groups dropped for the cap

    def admits(self, group: Group, seen: int) -> bool:
        k = self.powers.get(str(group.task.get("instance_id")), -1)
        if self.cap is not None and self.kept.get(k, 0) >= self.cap and seen < self.budget:
            self.capped += 1
            return False
        self.kept[k] = self.kept.get(k, 0) + 1
        return True

    def said(self) -> str:
        """The groups kept per power, as "k:groups" pairs ("1:3 2:1 3:4")."""
        return " ".join(f"{k}:{n}" for k, n in sorted(self.kept.items()))


def wilson(passes: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The Wilson score interval of a pass rate (95% for z = 1.96): sound near 0 and 1 too."""
    if n == 0:
        return 0.0, 1.0
    p = passes / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class HeldOut:
    passes: int
    n: int
    finished: int  # replies that were a finish call, right or wrong
    seconds: float
    by_power: dict[int, tuple[int, int]]  # k: (passes, questions)
    tool_calls: float = 0.0  # mean calls of tools other than finish, per trajectory
    solved_tool_calls: float | None = None  # the same over the solved trajectories
    tricks: int = 0  # solved trajectories that did not come by the answer honestly (see tricks)
    records: list[dict[str, Any]] = field(default_factory=list)  # each question's trajectory

    @property
    def rate(self) -> float:
        return self.passes / self.n


def tool_calls(result: RolloutResult) -> int:
    """The calls of tools other than finish in a rollout (the bash reads, for lookup)."""
    turns = result.trajectory.turns
    return sum(1 for t in turns for c in t.get("tool_calls", []) if c.get("name") != "finish")


def trick(task: dict[str, Any], result: RolloutResult) -> str | None:
    """Why a solved rollout's reward did not come from solving it, or None: the red-team classes
    that apply here. A finish answer holding more than one number (a hedge the judge should
    refuse), several finish calls, and, for lookup, an answer given before any observation
    showed the named file's product (a guess, or the factors found elsewhere)."""
    if result.reward != 1.0:
        return None
    calls = [c for t in result.trajectory.turns for c in t.get("tool_calls", [])]
    finishes = [c for c in calls if c.get("name") == "finish"]
    if len(finishes) != 1:
        return f"{len(finishes)} finish calls"
    if len(re.findall(r"\d+", str(finishes[0].get("arguments", {}).get("answer", "")))) != 1:
        return "the finish answer holds more than one number"
    if task["data_source"] == "lookup":
        product = re.escape(_file_text(task))
        shown = [
            m.get("content", "")
            for m in result.trajectory.messages
            if m.get("role") == "tool" and m.get("name") == "bash"
        ]
        if not any(re.search(rf"(?<!\d){product}(?!\d)", text) for text in shown):
            return "answered before any observation showed the file's product"
    return None


def _file_text(task: dict[str, Any]) -> str:
    """The product written in the file a lookup question names."""
    name = re.search(r"in (\w+\.txt)", task["question"])
    assert name is not None, task["question"]
    return str(task["files"][name.group(1)]).strip()


async def evaluate(
    client: RolloutClient,
    pairs: list[tuple[int, int]],
    max_tokens: int,
    task: Task = TASKS["stem"],
) -> HeldOut:
    """The held-out questions ``(x, k)``, answered greedily, through raas like the rollouts."""
    started = time.perf_counter()
    tasks = [task.build(x, k, "heldout") for x, k in pairs]
    sampling = {"temperature": 0.0, "max_tokens": max_tokens, "max_turns": task.max_turns}
    groups = await client.generate_groups(tasks, 1, sampling)
    results = [g.results[0] for g in groups]
    by_power: dict[int, tuple[int, int]] = {}
    for (_, k), r in zip(pairs, results, strict=True):
        passes, n = by_power.get(k, (0, 0))
        by_power[k] = (passes + (r.reward == 1.0), n + 1)
    calls = [tool_calls(r) for r in results]
    solved = [c for c, r in zip(calls, results, strict=True) if r.reward == 1.0]
    found = [trick(t, r) for t, r in zip(tasks, results, strict=True)]
    return HeldOut(
        passes=sum(1 for r in results if r.reward == 1.0),
        n=len(results),
        finished=sum(1 for r in results if r.trajectory.stop_reason == "finish"),
        seconds=time.perf_counter() - started,
        by_power=dict(sorted(by_power.items())),
        tool_calls=statistics.fmean(calls),
        solved_tool_calls=statistics.fmean(solved) if solved else None,
        tricks=sum(1 for f in found if f is not None),
        records=[
            {
                "instance_id": t["instance_id"],
                "question": t["question"],
                "answer": t["answer"],
                "reward": r.reward,
                "trick": f,
                "messages": r.trajectory.messages[len(t["prompt"]) :],
            }
            for t, r, f in zip(tasks, results, found, strict=True)
        ],
    )


# -- the policy --------------------------------------------------------------------------------


def shared_prefix(rows: dict[str, torch.Tensor]) -> int:
    """How many leading tokens every row shares, short of the first generated token: the system
    prompt and the worked examples are the same in every rollout."""
    ids = rows["input_ids"]
    same = (ids == ids[:1]).all(dim=0).int().cumprod(dim=0)
    return max(0, min(int(same.sum()), int(rows["prompt_lengths"].min()) - 1))


def micro_batches(
    rows: dict[str, torch.Tensor], size: int, prefix: int
) -> list[dict[str, torch.Tensor]]:
    """The batch's rows in micro-batches of like length, each cut to its longest row.

    A rollout that explores can be several times the others' length (``help`` in the sandbox
    prints some 850 tokens where a file's product is 10), and a micro-batch padded to it makes
    every row in it pay for it: one such rollout made a step train for over ten minutes instead
    of one. So rows sorted by length (past the shared prefix) go into micro-batches of at most
    ``size`` rows and at most ``size`` times the median row's tokens, padding included. The loss
    weights sum to one over the whole batch, so the grouping does not change the loss.
    """
    width = rows["input_ids"].shape[1]
    lengths = rows["attention_mask"].sum(dim=1)
    own = (lengths - prefix).clamp(min=1)
    budget = size * int(own.median())
    parts: list[list[int]] = [[]]
    for i in torch.argsort(own, stable=True).tolist():
        if parts[-1] and (len(parts[-1]) == size or (len(parts[-1]) + 1) * int(own[i]) > budget):
            parts.append([])
        parts[-1].append(i)
    cut = []
    for rows_of_part in parts:
        index = torch.tensor(rows_of_part)
        longest = int(lengths[index].max())
        cut.append(
            {
                k: v[index][:, :longest] if v.dim() == 2 and v.shape[1] == width else v[index]
                for k, v in rows.items()
            }
        )
    return cut


def response_logits(
    model: Any, part: dict[str, torch.Tensor], prefix: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits at the generated tokens (loss mask 1) and those tokens.

    The shared prefix runs once, as a batch of one, and its keys and values are repeated for the
    rows (gradients flow back through them): the rows' own tokens are a tenth of a row here.
    Logits are computed only where the loss mask is 1.
    """
    ids, rows = part["input_ids"], part["input_ids"].shape[0]
    cache = DynamicCache()
    if prefix:
        model.model(input_ids=ids[:1, :prefix], past_key_values=cache, use_cache=True)
        cache.batch_repeat_interleave(rows)
    positions = torch.arange(prefix, ids.shape[1]).expand(rows, -1)
    hidden = model.model(
        input_ids=ids[:, prefix:],
        attention_mask=part["attention_mask"],
        past_key_values=cache,
        position_ids=positions,
        use_cache=True,
    ).last_hidden_state[:, :-1]
    where = part["loss_mask"][:, prefix + 1 :].bool()
    return model.lm_head(hidden[where]).float(), ids[:, prefix + 1 :][where]


@dataclass
class StepStats:
    loss: float = 0.0
    entropy: float = 0.0  # of the sampling policy, per generated token
    kl: float = 0.0  # to the initial weights, per generated token (k3 estimator)


def grpo_loss(
    model: Any,
    reference: Any,
    rows: dict[str, torch.Tensor],
    temperature: float,
    kl_coef: float,
    micro_batch: int,
    previous: Any = None,
    clip: float = 0.2,
    stop: threading.Event | None = None,
) -> StepStats:
    """The GRPO loss over the batch (backward in micro-batches) and its entropy and KL.

    The policy is the tempered model (logits / temperature): that is what sampled the rollouts.
    Synchronous (``previous`` None): one update a batch, from the weights that generated it
    (max_staleness=0), so the importance ratio is 1 and PPO's clip never binds: the surrogate is
    the advantage-weighted log-likelihood. Asynchronous: the tokens in ``rows["stale_tokens"]``
    were sampled one version back, by ``previous`` (the weights before the last update), so their
    ratio is to its tempered log-probs (the engine's logprobs are untempered: they cannot give
    it), and PPO's clip bounds it; the other tokens' ratio is 1 as above.
    The KL term is Schulman's k3 estimator of KL(policy || reference) at the sampled tokens. The
    loss weights of ``to_batch`` sum to one over the batch, so micro-batch terms add up.
    ``stop``, once set, abandons the step before its next micro-batch (:class:`StepAbandoned`).
    """
    stats = StepStats()
    prefix = shared_prefix(rows)
    for part in micro_batches(rows, micro_batch, prefix):
        if stop is not None and stop.is_set():
            raise StepAbandoned
        logits, targets = response_logits(model, part, prefix)
        logprobs_all = torch.log_softmax(logits / temperature, -1)
        logprobs = logprobs_all.gather(-1, targets[:, None]).squeeze(-1)
        with torch.no_grad():
            ref_logits, _ = response_logits(reference, part, prefix)
            ref = torch.log_softmax(ref_logits / temperature, -1).gather(-1, targets[:, None])
            entropy = -(logprobs_all.exp() * logprobs_all).sum(-1)
        where = part["loss_mask"][:, prefix + 1 :].bool()
        advantage = part["token_advantages"][:, prefix + 1 :][where]
        weight = part["loss_weights"][:, prefix + 1 :][where]
        log_ratio = ref.squeeze(-1) - logprobs
        kl = torch.exp(log_ratio) - log_ratio - 1
        behaviour = logprobs.detach()
        if previous is not None:
            stale = part["stale_tokens"][:, prefix + 1 :][where]
            if bool(stale.any()):
                behaviour = torch.where(
                    stale, behaviour_logprobs(previous, part, prefix, temperature), behaviour
                )
        ratio = torch.exp(logprobs - behaviour)
        surrogate = ratio * advantage
        if previous is not None:  # PPO's clip, which binds only where the ratio is not 1
            surrogate = torch.minimum(surrogate, ratio.clamp(1 - clip, 1 + clip) * advantage)
        loss = (weight * (kl_coef * kl - surrogate)).sum()
        loss.backward()
        stats.loss += float(loss.detach())
        stats.entropy += float((weight * entropy).sum())
        stats.kl += float((weight * kl.detach()).sum())
    return stats


def behaviour_logprobs(
    previous: Any, part: dict[str, torch.Tensor], prefix: int, temperature: float
) -> torch.Tensor:
    """The tempered log-probs of the generated tokens under ``previous`` (no gradient)."""
    with torch.no_grad():
        logits, targets = response_logits(previous, part, prefix)
        logprobs = torch.log_softmax(logits / temperature, -1)
        return logprobs.gather(-1, targets[:, None]).squeeze(-1)


def stale_tokens(batch: Batch, groups: list[Group], version: int) -> torch.Tensor:
    """[N, L], True at each generated token sampled under a version older than ``version``
    (from the turn records; a row whose records do not place each token's version is stale as a
    whole where its oldest token is)."""
    results = {r.job_id: r for group in groups for r in group.results}
    stale = torch.zeros(batch.input_ids.shape, dtype=torch.bool)
    width = batch.input_ids.shape[1]
    for i, job_id in enumerate(batch.job_ids):
        start = int(batch.prompt_lengths[i])
        versions = results[job_id].trajectory.token_policy_versions()
        if versions is None:
            stale[i, start:] = bool(batch.staleness[i] > 0)
            continue
        for k, v in enumerate(versions[: width - start]):
            stale[i, start + k] = v is not None and v < version
    return stale & torch.from_numpy(batch.loss_mask).bool()


def save_weights(model: Any, out: Path) -> Path:
    """The whole state dict as one safetensors file, replaced atomically."""
    from safetensors.torch import save_model

    path = out / "policy.safetensors"
    staging = out / "policy.safetensors.tmp"
    save_model(model, str(staging))  # drops one name of each tied pair; the engine knows both
    staging.replace(path)
    return path


class StepAbandoned(Exception):
    """The run is stopping: a step in a worker thread gave up before its next micro-batch."""


class Trainer:
    """The policy in torch: only the top layers train (a backward pass through all 30 layers of
    SmolLM2-135M costs more than the rollouts); the reference is a frozen copy of the start.
    Asynchronous, it also keeps the weights one version back (``previous``): what sampled the
    tokens that lag one version."""

    def __init__(self, args: argparse.Namespace) -> None:
        torch.manual_seed(args.seed)
        if args.threads:
            torch.set_num_threads(args.threads)
        self.args = args
        self.model, tokenizer = load_model(args.model)
        self.reference = copy.deepcopy(self.model).eval()
        self.previous = copy.deepcopy(self.model).eval() if args.async_mode else None
        frozen = [self.reference, *([self.previous] if self.previous is not None else [])]
        for p in [*self.model.parameters(), *(p for m in frozen for p in m.parameters())]:
            p.requires_grad_(False)
        self.model.train()
        self.trainable = top_layer_parameters(self.model, args.train_layers)
        for p in self.trainable:
            p.requires_grad_(True)
        self.optimizer = torch.optim.AdamW(self.trainable, lr=args.lr, weight_decay=0.0)
        self.pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        # Set when a step in a worker thread is abandoned (Ctrl-C): torch cannot be interrupted,
        # and the interpreter would wait for the thread's whole step before it exits.
        self.stop = threading.Event()

    def step(self, groups: list[Group], version: int) -> tuple[StepStats, Batch, Path]:
        """One GRPO step on the groups, the policy being at ``version``; returns its figures, the
        batch it trained on and the new weights' file."""
        batch = to_batch(
            groups,
            advantage="grpo",
            pad_token_id=self.pad,
            policy_version=version,
            max_staleness=self.args.max_lag if self.previous is not None else None,
        )
        rows = batch.to_torch()
        if self.previous is not None:
            rows["stale_tokens"] = stale_tokens(batch, groups, version)
        self.optimizer.zero_grad()
        stats = grpo_loss(
            self.model,
            self.reference,
            rows,
            self.args.temperature,
            self.args.kl_coef,
            self.args.micro_batch,
            self.previous,
            self.args.clip,
            self.stop,
        )
        torch.nn.utils.clip_grad_norm_(self.trainable, 1.0)
        if self.previous is not None:  # the weights of this version: the next batch's behaviour
            with torch.no_grad():
                previous = top_layer_parameters(self.previous, self.args.train_layers)
                for old, new in zip(previous, self.trainable, strict=True):
                    old.copy_(new)
        self.optimizer.step()
        return stats, batch, save_weights(self.model, self.args.out)


def torch_threads(threads: int | None, async_mode: bool, engine_here: bool) -> int | None:
    """The torch threads of the trainer and of the engine started here, each: ``threads`` if
    given; else, where both work at once on this machine's cores (asynchronous, the engine
    started here), half of the cores each. On 2 cores, two threads each made a training step
    under the rollouts take 450 s where one each took 54 to 84 s. Else torch's own default."""
    if threads is not None or not (async_mode and engine_here):
        return threads
    return max(1, len(os.sched_getaffinity(0)) // 2)


def top_layer_parameters(model: Any, layers: int) -> list[torch.nn.Parameter]:
    return [p for layer in model.model.layers[-layers:] for p in layer.parameters()]


# -- the run -----------------------------------------------------------------------------------


def write_csv_row(path: Path, row: dict[str, Any] | None) -> None:
    """Append a step's row (None: start the file with the header)."""
    with open(path, "w" if row is None else "a", newline="") as f:
        writer = csv.DictWriter(f, CSV_FIELDS)
        if row is None:
            writer.writeheader()
        else:
            writer.writerow(row)


def calls_said(result: HeldOut) -> str:
    """The held-out pass's tool calls and tricks, where the task has tools beside finish."""
    if not result.tool_calls:
        return ""
    return f", {result.tool_calls:.2f} tool calls a question, {result.tricks} tricks"


def write_records(path: Path, result: HeldOut) -> None:
    """Each held-out question's trajectory after its prompt, a JSON line each: what the tricks
    audit read, for a person to read too."""
    with open(path, "w") as f:
        for record in result.records:
            f.write(json.dumps(record) + "\n")


def heldout_columns(result: HeldOut) -> dict[str, Any]:
    low, high = wilson(result.passes, result.n)
    solved = result.solved_tool_calls
    return {
        "heldout_n": result.n,
        "heldout_pass": round(result.rate, 4),
        "heldout_ci_low": round(low, 4),
        "heldout_ci_high": round(high, 4),
        "heldout_finish": round(result.finished / result.n, 4),
        "heldout_by_power": " ".join(f"{k}:{p}/{n}" for k, (p, n) in result.by_power.items()),
        "heldout_tool_calls": round(result.tool_calls, 3),
        "heldout_solved_tool_calls": "" if solved is None else round(solved, 3),
        "heldout_tricks": result.tricks,
        "eval_s": round(result.seconds, 1),
    }


@dataclass
class Run:
    """What the steps of a run share."""

    args: argparse.Namespace
    trainer: Trainer
    client: RolloutClient
    questions: Iterator[dict[str, Any]]
    powers: dict[str, int]  # a training question's instance_id -> its power k
    pairs: list[tuple[int, int]]
    task: Task
    csv_path: Path
    t0: float
    push: Callable[[Path], Awaitable[int]]  # loads a weights file; the engine's new version
    version: int = 0  # the engine's weight version: the policy's
    eval_s: float = 0.0  # the last held-out pass's
    slowest_step: float = 0.0

    def over_budget(self) -> bool:
        """Whether a step more and its held-out pass would not fit in --max-minutes."""
        elapsed = time.perf_counter() - self.t0
        return elapsed + self.slowest_step + self.eval_s > float(self.args.max_minutes) * 60


async def collect(run: Run, max_lag: int) -> tuple[list[Group], DapoReport, list[float], PowerCap]:
    """A step's groups (DAPO dynamic sampling, at most --max-power-share of them of one power),
    what it took, the rewards of every finished group (the step's true mean reward), and the
    groups kept per power. ``max_lag``: the versions a group's submission, and with a lag above
    0 its oldest token, may be behind the policy when the group is judged."""
    seen: list[float] = []
    args = run.args
    share = float(args.max_power_share)
    cap = PowerCap(
        run.powers,
        math.ceil(share * args.groups) if share < 1 else None,
        budget=args.cap_budget * args.groups * args.n,
    )

    def keep(group: Group) -> bool:
        seen.extend(group.rewards)
        return reward_varies(group) and cap.admits(group, len(seen))

    groups, report = await collect_groups(
        run.client,
        run.questions,
        n=args.n,
        batch_size=args.groups,
        max_in_flight=args.groups * args.n + args.n,
        sampling_params={
            "max_tokens": args.max_tokens,
            "temperature": args.temperature,
            "max_turns": run.task.max_turns,
        },
        keep=keep,
        policy_version=lambda: run.version,
        max_staleness=max_lag,
        max_token_staleness=max_lag or None,
    )
    return groups, report, seen, cap


@dataclass
class Trained:
    """A step's update: its figures, its batch, the version it trained from, and its time."""

    stats: StepStats
    batch: Batch | None = None
    version: int = 0
    seconds: float = 0.0


async def train_and_push(run: Run, groups: list[Group]) -> Trained:
    """One GRPO step on ``groups`` and the new weights loaded into the engine (none without
    groups). The update runs in a worker thread: off the event loop, so the rollouts in flight
    go on (asynchronous), and so a stop need not wait for the whole step (either mode)."""
    if not groups:
        return Trained(StepStats(float("nan"), float("nan"), float("nan")), version=run.version)
    started, version = time.perf_counter(), run.version
    try:
        stats, batch, path = await asyncio.to_thread(run.trainer.step, groups, version)
    except asyncio.CancelledError:
        run.trainer.stop.set()
        raise
    run.version = await run.push(path)
    return Trained(stats, batch, version, time.perf_counter() - started)


def step_row(
    step: int,
    seen: list[float],
    report: DapoReport,
    groups: list[Group],
    trained: Trained,
    run: Run,
    cap: PowerCap,
) -> dict[str, Any]:
    """A step's CSV columns but the held-out ones and the wall time. The lags are the batch's
    when it trained: each rollout's oldest token's, and each group's submission's, behind the
    version it trained from."""
    stats = trained.stats
    lags = [] if trained.batch is None else [int(x) for x in trained.batch.staleness]
    lag = staleness_metrics([x if x >= 0 else None for x in lags], prefix="")
    submitted = [g.policy_version for g in groups if g.policy_version is not None]
    return {
        "step": step,
        "train_reward": round(statistics.fmean(seen), 4) if seen else "",
        "rollouts": len(seen),
        "groups_kept": report.groups_kept,
        "groups_dropped": report.groups_dropped,
        "groups_by_power": cap.said(),
        "groups_capped": cap.capped,
        "entropy": round(stats.entropy, 4),
        "kl": round(stats.kl, 5),
        "loss": round(stats.loss, 5),
        "rollout_s": round(report.wall_s, 1),
        "train_s": round(trained.seconds, 1),
        "weight_version": run.version,
        "submit_lag_max": max((trained.version - v for v in submitted), default=""),
        "staleness_known": round(lag["known_frac"], 3) if lag else "",
        "staleness_mean": round(lag["mean"], 3) if "mean" in lag else "",
        "staleness_max": int(lag["max"]) if "max" in lag else "",
        "on_policy_frac": round(lag["on_policy_frac"], 3) if "on_policy_frac" in lag else "",
        "groups_stale": report.groups_stale + report.groups_token_stale,
    }


async def finish_step(run: Run, row: dict[str, Any], last: bool) -> None:
    """The held-out pass where one is due, the step's CSV row and its line."""
    line = (
        f"step {row['step']}: reward {row['train_reward']} over {row['rollouts']} rollouts, kept"
        f" {row['groups_kept']} groups; entropy {row['entropy']:.3f}, KL {row['kl']:.4f};"
        f" rollouts {row['rollout_s']:.0f} s, train {row['train_s']:.0f} s"
    )
    if row["staleness_max"] != "":
        line += (
            f"; lag mean {row['staleness_mean']}, max {row['staleness_max']},"
            f" on-policy {row['on_policy_frac']}"
        )
    if row["step"] % run.args.eval_every == 0 or last:
        result = await evaluate(run.client, run.pairs, run.args.max_tokens, run.task)
        if last:
            write_records(run.args.out / "heldout_last.jsonl", result)
        run.eval_s = result.seconds
        row |= heldout_columns(result)
        line += (
            f"; held-out {result.passes}/{result.n}{calls_said(result)} ({result.seconds:.0f} s)"
        )
    row["wall_s"] = round(time.perf_counter() - run.t0, 1)
    write_csv_row(run.csv_path, row)
    print(line + f"; wall {row['wall_s'] / 60:.1f} min", flush=True)


async def synchronous_steps(run: Run) -> None:
    """Collect a batch on the current weights, train on it, load the new weights: in turn."""
    step = 0
    while step < run.args.steps:
        # Stop early enough that the last step and its held-out pass fit in the budget.
        if run.over_budget():
            print(f"stopping after step {step}: the next step would not fit in the budget")
            break
        step += 1
        step_started = time.perf_counter()
        groups, report, seen, cap = await collect(run, max_lag=0)
        trained = await train_and_push(run, groups)
        run.slowest_step = max(run.slowest_step, time.perf_counter() - step_started)
        last = step == run.args.steps or run.over_budget()
        await finish_step(run, step_row(step, seen, report, groups, trained, run, cap), last)


async def asynchronous_steps(run: Run) -> None:
    """The rollouts of step t+1 are submitted, on the current weights, before step t trains, and
    go on while it trains and while its weights load (raas's backend pool paused around the
    load, so none is lost). A batch thus lags at most one version (``--max-lag``, 1): a group
    submitted, or a rollout whose oldest token was sampled, further back is dropped."""
    max_lag = run.args.max_lag
    collecting: asyncio.Task[tuple[list[Group], DapoReport, list[float], PowerCap]] | None
    collecting = asyncio.create_task(collect(run, max_lag))
    step, step_ended = 0, time.perf_counter()
    try:
        while collecting is not None:
            step += 1
            groups, report, seen, cap = await collecting
            last = step == run.args.steps or run.over_budget()
            collecting = None if last else asyncio.create_task(collect(run, max_lag))
            trained = await train_and_push(run, groups)
            # A step: from the last one's end to this one's update, its held-out pass apart
            # (over_budget counts that on its own).
            run.slowest_step = max(run.slowest_step, time.perf_counter() - step_ended)
            await finish_step(run, step_row(step, seen, report, groups, trained, run, cap), last)
            step_ended = time.perf_counter()
    finally:
        if collecting is not None:  # its own cleanup cancels its jobs on the server
            collecting.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await collecting
    if step < run.args.steps:
        print(f"stopping after step {step}: the next step would not fit in the budget")


def load_weights_paused(raas_url: str, engine_url: str, engine_key: str, path: Path) -> int:
    """The engine loads ``path`` while raas's backend pool is paused (``keep``: the generations
    in flight wait and go on under the new weights, each token tagged with its version);
    returns the new weight version. Blocking: run it in a thread."""
    with backends_paused(raas_url, "keep", api_key=env_key()):
        reply = httpx.post(
            engine_url + "/update_weights",
            json={"path": str(path)},
            headers={"Authorization": f"Bearer {engine_key}"},
            timeout=300,
        )
    reply.raise_for_status()
    return int(reply.json()["weight_version"])


async def train(
    args: argparse.Namespace, raas_url: str, engine_url: str, engine_key: str, t0: float
) -> None:
    csv_path = args.out / "grpo.csv"
    write_csv_row(csv_path, None)
    task = TASKS[args.task]
    pairs = heldout_pairs(args.heldout, args.seed, task)
    async with (
        RolloutClient([raas_url], api_key=env_key()) as client,
        httpx.AsyncClient(timeout=300, headers={"Authorization": f"Bearer {engine_key}"}) as http,
    ):

        async def push(path: Path) -> int:
            if args.async_mode:
                return await asyncio.to_thread(
                    load_weights_paused, raas_url, engine_url, engine_key, path
                )
            reply = await http.post(engine_url + "/update_weights", json={"path": str(path)})
            reply.raise_for_status()
            return int(reply.json()["weight_version"])

        powers: dict[str, int] = {}
        run = Run(
            args,
            Trainer(args),
            client,
            training_questions(args.seed, set(pairs), task, powers),
            powers,
            pairs,
            task,
            csv_path,
            t0,
            push,
        )
        result = await evaluate(client, pairs, args.max_tokens, task)
        write_records(args.out / "heldout_first.jsonl", result)
        row: dict[str, Any] = {"step": 0, "wall_s": round(time.perf_counter() - t0, 1)}
        row |= heldout_columns(result) | {"weight_version": run.version}
        write_csv_row(csv_path, row)
        print(
            f"step 0: held-out {result.passes}/{result.n}{calls_said(result)}"
            f" ({result.seconds:.0f} s)",
            flush=True,
        )
        run.eval_s = result.seconds
        await (asynchronous_steps if args.async_mode else synchronous_steps)(run)
    mode = "asynchronous" if args.async_mode else "synchronous"
    if plot(csv_path, args.out / "heldout.png", task.title, mode):
        print(f"plot: {args.out / 'heldout.png'}")
    print(f"per-step figures: {csv_path}")


def plot(csv_path: Path, png_path: Path, title: str, mode: str) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no plot, the CSV has it all")
        return False
    with open(csv_path) as f:
        rows = list(csv.DictReader(f))
    evals = [r for r in rows if r["heldout_pass"]]
    trained = [r for r in rows if r["train_reward"]]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    steps = [int(r["step"]) for r in evals]
    low = [float(r["heldout_ci_low"]) for r in evals]
    high = [float(r["heldout_ci_high"]) for r in evals]
    ax.fill_between(steps, low, high, alpha=0.25, label="95% CI (Wilson)")
    rate = [float(r["heldout_pass"]) for r in evals]
    n = evals[0]["heldout_n"]
    ax.plot(steps, rate, marker="o", label=f"held-out pass rate ({n} questions, greedy)")
    ax.plot(
        [int(r["step"]) for r in trained],
        [float(r["train_reward"]) for r in trained],
        color="grey",
        alpha=0.6,
        linestyle="--",
        label="training reward (T=0.7 samples)",
    )
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("pass rate")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    minutes = float(rows[-1]["wall_s"]) / 60
    ax.set_title(f"SmolLM2-135M, {title}\n{mode}, 2 CPU cores, {minutes:.0f} min", fontsize=10)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> None:
    t0 = time.perf_counter()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40, help="At most; --max-minutes stops it.")
    parser.add_argument("--max-minutes", type=float, default=30.0, help="The whole run's budget.")
    parser.add_argument("--groups", type=int, default=8, help="B: informative groups a step.")
    parser.add_argument("--n", type=int, default=4, help="Samples a prompt.")
    parser.add_argument("--lr", type=float, default=3e-5)
    parser.add_argument("--kl-coef", type=float, default=0.02)
    parser.add_argument("--temperature", type=float, default=0.7, help="Of the rollouts.")
    parser.add_argument("--train-layers", type=int, default=8)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--heldout", type=int, default=150, help="Held-out questions.")
    parser.add_argument("--eval-every", type=int, default=5)
    parser.add_argument(
        "--task",
        choices=sorted(TASKS),
        default="stem",
        help="stem: x * 10^k answered through finish, one turn; lookup: x * 10^k written in a"
        " file the question names, read with bash, then answered through finish (see README).",
    )
    parser.add_argument(
        "--max-power-share",
        type=float,
        default=1.0,
        help="At most this share of a step's groups ask one power k (0.5: two powers at least a"
        " step); 1 (the default): no cap. See README: the training step.",
    )
    parser.add_argument(
        "--cap-budget",
        type=int,
        default=6,
        help="With --max-power-share: the cap lifts once a step has seen this many times B * n"
        " rollouts without a full batch.",
    )
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--raas", help="A running raas server (default: start one).")
    parser.add_argument("--engine", help="A running raas engine (default: start one).")
    parser.add_argument("--out", type=Path, default=Path("out/grpo_cpu"))
    parser.add_argument(
        "--async",
        dest="async_mode",
        action="store_true",
        help="Collect step t+1's rollouts while step t trains (see README: asynchronous).",
    )
    parser.add_argument(
        "--max-lag", type=int, default=1, help="Asynchronous: the versions a batch may lag."
    )
    parser.add_argument("--clip", type=float, default=0.2, help="Asynchronous: PPO's clip.")
    parser.add_argument(
        "--threads",
        type=int,
        help="Torch threads of the trainer and of the engine started here, each (default:"
        " torch's, one a core; with --async and the engine started here, half the cores each,"
        " since both work at once).",
    )
    args = parser.parse_args(argv)
    args.threads = torch_threads(args.threads, args.async_mode, engine_here=args.engine is None)
    args.out.mkdir(parents=True, exist_ok=True)
    # SIGTERM (kill, Slurm's scancel) stops the run as Ctrl-C does: in the event loop through
    # raas's stopped_by_sigterm (the run's task alone is cancelled, so its cleanup runs),
    # outside it (starting the servers) by raise_interrupt.
    signal.signal(signal.SIGTERM, raise_interrupt)
    try:
        run_with_servers(args, t0)
    except (KeyboardInterrupt, asyncio.CancelledError, Terminated) as e:
        by_term = isinstance(e, Terminated) or TERMINATED.is_set()
        name = "SIGTERM" if by_term else "Ctrl-C"
        print(f"stopped by {name}: what the run wrote is in {args.out}", flush=True)
        sys.exit(128 + (signal.SIGTERM if by_term else signal.SIGINT))


TERMINATED = threading.Event()  # set by SIGTERM


def raise_interrupt(signum: int, frame: object) -> None:
    """SIGTERM outside the event loop: unwinds like Ctrl-C (the servers started here stop)."""
    TERMINATED.set()
    raise KeyboardInterrupt


def run_with_servers(args: argparse.Namespace, t0: float) -> None:
    """Trains against --engine and --raas, or against an engine and a server started here (in
    sessions of their own, so a Ctrl-C at the terminal reaches this process alone, which stops
    them once its jobs are cancelled)."""
    with ExitStack() as stack:
        engine_url, engine_key = args.engine, env_key()
        if engine_url is not None and not engine_key:
            sys.exit(
                f"--engine {engine_url}: loading new weights needs an engine started with a key:"
                " start it as RAAS_API_KEY=KEY raas engine ... --weights-dir"
                f" {args.out.resolve()}, and set the same RAAS_API_KEY (or RAAS_API_KEY_FILE) here"
            )
        if engine_url is None:
            engine = EngineProcess(
                args.model,
                args.out / "engine.log",
                extra_args=["--max-batch", "32"],
                weight_dirs=[args.out.resolve()],  # where save_weights writes
                threads=args.threads,
                tied=True,
            )
            stack.callback(engine.stop)
            engine.wait_ready(timeout_s=600)
            engine_url, engine_key = engine.url, engine.api_key
        raas_url = args.raas
        if raas_url is None:
            (args.out / "raas.db").unlink(missing_ok=True)  # a fresh run, not a restart
            server = ServerProcess(
                args.out / "raas.db",
                args.out / "raas.log",
                ["--llm", engine_url, "--llm-capacity", "32", "--run-workers", "32"]
                + ["--init-workers", "16", "--warm-sandboxes", "8", "--tokenizer", args.model],
                env=dict(os.environ),
                tied=True,
            )
            stack.callback(server.stop)
            server.wait_ready()
            raas_url = server.url
        for flag, url, health in (
            ("--engine", engine_url, "/health"),
            ("--raas", raas_url, "/healthz"),
        ):
            try:
                wait_until_answers(url + health, timeout_s=10)
            except NotReady:
                sys.exit(
                    f"{flag} {url}: nothing answers GET {health} (start it, or leave {flag} out)"
                )
        if args.engine is not None:
            check_engine(engine_url, engine_key, args.out.resolve())
        asyncio.run(stopped_by_sigterm(train(args, raas_url, engine_url, engine_key, t0)))


def env_key() -> str:
    """The key in RAAS_API_KEY, or in the file RAAS_API_KEY_FILE names (where ``raas engine``
    and ``raas serve`` read theirs); "" when neither is set (never a header's value)."""
    key = os.environ.get("RAAS_API_KEY", "").strip()
    path = os.environ.get("RAAS_API_KEY_FILE", "").strip()
    if key or not path:
        return key
    try:
        return read_key_file(Path(path))
    except ValueError as e:
        sys.exit(f"RAAS_API_KEY_FILE: {e}")


def check_engine(engine_url: str, key: str, out: Path) -> None:
    """Ends the run in one line, before any step, if the engine would refuse the weights this run
    writes: ``key`` (a 401), or ``out`` outside its --weights-dir (a 403). Asked to load a file
    that is not there, an engine that takes both answers 422 and loads nothing."""
    reply = httpx.post(
        engine_url + "/update_weights",
        json={"path": str(out / "no-such-checkpoint.safetensors")},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    try:
        why = reply.json()["error"]["message"]
    except (ValueError, KeyError, TypeError):
        why = reply.text.strip()
    if reply.status_code == 401:
        sys.exit(f"--engine {engine_url} refuses the key set in RAAS_API_KEY(_FILE): {why}")
    if reply.status_code == 403:
        sys.exit(
            f"--engine {engine_url} would refuse this run's weights in {out}: {why}; start it"
            f" with --weights-dir {out}, or give --out a directory among its --weights-dir"
        )


if __name__ == "__main__":
    main()
