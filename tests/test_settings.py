"""ServeSettings: its sources and their order, the pipeline's defaults, flags and back."""

from __future__ import annotations

from pathlib import Path

import pytest

from raas.pipeline import PipelineConfig, Stage
from raas.settings import (
    ServeSettings,
    SettingsError,
    load_settings,
    parse_flags,
    to_flags,
    validate,
)


def test_precedence_file_then_env_then_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "raas.toml"
    config.write_text('[serve]\nrun_workers = 3\neval_workers = 5\ninit_workers = 7\ndb = "x.db"\n')
    env = {"RAAS_EVAL_WORKERS": "11", "RAAS_INIT_WORKERS": "13", "RAAS_API_KEY": "k"}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("RAAS_LLM", "http://a:1, http://b:2")
    monkeypatch.setenv("RAAS_RUN_TIMEOUT_S", "none")
    settings = load_settings(config, {"init_workers": 17, "port": None})
    assert (settings.run_workers, settings.eval_workers, settings.init_workers) == (3, 11, 17)
    assert settings.db == Path("x.db") and settings.api_key == "k" and settings.port == 8000
    assert settings.llm == ["http://a:1", "http://b:2"] and settings.run_timeout_s is None
    cfg = PipelineConfig.from_settings(settings)
    assert cfg.workers[Stage.RUN] == 3 and cfg.queue_size[Stage.INIT] == 1024


def test_the_pipeline_s_defaults_are_the_settings_defaults() -> None:
    cfg, settings = PipelineConfig(), ServeSettings.model_construct()
    assert (
        cfg.workers
        == {Stage.INIT: 8, Stage.RUN: 8, Stage.EVAL: 8}
        == {stage: getattr(settings, f"{stage.value}_workers") for stage in Stage}
    )
    assert (cfg.job_timeout_s, cfg.cancel_grace_s) == (settings.timeout_s, settings.cancel_grace_s)


def test_flags_round_trip_through_the_settings() -> None:
    values = {"run_workers": 16, "llm": ["http://a:1", "http://b:2"], "sandbox": "local"}
    flags = to_flags(values)
    assert flags.count("--llm") == 2
    assert validate(parse_flags(flags)).model_dump(include=set(values)) == values


def test_bad_settings_name_the_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "raas.toml"
    config.write_text("run_wokers = 3\n")
    with pytest.raises(SettingsError, match="run_wokers"):
        load_settings(config, {})
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings(tmp_path / "missing.toml", {})
    monkeypatch.setenv("RAAS_EVAL_WORKERS", "zero")
    with pytest.raises(SettingsError, match="eval_workers"):
        load_settings(None, {})


def test_the_key_comes_from_a_file_or_the_environment_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    key_file = tmp_path / "raas.key"
    key_file.write_text("  file-key \n# a second line is not read\n")
    assert load_settings(None, {"api_key_file": key_file}).api_key == "file-key"
    monkeypatch.setenv("RAAS_API_KEY_FILE", str(key_file))
    assert load_settings(None, {}).api_key == "file-key"
    monkeypatch.setenv("RAAS_API_KEY", "env-key")
    with pytest.raises(SettingsError, match="give the API key once") as twice:
        load_settings(None, {})
    assert "env-key" not in str(twice.value)  # a check across settings echoes none of them
    monkeypatch.delenv("RAAS_API_KEY_FILE")
    assert load_settings(None, {}).api_key == "env-key"
    monkeypatch.delenv("RAAS_API_KEY")
    empty = tmp_path / "empty.key"
    empty.write_text("\n")
    for path, says in ((empty, "holds no API key"), (tmp_path / "none", "cannot read the API key")):
        with pytest.raises(SettingsError, match=says):
            validate({"api_key_file": path})


def test_allowed_hosts_come_comma_separated_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RAAS_ALLOWED_HOSTS", "raas.internal, node-7")
    assert load_settings(None, {}).allowed_hosts == ["raas.internal", "node-7"]


@pytest.mark.parametrize("name", ["agents_venv", "agents_node", "agent_files"])
def test_raas_serve_s_directory_flags_take_a_directory(name: str, tmp_path: Path) -> None:
    """`raas serve --agents-venv .venv-agents`, as the README gives it (its flag refused every
    directory once: 'is a directory')."""
    import click

    from raas.cli.serve import serve

    [option] = [p for p in serve.params if p.name == name]
    assert option.type.convert(str(tmp_path), option, None) == tmp_path
    (tmp_path / "file").touch()
    with pytest.raises(click.BadParameter, match="is a file"):
        option.type.convert(str(tmp_path / "file"), option, None)
    with pytest.raises(SettingsError, match="does not point to a directory"):
        load_settings(None, {name: tmp_path / "missing"})


def test_a_switch_round_trips_through_the_flags() -> None:
    flags = to_flags({"gateway_fixed_sampling": True})
    assert flags == ["--gateway-fixed-sampling", "True"]
    assert validate(parse_flags(flags)).gateway_fixed_sampling is True
    assert ServeSettings().gateway_fixed_sampling is False  # off unless asked for
