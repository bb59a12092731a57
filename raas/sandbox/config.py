"""Typed sandbox settings; the ``type`` field picks the provider (``raas.sandbox.providers``)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, field_validator

from raas.images.store import default_store_dir
from raas.paths import HostPaths, host_paths

MiB = 1024 * 1024
TOP_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.+-]*")
OWN_DIRS = frozenset({"proc", "dev", "tmp", "sys", "etc", "usr", "workspace", ".raas"})


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
    sandbox_memory_bytes: int | None = Field(
        default=4096 * MiB,
        description="Memory of the sandbox as a whole, its tmpfs files included (a cgroup of"
        " bwrap and apptainer sandboxes, where raas can write cgroups: see raas.sandbox.cgroups).",
    )
    max_processes: int | None = Field(
        default=256, description="Processes (RLIMIT_NPROC; per sandbox when raas runs as root)."
    )
    sandbox_tasks: int | None = Field(
        default=1024,
        description="Processes and threads of the sandbox as a whole (a cgroup's pids.max; bwrap"
        " and apptainer, where raas can write cgroups).",
    )
    cpus: float | None = Field(
        default=None, gt=0, description="CPUs the sandbox may use as a whole (a cgroup's quota)."
    )
    disk_bytes: int = Field(default=2048 * MiB, gt=0, description="Size of the workspace tmpfs.")
    tmp_bytes: int = Field(default=512 * MiB, gt=0, description="Size of the private /tmp.")
    shm_bytes: int = Field(default=64 * MiB, gt=0, description="Size of /dev/shm (bwrap).")
    start_timeout_s: float = Field(default=30.0, gt=0)


class _Base(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    workdir: str = "/workspace"
    runtime_dir: Path | None = Field(
        default=None,
        description="The host directory for the sandboxes' sockets and files: a server's own"
        " (raas.sandbox.claim_runtime_dir); default: runtime_root(), shared by the user.",
    )


class _Namespaced(_Base):
    """What the providers of ``raas.sandbox.namespaced`` (bwrap, apptainer) both take."""

    python: str = Field(
        default="python3", description="The image's Python that runs the action server."
    )
    image_store: Path = Field(
        default_factory=default_store_dir,
        description="The image store's directory: where images named by tasks are looked up"
        " (default $RAAS_IMAGE_STORE, else oci in raas's cache).",
    )
    uid_base: int = Field(
        default=1_200_000,
        description="When raas runs as root, each sandbox runs as its own host uid from here.",
    )
    ro_binds: dict[str, str] = Field(
        default_factory=dict,
        description="Host paths (files or directories) bound read-only into the sandbox: host"
        " path -> absolute sandbox path. Put targets under /.raas (a directory of the sandbox's"
        " own; bwrap cannot make a mount point inside an image's read-only directories), e.g."
        " the Python packages of raas.sandbox.pydeps.package_binds.",
    )

    @field_validator("ro_binds")
    @classmethod
    def _absolute_targets(cls, binds: dict[str, str]) -> dict[str, str]:
        for host, target in binds.items():
            if not Path(host).is_absolute():
                raise ValueError(f"ro_binds: the host path {host!r} is not absolute")
            parts = Path(target).parts
            if not Path(target).is_absolute() or ".." in parts or len(parts) < 2:
                raise ValueError(f"ro_binds: {target!r} is not an absolute path below /")
        return binds


class BwrapConfig(_Namespaced):
    """bubblewrap: rootless namespaces, no network unless asked."""

    type: Literal["bwrap"] = "bwrap"
    image: Path | None = Field(
        default=None,
        description="A root filesystem directory; default: the host's /usr read-only.",
    )
    network: bool = False
    zygote: bool = Field(
        default=True,
        description="Fork each sandbox of the host's root (no image, no network) from a zygote"
        " of its template, which has already started Python and imported the action server"
        " (raas.sandbox.zygote), instead of starting them cold.",
    )
    tmpfs_dirs: tuple[str, ...] = Field(
        default=(),
        description="Top-level directories (/tests) the sandbox gets empty and writable, each a"
        " tmpfs of tmp_bytes over whatever the image has there (a judge's fork: ForkCarry).",
    )

    @field_validator("tmpfs_dirs")
    @classmethod
    def _top_level(cls, dirs: tuple[str, ...]) -> tuple[str, ...]:
        for path in dirs:
            name = path.removeprefix("/")
            if not path.startswith("/") or not TOP_NAME.fullmatch(name) or name in OWN_DIRS:
                raise ValueError(f"tmpfs_dirs: {path!r} is not a free top-level directory")
        return dirs


class LocalConfig(_Base):
    """No isolation at all: a plain subprocess in a temporary directory. Development only."""

    type: Literal["local"] = "local"
    python: str = "python3"


def default_images_dir() -> Path:
    """``$RAAS_APPTAINER_IMAGES``, else ``images`` in raas's cache (``$RAAS_CACHE_DIR``)."""
    return host_paths().images_dir()


