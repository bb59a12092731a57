"""DAPO's dynamic sampling with asynchronous replenishment.

A GRPO batch wants B prompt groups whose n rewards are not all equal (a group with one reward
everywhere has zero advantage: no signal). The textbook loop over-samples a whole batch, waits for
all of it, filters, and repeats. Here up to ``max_in_flight`` jobs run at once; each group is
judged the moment its last sample finishes; new prompts are submitted as soon as slots free up;
and once B informative groups are in hand, every job still in flight is cancelled (the service
frees its sandbox and LLM slot at once).
"""

from __future__ import annotations

import asyncio
import statistics
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from raas.client.rollout_client import Group, RolloutClient, sample_request
from raas.client.staleness import token_lag, too_stale
from raas.wire import RolloutResult


def reward_varies(group: Group) -> bool:
    """The default filter: the group's rewards are not all equal (std > 0)."""
    return len(group.results) > 1 and statistics.pstdev(group.rewards) > 0


@dataclass
class DapoReport:
    prompts_submitted: int = 0
    jobs_submitted: int = 0
    groups_kept: int = 0
    groups_dropped: int = 0  # uniform reward (or rejected by the filter)
    groups_stale: int = 0  # produced by a policy older than max_staleness allows
    groups_token_stale: int = 0  # a token older than max_token_staleness allows
    jobs_cancelled: int = 0
    wall_s: float = 0.0
    waited_s: float = 0.0  # time spent blocked waiting for rollouts
    exhausted: bool = False  # the prompts ran out before B groups were kept
    # The oldest token's lag behind policy_version() of each kept rollout, when its group was
    # judged (None where the backend named no version); dapo_metrics gives its distribution.
    token_lags: list[int | None] = field(default_factory=list)


@dataclass
class _Pending:
    group: Group
    expected: int
    jobs: list[str]


