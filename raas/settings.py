"""Settings of ``raas serve``: the one place a default lives.

``ServeSettings`` holds them by concern (``server``, ``pipeline``, ``auth``, ``http``,
``inference``, ``sandboxes``, ``agents``, ``tasks``, ``paths``, ``images``), and each consumer
takes its group.
Outside, they are flat: a setting's TOML key, its ``RAAS_<NAME>`` variable and its ``--flag``
are its name alone (names are unique across the groups), as they always were.

Sources, later ones winning: the defaults below, a TOML file (``--config``; flat keys or a
``[serve]`` table, whose group tables such as ``[serve.pipeline]`` are read too),
``RAAS_<NAME>`` environment variables, then flags. The ``serve`` command's options are generated
from these fields (``raas.cli.serve``), so its ``--help`` shows these defaults and descriptions;
deployments turn settings into flags with ``to_flags`` and read flags back with ``parse_flags``.
"""

from __future__ import annotations

import contextvars
import os
import tomllib
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    DirectoryPath,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings import SettingsError as SourceError

from raas.helpers.destinations import parse_destination
from raas.helpers.optional import without_none
from raas.llm.types import STALL_TIMEOUT_S
from raas.paths import ENV_PREFIX, HostPaths, ImageCaps, env_name
from raas.wire import BackendUrl

# Set for each server by a deployment (Slurm, Ray), never passed through to all of them.
PER_SERVER = frozenset({"host", "port", "db"})
# The groups whose settings `raas run` takes (its flags generated as `raas serve`'s) for the
# service it starts; the rest it sets itself (--llm, --model) or does without.
RUN_GROUPS = ("sandboxes", "agents", "tasks", "paths", "images")
SandboxName = Literal["bwrap", "local", "apptainer"]
LogLevel = Literal["debug", "info", "warning", "error"]


class SettingsError(ValueError):
    """Bad settings, in one line naming the key."""


# The TOML file of the settings being loaded (a source has no other way to get it).
_config_file: contextvars.ContextVar[Path | None] = contextvars.ContextVar("config", default=None)


class _TomlFile(PydanticBaseSettingsSource):
    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads the whole file at once

    def __call__(self) -> dict[str, Any]:
        path = _config_file.get()
        if path is None:
            return {}
        try:
            with open(path, "rb") as f:
                data = tomllib.load(f)
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise SettingsError(f"cannot read config file {path}: {e}") from e
        table = data.get("serve", data)
        if not isinstance(table, dict):
            return {}
        return _flat_table(table, path)


def _flat_table(table: dict[str, Any], path: Path) -> dict[str, Any]:
    """A config file's ``[serve]`` table with its groups' tables ([serve.pipeline]) read as their
    settings by name, as flat keys are. A setting in another group's table, or given twice (flat
    and in its table), is an error naming both: which one won would be a guess."""
    flat: dict[str, Any] = {}
    where: dict[str, str] = {}
    for key, value in table.items():
        if not (key in GROUPS and isinstance(value, dict)):
            if key in where:
                raise SettingsError(
                    f"{path}: {key} is given twice, in {where[key]} and [serve]: keep one"
                )
            flat[key], where[key] = value, "[serve]"
            continue
        for name, inner in value.items():
            group = GROUP_OF.get(name)
            if group is not None and group != key:
                raise SettingsError(
                    f"{path}: {name} is a setting of [serve.{group}], not [serve.{key}]"
                )
            if name in where:
                raise SettingsError(
                    f"{path}: {name} is given twice, in {where[name]} and [serve.{key}]: keep one"
                )
            flat[name], where[name] = inner, f"[serve.{key}]"
    return flat


