"""Typed sandbox settings; the ``type`` field picks the provider."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

MiB = 1024 * 1024


class SandboxLimits(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    action_timeout_s: float = Field(
        default=120.0, gt=0, description="Default wall clock per action."
    )
    max_output_bytes: int = Field(
        default=64 * 1024, ge=256, description="Per action; head and tail kept."
    )
    memory_bytes: int | None = Field(
        default=4096 * MiB, description="Address space per process (RLIMIT_AS)."
    )
    max_processes: int | None = Field(
        default=256, description="Processes (RLIMIT_NPROC; per sandbox when raas runs as root)."
    )
    disk_bytes: int = Field(default=2048 * MiB, gt=0, description="Size of the workspace tmpfs.")
    tmp_bytes: int = Field(default=512 * MiB, gt=0, description="Size of the private /tmp.")
    start_timeout_s: float = Field(default=30.0, gt=0)


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    workdir: str = "/workspace"


class BwrapConfig(_Base):
    """bubblewrap: rootless namespaces, no network unless asked."""

    type: Literal["bwrap"] = "bwrap"
    image: Path | None = Field(
        default=None,
        description="A root filesystem directory; default: the host's /usr read-only.",
    )
    network: bool = False
    python: str = Field(
        default="python3", description="The image's Python that runs the action server."
    )
    uid_base: int = Field(
        default=1_200_000,
        description="When raas runs as root, each sandbox runs as its own host uid from here.",
    )


class LocalConfig(_Base):
    """No isolation at all: a plain subprocess in a temporary directory. Development only."""

    type: Literal["local"] = "local"
    python: str = "python3"


SandboxConfig = Annotated[BwrapConfig | LocalConfig, Field(discriminator="type")]