class ApptainerConfig(_Namespaced):
    """Apptainer (or SingularityCE), as HPC sites run it: a SIF file or a sandbox directory.

    ``image`` (and any name given to ``resolve_image``) is a path, or a name looked up in
    ``image_map`` and then in ``images_dir``; see ``raas.images.sif_dir.resolve_image``.
    """

    type: Literal["apptainer"] = "apptainer"
    binary: str | None = Field(
        default=None,
        description="apptainer or singularity: a name on PATH or a path; default: the first of"
        " them on PATH.",
    )
    images_dir: Path = Field(
        default_factory=default_images_dir, description="A local directory of SIFs and sandboxes."
    )
    image_map: dict[str, str] = Field(
        default_factory=dict,
        description="Task image name (e.g. a SWE-bench docker image) -> file or directory name"
        " in images_dir, or an absolute path.",
    )
    # From the environment too, so that `raas serve --sandbox apptainer` needs no config file.
    image: str | None = Field(
        default_factory=lambda: host_paths().apptainer_image,
        description="The image sandboxes run (a name or a path; default $RAAS_APPTAINER_IMAGE).",
    )
    network: bool = False
    fakeroot: bool = Field(default=False, description="apptainer --fakeroot: root in a userns.")
    writable: Literal["tmpfs", "none"] = Field(
        default="tmpfs",
        description="The image's own files: 'tmpfs', writable through a private overlay that"
        " vanishes with the sandbox (--writable-tmpfs); 'none', read-only. The workspace and"
        " /tmp are writable either way.",
    )


SandboxConfig = Annotated[BwrapConfig | LocalConfig | ApptainerConfig, Field(discriminator="type")]
_sandbox_configs: TypeAdapter[SandboxConfig] = TypeAdapter(SandboxConfig)


def sandbox_types() -> list[str]:
    """The providers' ``type`` names, in the order of ``SandboxConfig``."""
    providers = get_args(get_args(SandboxConfig)[0])
    return [str(provider.model_fields["type"].default) for provider in providers]


def sandbox_config(
    name: str, runtime_dir: Path | None = None, paths: HostPaths | None = None
) -> SandboxConfig:
    """The config of provider ``name`` (its ``type``) with every default but ``runtime_dir``
    and, given ``paths`` (a server's settings), the image store and apptainer's images."""
    if name not in sandbox_types():
        known = ", ".join(sandbox_types())
        raise ValueError(f"unknown sandbox type {name!r}: the known types are {known}")
    values: dict[str, object] = {"type": name, "runtime_dir": runtime_dir}
    if paths is not None and name != "local":
        values["image_store"] = paths.store_dir()
    if paths is not None and name == "apptainer":
        values.update(images_dir=paths.images_dir(), image=paths.apptainer_image)
    return _sandbox_configs.validate_python(values)
