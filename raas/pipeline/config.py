"""How big each stage is and how long a job may take."""

from __future__ import annotations

from dataclasses import dataclass, field

from raas.pipeline.states import Stage


@dataclass
class PipelineConfig:
    workers: dict[Stage, int] = field(
        default_factory=lambda: {Stage.INIT: 8, Stage.RUN: 8, Stage.EVAL: 8}
    )
    # How many jobs may wait for each stage. A full INIT queue turns submissions away (429); a
    # full RUN or EVAL queue makes the stage before it wait (backpressure), so a slow EVAL cannot
    # pile up unbounded jobs, each holding a sandbox.
    queue_size: dict[Stage, int] = field(
        default_factory=lambda: {Stage.INIT: 1024, Stage.RUN: 64, Stage.EVAL: 64}
    )
    # Budget of stage time per job (queue waits do not count); a request may set its own.
    job_timeout_s: float | None = 1800.0
    stage_timeout_s: dict[Stage, float | None] = field(
        default_factory=lambda: {Stage.INIT: None, Stage.RUN: None, Stage.EVAL: None}
    )
    # How long a cancelled stage may take to stop before it is abandoned.
    cancel_grace_s: float = 5.0
    cleanup_timeout_s: float = 60.0
    retry_after_s: int = 1

    def __post_init__(self) -> None:
        for stage in Stage:
            if self.workers.get(stage, 0) < 1:
                raise ValueError(f"{stage}_workers must be at least 1")
            if self.queue_size.get(stage, 0) < 1:
                raise ValueError(f"{stage}_queue must be at least 1")
            self.stage_timeout_s.setdefault(stage, None)