async def collect_groups(
    client: RolloutClient,
    prompts: Iterable[dict[str, Any]],
    *,
    n: int,
    batch_size: int,
    max_in_flight: int,
    sampling_params: dict[str, Any] | None = None,
    timeout_s: float | None = None,
    keep: Callable[[Group], bool] = reward_varies,
    policy_version: Callable[[], int] | None = None,
    max_staleness: int | None = None,
    max_token_staleness: int | None = None,
) -> tuple[list[Group], DapoReport]:
    """Up to ``batch_size`` informative groups of ``n`` samples, and what it took.

    Staleness, with ``policy_version`` (the trainer's current version, a callable): a group
    submitted more than ``max_staleness`` versions ago is dropped (``groups_stale``); a group
    with a rollout whose oldest generated token is more than ``max_token_staleness`` versions
    behind when the group completes is dropped too (``groups_token_stale``: the versions the
    backend reported in the turn records, so ``policy_version`` must count as the backend does;
    a rollout whose backend named none is never stale). The kept rollouts' lags are in
    ``DapoReport.token_lags``. A prompt's n samples are one group on the server
    (``RolloutRequest.group``): the task is set up once and each sample starts from a fork.
    """
    if max_in_flight < n:
        raise ValueError(f"max_in_flight ({max_in_flight}) must hold at least one group (n={n})")
    if max_token_staleness is not None and policy_version is None:
        raise ValueError("max_token_staleness needs policy_version (the trainer's version)")
    report = DapoReport()
    start = time.perf_counter()
    source = iter(prompts)
    pending: dict[str, _Pending] = {}
    owner: dict[str, str] = {}  # job id -> group key
    results: asyncio.Queue[tuple[str, RolloutResult | BaseException]] = asyncio.Queue()
    waiters: dict[str, asyncio.Task[None]] = {}
    kept: list[Group] = []

    async def wait_for(job_id: str) -> None:
        try:
            results.put_nowait((job_id, await client.wait(job_id)))
        except asyncio.CancelledError:
            raise
        except Exception as e:
            results.put_nowait((job_id, e))

    async def submit_groups(tasks: list[dict[str, Any]]) -> None:
        requests, keys = [], []
        for task in tasks:
            key = uuid.uuid4().hex[:12]
            version = policy_version() if policy_version else None
            requests += [
                sample_request(
                    task, k, sampling_params, timeout_s, f"dapo-{key}-{k}", f"dapo-{key}"
                )
                for k in range(n)
            ]
            keys.append((key, task, version))
            for k in range(n):  # in flight from now, so the submitter counts them
                owner[f"dapo-{key}-{k}"] = key
        try:
            ids = await client.submit_batch(requests)
        except asyncio.CancelledError:
            # Stopped mid-request: the server may hold the jobs already (its answer is what was
            # lost), so they stay in flight for the cancels on the way out.
            raise
        except BaseException:
            for request in requests:
                owner.pop(str(request.job_id), None)
            raise
        for g, (key, task, version) in enumerate(keys):
            group_ids = ids[g * n : (g + 1) * n]
            pending[key] = _Pending(Group(dict(task), policy_version=version), n, group_ids)
            for job_id in group_ids:
                waiters[job_id] = asyncio.create_task(wait_for(job_id))
        report.prompts_submitted += len(tasks)
        report.jobs_submitted += len(requests)

    exhausted_source = False
    stopping = False
    slots_freed = asyncio.Event()

    async def submitter() -> None:
        """Submits whole groups whenever slots free up, while results are being judged."""
        nonlocal exhausted_source
        while len(kept) < batch_size and not stopping:
            tasks: list[dict[str, Any]] = []
            while len(owner) + (len(tasks) + 1) * n <= max_in_flight:
                task = next(source, None)
                if task is None:
                    exhausted_source = True
                    break
                tasks.append(task)
            if tasks:
                await submit_groups(tasks)
            if exhausted_source or stopping:
                return
            # No await between this check and the wait: a wake-up cannot be missed.
            slots_freed.clear()
            await slots_freed.wait()

    feeding = asyncio.create_task(submitter())
    try:
        while len(kept) < batch_size:
            if not owner and (feeding.done() or exhausted_source):
                break
            blocked = time.perf_counter()
            getter = asyncio.ensure_future(results.get())
            watch = {getter} if feeding.done() else {getter, feeding}
            done, _ = await asyncio.wait(watch, return_when=asyncio.FIRST_COMPLETED)
            report.waited_s += time.perf_counter() - blocked
            if getter not in done:
                getter.cancel()
                feeding.result()  # re-raise a failed submission
                continue
            job_id, outcome = getter.result()
            key = owner.pop(job_id)
            waiters.pop(job_id, None)
            if isinstance(outcome, BaseException):
                raise outcome
            entry = pending[key]
            entry.group.results.append(outcome)
            if len(entry.group.results) == entry.expected:
                del pending[key]
                _judge(
                    entry.group,
                    kept,
                    report,
                    keep,
                    policy_version,
                    (max_staleness, max_token_staleness),
                )
            slots_freed.set()
        report.exhausted = len(kept) < batch_size
    finally:
        # Let a submission in progress finish (cancelling it mid-request could leave jobs on the
        # server that nobody cancels); the submitter stops once the batch is full.
        stopping = True
        slots_freed.set()
        # Waited, not awaited: when every task is cancelled at once (asyncio.run leaving on an
        # exception), the submitter's CancelledError must not skip the cancels below.
        await asyncio.wait([feeding])
        if not feeding.cancelled():
            feeding.exception()  # retrieved; a failed submission was raised above
        leftover = list(owner)
        for task in waiters.values():
            task.cancel()
        await client.cancel_all(leftover)
        report.jobs_cancelled = len(leftover)
        report.wall_s = time.perf_counter() - start
    return kept[:batch_size], report


def _judge(
    group: Group,
    kept: list[Group],
    report: DapoReport,
    keep: Callable[[Group], bool],
    policy_version: Callable[[], int] | None,
    bounds: tuple[int | None, int | None],
) -> None:
    max_staleness, max_token_staleness = bounds
    now = policy_version() if policy_version is not None else None
    lags = [None if now is None else token_lag(r, now) for r in group.results]
    if (
        max_staleness is not None
        and now is not None
        and group.policy_version is not None
        and now - group.policy_version > max_staleness
    ):
        report.groups_stale += 1
    elif any(too_stale(lag, max_token_staleness) for lag in lags):
        report.groups_token_stale += 1
    elif keep(group):
        kept.append(group)
        report.groups_kept += 1
        report.token_lags += lags
    else:
        report.groups_dropped += 1