class _FlatEnv(PydanticBaseSettingsSource):
    """``RAAS_<NAME>`` for every setting, whatever its group (pydantic-settings' own source
    would want ``RAAS_PIPELINE__RUN_WORKERS``). An empty variable is unset; ``none`` is None
    (``RAAS_RUN_TIMEOUT_S=none``); a list's variable is comma-separated (its validator splits
    it). Names are matched ignoring case, as pydantic-settings does."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        raise NotImplementedError  # __call__ reads every variable at once

    def __call__(self) -> dict[str, Any]:
        environ = {k.upper(): v for k, v in os.environ.items() if k.upper().startswith(ENV_PREFIX)}
        values: dict[str, Any] = {}
        for name in FIELDS:
            value = environ.get(env_name(name))
            if value:
                values[name] = None if value == "none" else value
        return values


class _Group(BaseModel):
    model_config = ConfigDict(extra="forbid")


def comma_separated(value: Any) -> Any:
    """A list from the environment: one string, comma-separated (a file or flags give a list)."""
    if isinstance(value, str):
        return [a.strip() for a in value.split(",") if a.strip()]
    return value


class ServerSettings(_Group):
    """Where the server listens, what it keeps its results in, what it logs."""

    host: str = Field(default="127.0.0.1", description="Address to bind.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to bind.")
    db: Path = Field(default=Path("raas.db"), description="SQLite file for durable results.")
    log_level: LogLevel = Field(default="info", description="Logging level.")


class PipelineSettings(_Group):
    """The stage pools, their queues and a job's time (``raas.pipeline.PipelineConfig`` is
    built from these)."""

    init_workers: int = Field(default=8, ge=1, description="Concurrent INIT stages (set-up).")
    run_workers: int = Field(
        default=8, ge=1, description="Concurrent RUN stages (agent loops; LLM slots)."
    )
    eval_workers: int = Field(default=8, ge=1, description="Concurrent EVAL stages (reward).")
    init_queue: int = Field(
        default=1024,
        ge=1,
        description="Jobs that may wait for INIT; beyond it a submit is 429 (with tenants, a"
        " tenant under its weighted share of these places is not refused: docs/api.md).",
    )
    run_queue: int = Field(
        default=64,
        ge=1,
        description="Jobs that may wait for RUN, those in INIT counted (INIT takes a job only"
        " with a place here).",
    )
    eval_queue: int = Field(
        default=64, ge=1, description="Jobs that may wait for EVAL, those in RUN counted."
    )
    timeout_s: float | None = Field(
        default=1800.0,
        gt=0,
        description="Per-job budget of time inside stages (queue waits do not count).",
    )
    init_timeout_s: float | None = Field(
        default=None, gt=0, description="Limit on the INIT stage alone."
    )
    run_timeout_s: float | None = Field(
        default=None, gt=0, description="Limit on the RUN stage alone."
    )
    eval_timeout_s: float | None = Field(
        default=None, gt=0, description="Limit on the EVAL stage alone."
    )
    cancel_grace_s: float = Field(
        default=5.0, ge=0, description="How long a cancelled stage may take to stop."
    )
    max_attempts: int = Field(
        default=2,
        ge=1,
        description="How many times a job may run: an infra failure (sandbox, backend, action"
        " server, judge, server restart) runs it again in a fresh sandbox; a policy one never.",
    )
    drain_grace_s: float = Field(
        default=30.0,
        ge=0,
        description="On SIGTERM, how long jobs in flight may finish before they are cancelled.",
    )


class AuthSettings(_Group):
    """Who may call the server: the admin's API key and the tenants."""

    api_key: str | None = Field(
        default=None,
        description="Require 'Authorization: Bearer KEY' on every route but /healthz. Without"
        " one the server binds only a loopback address. Give it as RAAS_API_KEY, in the --config"
        " file or in --api-key-file: as a flag, which ps shows every user of the machine, it is"
        " refused.",
    )
    api_key_file: Path | None = Field(
        default=None,
        description="A file holding the API key (its first line), which keeps it out of ps.",
    )
    tenants_file: Path | None = Field(
        default=None,
        description="A file of tenants (TOML, or JSON as .json): each its API keys' SHA-256"
        " digests, a weight and quotas. A tenant sees only its own jobs; the API key is the"
        " admin's, which sees all. Read again when it changes (or on SIGHUP). Needs an API key"
        " (RAAS_API_KEY), where a deployment's servers have theirs.",
    )


