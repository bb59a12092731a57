"""A Harbor task's ``task.toml``, read strictly: schema versions 1.0 and 1.1.

Harbor's own reader ignores keys it does not know; raas refuses them, naming the key, so that a
misspelt timeout or cap is an error at submission instead of a default silently taken. The
sections and their keys are Harbor's (1.0 files say ``version``, 1.1 files ``schema_version``);
what raas cannot honour is refused here in one line naming the key (GPUs, MCP servers, a user
to run as, environment values taken from the host), and what it honours is mapped to its own
caps by ``HarborConfig.limits``.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from typing import Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator, model_validator

from raas.helpers.destinations import parse_destination

MiB = 1024 * 1024
VERSIONS = ("1.0", "1.1")
# An env value Harbor would fill from the host's environment (${VAR}, ${VAR:-default}): raas
# never hands a task file the host's variables (they may hold the server's secrets).
HOST_TEMPLATE = re.compile(r"\$\{[^}]*\}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class _HasEnv(_Strict):
    """A section's ``env``: variables set for what runs in that phase, values as written."""

    env: dict[str, StrictStr] = Field(default_factory=dict)

    @field_validator("env")
    @classmethod
    def _own_values(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if HOST_TEMPLATE.search(value):
                raise ValueError(
                    f"{name}: ${{...}} takes a value from the host's environment, which raas"
                    " never gives a task; write the value itself"
                )
        return env


class Author(_Strict):
    name: StrictStr
    email: StrictStr | None = None


class PackageInfo(_Strict):
    """``[task]``: the task's name in Harbor's registry (``org/name``)."""

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")
    description: StrictStr = ""
    authors: list[Author] = Field(default_factory=list)
    keywords: list[StrictStr] = Field(default_factory=list)


NetworkMode = Literal["public", "no-network", "allowlist"]


@dataclass(frozen=True)
class NetworkAsk:
    """What a phase of a task asks of the network: all of it (``public``), these ``hosts``
    (``allowlist``), or nothing (neither)."""

    public: bool = False
    hosts: tuple[str, ...] = ()

    def __bool__(self) -> bool:
        return self.public or bool(self.hosts)


OFFLINE = NetworkAsk()


def _ask(mode: NetworkMode | None, hosts: list[str]) -> NetworkAsk | None:
    """A section's network_mode and allowed_hosts as an ask; None where it says neither."""
    if mode == "public":
        return NetworkAsk(public=True)
    if mode == "no-network":
        return OFFLINE
    if mode == "allowlist" or hosts:
        return NetworkAsk(hosts=tuple(hosts))
    return None


class _Network(_Strict):
    """A section's network policy: a mode, and the hosts of an allowlist (each ``HOST`` or
    ``HOST:PORT``)."""

    network_mode: NetworkMode | None = None
    allowed_hosts: list[StrictStr] = Field(default_factory=list)

    @field_validator("allowed_hosts")
    @classmethod
    def _hosts(cls, hosts: list[str]) -> list[str]:
        for host in hosts:
            parse_destination(host, default_port=None)  # a ValueError naming it
        return hosts

    @model_validator(mode="after")
    def _an_allowlist_names_hosts(self) -> Self:
        if self.network_mode == "allowlist" and not self.allowed_hosts:
            raise ValueError("network_mode allowlist names no allowed_hosts")
        return self


class _Phase(_Network):
    """What ``[verifier]`` and ``[agent]`` share: a user to run as and a network policy (the
    environment's, for the agent, where the section says none)."""

    user: StrictStr | int | None = None

    @field_validator("user")
    @classmethod
    def _own_user(cls, user: str | int | None) -> str | int | None:
        if user not in (None, "root", 0):
            raise ValueError(
                "raas runs each sandbox as its own unprivileged user; a task cannot name another"
            )
        return user


class VerifierConfig(_Phase, _HasEnv):
    timeout_sec: float = Field(default=600.0, gt=0)


class AgentConfig(_Phase):
    timeout_sec: float | None = Field(default=None, gt=0)


class SolutionConfig(_HasEnv):
    pass


class HealthcheckConfig(_Strict):
    """A command that must pass before the agent starts (Docker's HEALTHCHECK, Harbor's)."""

    command: StrictStr = Field(min_length=1)
    interval_sec: float = Field(default=5.0, gt=0)
    timeout_sec: float = Field(default=30.0, gt=0)
    start_period_sec: float = Field(default=0.0, ge=0)
    start_interval_sec: float = Field(default=5.0, gt=0)
    retries: int = Field(default=3, ge=1)


class EnvironmentConfig(_HasEnv, _Network):
    build_timeout_sec: float = Field(default=600.0, gt=0)
    docker_image: StrictStr | None = None
    cpus: int = Field(default=1, ge=1)
    memory_mb: int = Field(default=2048, ge=64)
    storage_mb: int = Field(default=10240, ge=16)
    gpus: int = Field(default=0, ge=0)
    gpu_types: list[StrictStr] | None = None
    allow_internet: bool = True
    mcp_servers: list[dict[str, Any]] = Field(default_factory=list)
    skills_dir: StrictStr | None = None
    healthcheck: HealthcheckConfig | None = None
    # 1.0's spellings of the caps ("2G", "512M"), read as memory_mb and storage_mb.
    memory: StrictStr | None = None
    storage: StrictStr | None = None

    @field_validator("gpus")
    @classmethod
    def _no_gpus(cls, gpus: int) -> int:
        if gpus:
            raise ValueError("raas's sandboxes have no GPU; a task that needs one cannot run here")
        return gpus

    @field_validator("mcp_servers")
    @classmethod
    def _no_mcp(cls, servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if servers:
            raise ValueError("MCP servers for the agent are not supported by raas")
        return servers

    @field_validator("memory", "storage")
    @classmethod
    def _size(cls, size: str | None) -> str | None:
        if size is not None:
            _megabytes(size)
        return size

    @model_validator(mode="after")
    def _old_sizes(self) -> Self:
        if self.memory is not None:
            object.__setattr__(self, "memory_mb", _megabytes(self.memory))
        if self.storage is not None:
            object.__setattr__(self, "storage_mb", _megabytes(self.storage))
        return self

    @property
    def network(self) -> NetworkAsk:
        """What the task asks of the network: its network_mode (and allowed_hosts), else
        ``allow_internet = true`` written out. Harbor's default (true, unsaid) is not asking:
        such a task runs offline, as every raas sandbox does."""
        said = _ask(self.network_mode, self.allowed_hosts)
        if said is not None:
            return said
        asked = "allow_internet" in self.model_fields_set and self.allow_internet
        return NetworkAsk(public=True) if asked else OFFLINE


def _megabytes(size: str) -> int:
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG])\s*", size.upper())
    if match is None:
        raise ValueError(f"{size!r} is not a size like 512M or 2G")
    number, unit = float(match.group(1)), match.group(2)
    return max(1, int(number * {"K": 1 / 1024, "M": 1, "G": 1024}[unit]))


