"""The token trajectories of a result that a trainer trains on: one a segment.

A job of raas's own agent loop has one trajectory. A gateway job (an agent program raas did not
write, ``raas.agent.gateway``) records its calls in *segments*: a call that extends an earlier
one continues its segment, any other (a compacted context, a sub-agent) starts a new one. The
result's ``trajectory`` is the first segment; ``metrics["segments"]`` holds them all, each a
trajectory of its own (prompt ids, response ids, loss mask, logprobs). A job of k segments is k
training samples that share the job's reward: ``segments="all"`` (the default of ``to_batch``,
the verl agent loop and the TRL adapter) gives all k, ``"first"`` the first only (what a
trainer saw before segments reached it), ``"last"`` the last (the agent's final context).
"""

from __future__ import annotations

from typing import Literal

from raas.wire import RolloutResult, Trajectory

SegmentChoice = Literal["all", "first", "last"]
SEGMENT_CHOICES: tuple[SegmentChoice, ...] = ("all", "first", "last")


def check_segments(segments: str) -> SegmentChoice:
    """``segments`` if it is one of the choices, else a ValueError naming them."""
    for choice in SEGMENT_CHOICES:
        if segments == choice:
            return choice
    raise ValueError(f"segments must be one of {', '.join(SEGMENT_CHOICES)}; got {segments!r}")


def trajectories(
    result: RolloutResult, segments: SegmentChoice = "all"
) -> list[tuple[int, Trajectory]]:
    """The trajectories of ``result`` to train on, each with its segment's index: its gateway
    segments as ``segments`` picks them, or its one trajectory (index 0: a job that recorded no
    segments, such as raas's own agent loop's, or a gateway job that failed before EVAL wrote
    its metrics)."""
    recorded = result.metrics.get("segments")
    if not isinstance(recorded, list) or len(recorded) < 2 or segments == "first":
        return [(0, result.trajectory)]  # the trajectory is the first segment
    if segments == "last":
        return [(len(recorded) - 1, Trajectory.model_validate(recorded[-1]))]
    return [(0, result.trajectory)] + [
        (k, Trajectory.model_validate(s)) for k, s in enumerate(recorded) if k
    ]