class HttpSettings(_Group):
    """What the HTTP front accepts."""

    allowed_hosts: list[str] = Field(
        default_factory=list,
        description="Names the server is reached by besides localhost, 127.0.0.1, ::1 and --host"
        " (a reverse proxy's, say): without an API key a request naming another Host is refused"
        " (DNS rebinding), and pages of these names may post to it. Repeatable; RAAS_ALLOWED_HOSTS:"
        " comma-separated.",
    )
    max_body_mb: float = Field(
        default=128.0,
        gt=0,
        description="Largest request body accepted, in MiB; a larger one is answered 413.",
    )
    max_connections: int | None = Field(
        default=None,
        ge=1,
        description="Open HTTP connections at most, at most half the open-file limit (which"
        " raas serve raises to its hard limit). Beyond it a new connection closes the one that"
        " has waited longest for a request's head (idle, or sending one slowly); when every one"
        " has a request in flight, the new one is answered 503. Default: half the open-file"
        " limit, at most 16384.",
    )
    head_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="How long a connection may take to send a request's head (from its opening,"
        " or from the end of its last response) before it is closed.",
    )

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return comma_separated(value)


class LlmSettings(_Group):
    """The inference servers and the model's tokenizer."""

    llm: list[BackendUrl] = Field(
        default_factory=list,
        description="An inference server to register at start (repeatable; RAAS_LLM:"
        " comma-separated).",
    )
    llm_protocol: Literal["vllm", "sglang", "verl"] = Field(
        default="vllm", description="Protocol of --llm and /add_llm_server servers."
    )
    llm_capacity: int = Field(
        default=8, ge=1, description="Sessions each --llm server is sized for."
    )
    llm_stream: bool = Field(
        default=True,
        description="Ask vllm-protocol servers to stream, so a running turn's tokens are"
        " counted as they come and a stalled server is told from a slow one; false: whole"
        " answers (about a tenth of the client CPU a token).",
    )
    llm_stall_timeout_s: float = Field(
        default=STALL_TIMEOUT_S,
        gt=0,
        description="A streamed generation that sends no token for this long has stalled: the"
        " request fails as the backend's and is retried or moved (a busy vLLM may queue a"
        " request for minutes before its first token).",
    )
    tokenizer: str = Field(
        default="smollm2",
        description="The served model's tokenizer: smollm2, tiny or a directory.",
    )

    @field_validator("llm", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return comma_separated(value)


class SandboxSettings(_Group):
    """The sandboxes tasks run in."""

    sandbox: SandboxName = Field(
        default="bwrap",
        description="Sandbox provider for agent tasks ('local' has no isolation; 'apptainer'"
        " runs --apptainer-image from --apptainer-images, see `raas images`).",
    )
    warm_sandboxes: int = Field(default=0, ge=0, description="Sandboxes kept started ahead.")
    max_snapshots: int = Field(
        default=64,
        ge=0,
        description="Per-turn snapshots kept for branches, for each tenant (each an idle fork"
        " of a sandbox, counted in the tenant's max_sandboxes; a tenant's oldest is evicted"
        " first, and only by its own).",
    )
    egress_allow: list[str] = Field(
        default_factory=list,
        description="Destinations a task that asks for the network (a Harbor task's"
        " allow_internet or network_mode) may reach through raas's HTTPS proxy, inside the"
        " task's allowed_hosts: HOST, HOST:PORT, IP:PORT or [IPV6]:PORT (no port: 443), names"
        " exact (no wildcards). The sandbox keeps no network of its own; a name that resolves"
        " to a loopback, private or link-local address is refused unless that address is"
        " listed. Empty (the default): such a task is refused. Repeatable; RAAS_EGRESS_ALLOW:"
        " comma-separated.",
    )
    egress_max_mb: float = Field(
        default=1024.0,
        gt=0,
        description="Bytes a job's sandbox may move through the egress proxy, both ways"
        " together, in MiB; past it its tunnels close.",
    )

    @field_validator("egress_allow", mode="before")
    @classmethod
    def _destinations(cls, value: Any) -> Any:
        entries = comma_separated(value)
        if isinstance(entries, list | tuple):  # flags give a tuple
            for entry in entries:
                parse_destination(entry)  # a ValueError naming the entry
        return entries


class AgentSettings(_Group):
    """Agent programs of harness tasks, and their gateway (``raas.tasks.services.TaskServices``
    takes these)."""

    agents_venv: DirectoryPath | None = Field(
        default=None,
        description="A virtual environment holding agent frameworks that harness tasks run"
        ' (`"agent": "mini-swe-agent"`); `make agents-venv` builds .venv-agents.',
    )
    agents_node: DirectoryPath | None = Field(
        default=None,
        description="A node environment holding the coding-agent CLIs from npm that harness tasks"
        ' run (`"agent": "qwen-code"`); `make agents-node` builds .agents-node. Its node_modules'
        " and the host's `node` are bound read-only into their sandboxes.",
    )
    agent_files: DirectoryPath | None = Field(
        default=None,
        description="A directory of your own agent's files for harness tasks: copied (links as"
        " links) and bound read-only into their sandboxes at $RAAS_AGENT_DIR, so that an"
        ' instance\'s agent_command can run it ("python3 $RAAS_AGENT_DIR/agent.py"). Everything'
        " in it is readable by the model's commands: put no secret there.",
    )
    gateway_fixed_sampling: bool = Field(
        default=False,
        description="Refuse a gateway call (an agent raas did not write) that sends a"
        " temperature, top_p or seed other than its job's: a 400 in OpenAI's shape naming the"
        " parameter, so that every token is drawn as the trainer asked. Off: the call's own"
        " values are used (and recorded on its turn).",
    )


# Directories no root may be: "/" would open every file the server can read, and these hold
# the kernel's files, whose sizes lie and whose reads may block or change the host.
_NO_ROOTS = ("/proc", "/sys", "/dev")


def checkpoint_turns(mode: str) -> int:
    """The turns between two checkpoints that the ``checkpoint`` setting says (0: none);
    ValueError saying what it may be."""
    text = mode.strip().lower()
    if text == "off":
        return 0
    if text == "turn":
        return 1
    every = text.removeprefix("every-")
    if every != text and every.isdigit() and int(every) >= 1:
        return int(every)
    raise ValueError(f"{mode!r} is none of off, turn, every-N (N a whole number of turns, >= 1)")


class TaskSettings(_Group):
    """What tasks may be named by on this host's file system (``raas.tasks.services.TaskServices``
    takes these)."""

    harbor_roots: list[DirectoryPath] = Field(
        default_factory=list,
        description="Directories a submission may name a Harbor task in by its path"
        ' (`{"data_source": "harbor", "path": "/data/tb2/hello"}`): the server reads the task'
        " directory, if it lies beneath one of these once every link is followed, into the"
        " job's instance at submission. Every tenant may name any task beneath them: put only"
        " shared datasets there. None (the default): a path is refused, and tasks come inline."
        " Repeatable; RAAS_HARBOR_ROOTS: comma-separated.",
    )

    checkpoint: str = Field(
        default="turn",
        description="When an agent job's turn boundary is made durable, so that a job in flight"
        " at a crash resumes there: `turn` (each turn), `every-N` (each N-th), `off` (a job runs"
        " again from the start). Its trajectory so far, its workspace's changes and its shell's"
        " directory and variables are written beside the database (DB.checkpoints/) off the"
        " model's path, and removed with the job's result.",
    )
    checkpoint_max_mb: float = Field(
        default=256.0,
        gt=0,
        allow_inf_nan=False,
        description="The most a job's checkpoint archives may hold on disk; past it, its later"
        " turns are not checkpointed (it resumes from the last one within it).",
    )

    @field_validator("checkpoint")
    @classmethod
    def _checkpoint_mode(cls, value: str) -> str:
        checkpoint_turns(value)
        return value.strip().lower()

    @property
    def checkpoint_every(self) -> int:
        """The turns between two checkpoints (0: none)."""
        return checkpoint_turns(self.checkpoint)

    @field_validator("harbor_roots", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        return comma_separated(value)

    @field_validator("harbor_roots")
    @classmethod
    def _not_the_host(cls, roots: list[Path]) -> list[Path]:
        for root in roots:
            real = os.path.realpath(root)
            if real == "/" or any(real == d or real.startswith(d + "/") for d in _NO_ROOTS):
                named = str(root) if str(root) == real else f"{root} ({real})"
                raise ValueError(
                    f"{named} cannot be a root: it would open the host's own files to every"
                    " tenant; name the directories of the datasets"
                )
        return roots


# The groups of ``ServeSettings``, by attribute, in the order of ``raas serve --help``.
GROUPS: dict[str, type[BaseModel]] = {
    "server": ServerSettings,
    "pipeline": PipelineSettings,
    "auth": AuthSettings,
    "http": HttpSettings,
    "inference": LlmSettings,
    "sandboxes": SandboxSettings,
    "agents": AgentSettings,
    "tasks": TaskSettings,
    "paths": HostPaths,
    "images": ImageCaps,
}
# Each setting's group, by its name (names are unique across the groups: the file's keys, the
# RAAS_<NAME> variables and the --flags are flat).
GROUP_OF: dict[str, str] = {
    name: group for group, model in GROUPS.items() for name in model.model_fields
}
RUN_SETTINGS = tuple(name for name, group in GROUP_OF.items() if group in RUN_GROUPS)
# A group's name is no setting's, so that {"inference": {...}} and {"llm": [...]} never mix.
assert not set(GROUPS) & set(GROUP_OF), "a settings group named like a setting"
FIELDS: dict[str, FieldInfo] = {
    name: GROUPS[group].model_fields[name] for name, group in GROUP_OF.items()
}


def nest(values: Mapping[str, Any]) -> dict[str, Any]:
    """Flat settings (``{"run_workers": 16}``) into their groups (``{"pipeline": {...}}``); a
    group may come whole too (a model or a dict), its settings named one by one winning; a name
    of no group passes as it is (``extra="forbid"`` names it)."""
    nested: dict[str, Any] = {}
    for key, value in values.items():
        group = GROUP_OF.get(key)
        if group is None and key in GROUPS and key in nested:  # after some of its settings
            whole = value.model_dump(exclude_unset=True) if isinstance(value, BaseModel) else value
            nested[key] = {**whole, **nested[key]}  # the settings named one by one win
        elif group is None:
            nested[key] = value
        else:
            inner = nested.setdefault(group, {})
            if isinstance(inner, BaseModel):  # a group given whole, then one of its settings
                inner = nested[group] = inner.model_dump(exclude_unset=True)
            inner[key] = value
    return nested


class ServeSettings(BaseSettings):
    """Every setting of ``raas serve``, by concern; each consumer takes its group."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, extra="forbid")

    server: ServerSettings = Field(default_factory=ServerSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    auth: AuthSettings = Field(default_factory=AuthSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    inference: LlmSettings = Field(default_factory=LlmSettings)
    sandboxes: SandboxSettings = Field(default_factory=SandboxSettings)
    agents: AgentSettings = Field(default_factory=AgentSettings)
    tasks: TaskSettings = Field(default_factory=TaskSettings)
    paths: HostPaths = Field(default_factory=HostPaths)
    images: ImageCaps = Field(default_factory=ImageCaps)

    @model_validator(mode="before")
    @classmethod
    def _nest(cls, values: Any) -> Any:
        return nest(values) if isinstance(values, Mapping) else values

    @model_validator(mode="after")
    def _key_from_file(self) -> ServeSettings:
        self.auth.api_key = one_key(self.auth.api_key, self.auth.api_key_file)
        return self

    def flat(self) -> dict[str, Any]:
        """Every setting by its (flat) name: what ``to_flags`` writes."""
        return {name: getattr(getattr(self, group), name) for name, group in GROUP_OF.items()}

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _FlatEnv(settings_cls), _TomlFile(settings_cls)


def one_key(api_key: str | None, api_key_file: Path | None) -> str | None:
    """The API key given as itself (RAAS_API_KEY) or in a file (--api-key-file), at most once:
    how ``raas serve`` and ``raas engine`` take theirs."""
    if api_key_file is None:
        return api_key
    key = read_key_file(api_key_file)
    # Validated again (model_validate does), the key read the first time is no second key.
    if api_key not in (None, key):
        raise ValueError("give the API key once: api_key (RAAS_API_KEY) or api_key_file")
    return key


def read_key_file(path: Path) -> str:
    """The key in ``path``: its first line, without the spaces around it."""
    try:
        with open(path, encoding="utf-8") as f:
            key = f.readline().strip()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read the API key from {path}: {e}") from e
    if not key:
        raise ValueError(f"{path} holds no API key (its first line is empty)")
    return key


def defaults() -> ServeSettings:
    """The defaults alone: no file, no environment."""
    return ServeSettings.model_construct()


def load_settings(
    config_file: Path | None = None, overrides: Mapping[str, Any] | None = None
) -> ServeSettings:
    """Merge the sources, later ones winning: defaults, TOML file, environment, ``overrides``
    (flags; a None or empty value means the flag was not given)."""
    given = {k: v for k, v in (overrides or {}).items() if v not in (None, ())}
    token = _config_file.set(config_file)
    try:
        return ServeSettings(**given)
    except ValidationError as e:
        raise SettingsError(f"invalid settings: {_problems(e)}") from e
    except SourceError as e:
        raise SettingsError(str(e)) from e
    finally:
        _config_file.reset(token)


def validate(values: Mapping[str, Any]) -> ServeSettings:
    """Settings from these values and the defaults alone (no file, no environment)."""
    try:
        return ServeSettings.model_validate(dict(values))
    except ValidationError as e:
        raise SettingsError(f"invalid settings: {_problems(e)}") from e


def _problems(e: ValidationError) -> str:
    return "; ".join(_problem(err) for err in e.errors())


def _problem(err: Any) -> str:
    if not err["loc"]:  # a check across fields: its input is every setting, the key included
        return str(err["msg"]).removeprefix("Value error, ")
    return f"{setting_of(err['loc'])}: {err['msg']} (got {err.get('input')!r})"


def setting_of(loc: Sequence[Any]) -> str:
    """The flat name of the setting an error's location points at (its group left out)."""
    parts = [str(p) for p in loc]
    if len(parts) > 1 and parts[0] in GROUPS:
        parts = parts[1:]
    return ".".join(parts)


# -- settings as command-line flags ------------------------------------------------------------


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def is_list(name: str) -> bool:
    annotation = FIELDS[name].annotation
    return typing.get_origin(annotation) is list


def to_flags(values: Mapping[str, Any]) -> list[str]:
    """``raas serve`` flags for settings named like ``ServeSettings`` fields (lists repeat the
    flag); ``parse_flags`` reads them back."""
    args: list[str] = []
    for name, value in values.items():
        if name not in FIELDS:
            raise SettingsError(f"{flag(name)}: not an option of raas serve (raas serve --help)")
        for v in value if isinstance(value, list | tuple) else [value]:
            if v is not None:
                args += [flag(name), str(v)]
    return args


def parse_flags(args: Sequence[str], extra: Sequence[str] = ()) -> dict[str, Any]:
    """``raas serve`` flags (``--run-workers 16``, ``--run-workers=16``) by field name; list
    fields collect their repeats. ``extra`` names flags that are not fields but are allowed
    (``config``). Values stay strings: ``validate`` types them."""
    values: dict[str, Any] = {}
    tokens = [a for a in args if a != "--"]
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if not token.startswith("--"):
            raise SettingsError(f"server options: expected a --flag, got {token!r}")
        name, eq, value = token[2:].partition("=")
        key = name.replace("-", "_")
        if key not in extra and key not in FIELDS:
            raise SettingsError(f"--{name}: not an option of raas serve (raas serve --help)")
        if not eq:
            if i + 1 >= len(tokens):
                raise SettingsError(f"--{name}: needs a value")
            i += 1
            value = tokens[i]
        if key in FIELDS and is_list(key):
            values.setdefault(key, []).append(value)
        else:
            values[key] = value
        i += 1
    return values


def choices(name: str) -> tuple[str, ...] | None:
    """The allowed values of a Literal field (for a Choice option), else None."""
    annotation = without_none(FIELDS[name].annotation)[0]
    if typing.get_origin(annotation) is Literal:
        return tuple(str(a) for a in typing.get_args(annotation))
    return None


def is_directory(name: str) -> bool:
    """Whether a path field names a directory (``DirectoryPath``): its flag takes one."""
    info = FIELDS[name]
    if isinstance(info.json_schema_extra, dict) and info.json_schema_extra.get("directory"):
        return True  # a directory made when needed (raas.paths.DIRECTORY)
    annotation = without_none(info.annotation)[0]
    if typing.get_origin(annotation) is list:  # a list of directories: its items'
        annotation = typing.get_args(annotation)[0]
    return any(getattr(m, "path_type", None) == "dir" for m in typing.get_args(annotation)[1:])


def scalar_type(name: str) -> type:
    """The Python type a flag's value converts to (a list field: its items')."""
    annotation = without_none(FIELDS[name].annotation)[0]
    if typing.get_origin(annotation) is list:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    return annotation if isinstance(annotation, type) else str
