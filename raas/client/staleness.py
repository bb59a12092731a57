"""How stale a rollout's tokens are: the lag of its oldest generated token's policy version
behind the trainer's current one.

Every turn record names the policy (weight) version its tokens were sampled under
(``raas.wire.POLICY_VERSION``), as the backend reported it; ``current`` must count in the same
numbering (raas's engine's ``weight_version``, SGLang's). A rollout whose backend said nothing
has no lag (None): it is never called stale, and it is counted apart in the metrics.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from raas.client.segments import trajectories
from raas.wire import RolloutResult


def oldest_version(result: RolloutResult) -> int | None:
    """The oldest policy version of any token the result generated (over every gateway
    segment), or None where no turn names one."""
    versions = [
        span[0]
        for _, traj in trajectories(result, "all")
        if (span := traj.policy_version_range()) is not None
    ]
    return min(versions) if versions else None


def token_lag(result: RolloutResult, current: int) -> int | None:
    """How many versions the result's oldest token is behind ``current`` (0: on-policy), or
    None where its versions are unknown."""
    oldest = oldest_version(result)
    return None if oldest is None else current - oldest


def too_stale(lag: int | None, max_staleness: int | None) -> bool:
    """Whether a lag is over the bound (an unknown lag never is)."""
    return max_staleness is not None and lag is not None and lag > max_staleness


def staleness_metrics(lags: Sequence[int | None], prefix: str = "staleness/") -> dict[str, float]:
    """The distribution of the oldest-token lags of a batch: ``known_frac`` (rollouts whose
    backend named versions), and over those ``mean``, ``p50``, ``p90``, ``max`` and
    ``on_policy_frac`` (lag 0). Nothing but ``known_frac`` where no lag is known (and nothing
    at all for an empty batch)."""
    if not lags:
        return {}
    known = np.array([lag for lag in lags if lag is not None], dtype=np.float64)
    metrics = {"known_frac": len(known) / len(lags)}
    if known.size:
        metrics |= {
            "mean": float(known.mean()),
            "p50": float(np.percentile(known, 50)),
            "p90": float(np.percentile(known, 90)),
            "max": float(known.max()),
            "on_policy_frac": float((known == 0).mean()),
        }
    return {prefix + name: value for name, value in metrics.items()}
