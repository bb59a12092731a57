"""Two runs side by side (``raas compare A B``): each run's figures by data_source and in all,
from its results, so that a trainer sees what a change of model, prompt or sampling did.

The figures are the trainer's own metrics (raas.client.metrics.rollout_metrics): the mean
reward and the pass rate over the scored rollouts (done, with a reward; a failure is no zero),
the mean response tokens and turns over the rollouts with a trajectory, the commonest stop
reason; and the failures (every result not done) by the kind of their error.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from raas.client.metrics import rollout_metrics
from raas.wire import RolloutResult

ALL = "all"  # the group of every data_source (a name no metric key holds: it is a label)
NO_ERROR = "unknown"  # the kind of a failure that names no error


@dataclass(frozen=True)
class Figures:
    """One run's figures over a group of its results (None: nothing to describe)."""

    jobs: int = 0
    mean_reward: float | None = None
    pass_rate: float | None = None
    response_tokens: float | None = None
    turns: float | None = None
    stop_reason: str | None = None
    stop_share: float | None = None  # of the jobs, the commonest stop reason's
    failures: dict[str, int] = field(default_factory=dict)  # by error kind

    @property
    def failed(self) -> int:
        return sum(self.failures.values())


@dataclass(frozen=True)
class Compared:
    """A group (a data_source, or ALL) in both runs."""

    group: str
    a: Figures
    b: Figures


def figures(results: Sequence[RolloutResult]) -> Figures:
    if not results:
        return Figures()
    metrics = rollout_metrics(results, prefix="")
    stops = {
        name.removeprefix("stop_reason/"): share
        for name, share in metrics.items()
        if name.startswith("stop_reason/")
    }
    # The commonest; of two as common, the first by name (the same table every time).
    top = min(stops, key=lambda reason: (-stops[reason], reason)) if stops else None
    failures = Counter(
        r.error.kind if r.error is not None else NO_ERROR for r in results if r.state != "done"
    )
    return Figures(
        jobs=len(results),
        mean_reward=metrics.get("reward_mean"),
        pass_rate=metrics.get("pass_rate"),
        response_tokens=metrics.get("response_tokens_mean"),
        turns=metrics.get("turns_mean"),
        stop_reason=top,
        stop_share=stops[top] if top is not None else None,
        failures=dict(sorted(failures.items())),
    )


def compare(a: Sequence[RolloutResult], b: Sequence[RolloutResult]) -> list[Compared]:
    """Each data_source of either run (by name), then every result (ALL); a run without a
    data_source has no jobs there. Of one data_source alone, that one only (ALL would repeat
    it)."""
    sources = sorted({r.data_source for r in (*a, *b)})
    groups = [
        Compared(
            source,
            figures([r for r in a if r.data_source == source]),
            figures([r for r in b if r.data_source == source]),
        )
        for source in sources
    ]
    if len(sources) == 1:
        return groups
    return [*groups, Compared(ALL, figures(a), figures(b))]