class HarborConfig(_Strict):
    """``task.toml``."""

    schema_version: Literal["1.0", "1.1"] = "1.1"
    task: PackageInfo | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)
    verifier: VerifierConfig = Field(default_factory=VerifierConfig)
    agent: AgentConfig = Field(default_factory=AgentConfig)
    environment: EnvironmentConfig = Field(default_factory=EnvironmentConfig)
    solution: SolutionConfig = Field(default_factory=SolutionConfig)
    source: StrictStr | None = None

    @model_validator(mode="before")
    @classmethod
    def _version(cls, data: Any) -> Any:
        """1.0 spells it ``version``; a file that gives both is ambiguous."""
        if isinstance(data, dict) and "version" in data:
            if "schema_version" in data:
                raise ValueError("give version (1.0) or schema_version (1.1), not both")
            data = {**data, "schema_version": data["version"]}
            del data["version"]
        return data

    @classmethod
    def from_toml(cls, text: str) -> HarborConfig:
        """Raises ValueError (TOML syntax) or pydantic's ValidationError (a key or value)."""
        return cls.model_validate(tomllib.loads(text))

    @property
    def agent_network(self) -> NetworkAsk:
        """The agent's: ``[agent]``'s network policy, else the environment's."""
        said = _ask(self.agent.network_mode, self.agent.allowed_hosts)
        return self.environment.network if said is None else said

    @property
    def verifier_network(self) -> NetworkAsk:
        """The verifier's: ``[verifier]``'s own alone (raas's choice: test.sh runs offline
        unless the task says it needs the network for it)."""
        return _ask(self.verifier.network_mode, self.verifier.allowed_hosts) or OFFLINE

    def limits_update(self) -> dict[str, Any]:
        """The task's caps as raas's sandbox limits' fields: its CPUs, its memory (the
        sandbox's as a whole; a process's address space keeps raas's own cap), its storage (the
        tmpfs that holds what the sandbox writes over its image)."""
        env = self.environment
        return {
            "cpus": float(env.cpus),
            "sandbox_memory_bytes": env.memory_mb * MiB,
            "disk_bytes": env.storage_mb * MiB,
        }
