"""Settings of ``raas serve``: defaults, then a TOML file, then RAAS_* variables, then flags."""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from raas.pipeline.config import PipelineConfig
from raas.pipeline.states import Stage

ENV_PREFIX = "RAAS_"


class SettingsError(ValueError):
    pass


class ServeSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    db: Path = Path("raas.db")
    init_workers: int = Field(default=8, ge=1)
    run_workers: int = Field(default=8, ge=1)
    eval_workers: int = Field(default=8, ge=1)
    init_queue: int = Field(default=1024, ge=1)
    run_queue: int = Field(default=64, ge=1)
    eval_queue: int = Field(default=64, ge=1)
    timeout_s: float | None = Field(default=1800.0, gt=0)
    init_timeout_s: float | None = Field(default=None, gt=0)
    run_timeout_s: float | None = Field(default=None, gt=0)
    eval_timeout_s: float | None = Field(default=None, gt=0)
    cancel_grace_s: float = Field(default=5.0, ge=0)
    drain_grace_s: float = Field(default=30.0, ge=0)
    api_key: str | None = None
    llm: list[str] = Field(default_factory=list, description="Inference servers to register.")
    llm_protocol: Literal["vllm", "sglang", "verl"] = "vllm"
    llm_capacity: int = Field(default=8, ge=1)
    tokenizer: str = Field(default="smollm2", description="The served model's tokenizer.")
    sandbox: Literal["bwrap", "local", "apptainer"] = "bwrap"
    warm_sandboxes: int = Field(default=0, ge=0, description="Sandboxes started ahead.")
    log_level: str = "info"

    def pipeline_config(self) -> PipelineConfig:
        return PipelineConfig(
            workers={
                Stage.INIT: self.init_workers,
                Stage.RUN: self.run_workers,
                Stage.EVAL: self.eval_workers,
            },
            queue_size={
                Stage.INIT: self.init_queue,
                Stage.RUN: self.run_queue,
                Stage.EVAL: self.eval_queue,
            },
            job_timeout_s=self.timeout_s,
            stage_timeout_s={
                Stage.INIT: self.init_timeout_s,
                Stage.RUN: self.run_timeout_s,
                Stage.EVAL: self.eval_timeout_s,
            },
            cancel_grace_s=self.cancel_grace_s,
        )


def load_settings(
    config_file: Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ServeSettings:
    """Merge the sources, later ones winning: defaults, TOML file, environment, ``overrides``."""
    values: dict[str, Any] = {}
    if config_file is not None:
        try:
            with open(config_file, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SettingsError(f"cannot read config file {config_file}: {e}") from e
        # Accept both a flat file and one with a [serve] table.
        values.update(data.get("serve", data))
    env = os.environ if environ is None else environ
    for name in ServeSettings.model_fields:
        raw = env.get(ENV_PREFIX + name.upper())
        if raw is not None:
            if name == "llm":  # a list: comma-separated in the environment
                values[name] = [a for a in raw.split(",") if a.strip()]
            else:
                values[name] = None if raw.lower() in {"", "none"} else raw
    values.update({k: v for k, v in (overrides or {}).items() if v not in (None, ())})
    try:
        return ServeSettings(**values)
    except ValidationError as e:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in e.errors()
        )
        raise SettingsError(f"invalid settings: {problems}") from e
