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
    pipeline = settings.pipeline
    assert (pipeline.run_workers, pipeline.eval_workers, pipeline.init_workers) == (3, 11, 17)
    assert settings.server.db == Path("x.db") and settings.server.port == 8000
    assert settings.auth.api_key == "k" and pipeline.run_timeout_s is None
    assert settings.inference.llm == ["http://a:1", "http://b:2"]
    cfg = PipelineConfig.from_settings(pipeline)
    assert cfg.workers[Stage.RUN] == 3 and cfg.queue_size[Stage.INIT] == 1024


def test_the_pipeline_s_defaults_are_the_settings_defaults() -> None:
    cfg, settings = PipelineConfig(), ServeSettings.model_construct().pipeline
    assert (
        cfg.workers
        == {Stage.INIT: 8, Stage.RUN: 8, Stage.EVAL: 8}
        == {stage: getattr(settings, f"{stage.value}_workers") for stage in Stage}
    )
    assert (cfg.job_timeout_s, cfg.cancel_grace_s) == (settings.timeout_s, settings.cancel_grace_s)
    assert cfg == PipelineConfig.from_settings(settings)


def test_flags_round_trip_through_the_settings() -> None:
    values = {"run_workers": 16, "llm": ["http://a:1", "http://b:2"], "sandbox": "local"}
    flags = to_flags(values)
    assert flags.count("--llm") == 2
    flat = validate(parse_flags(flags)).flat()
    assert {k: flat[k] for k in values} == values


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
    assert load_settings(None, {"api_key_file": key_file}).auth.api_key == "file-key"
    monkeypatch.setenv("RAAS_API_KEY_FILE", str(key_file))
    assert load_settings(None, {}).auth.api_key == "file-key"
    monkeypatch.setenv("RAAS_API_KEY", "env-key")
    with pytest.raises(SettingsError, match="give the API key once") as twice:
        load_settings(None, {})
    assert "env-key" not in str(twice.value)  # a check across settings echoes none of them
    monkeypatch.delenv("RAAS_API_KEY_FILE")
    assert load_settings(None, {}).auth.api_key == "env-key"
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
    assert load_settings(None, {}).http.allowed_hosts == ["raas.internal", "node-7"]


def test_the_egress_allow_list_is_empty_by_default_and_read_strictly(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings(None, {}).sandboxes.egress_allow == []
    monkeypatch.setenv("RAAS_EGRESS_ALLOW", "pypi.org:443, files.pythonhosted.org:443")
    allowed = load_settings(None, {}).sandboxes.egress_allow
    assert allowed == ["pypi.org:443", "files.pythonhosted.org:443"]
    with pytest.raises(SettingsError, match=r"egress_allow: .*'pypi\.org@evil\.test'"):
        validate({"egress_allow": ["pypi.org", "pypi.org@evil.test"]})


def test_a_bad_egress_destination_flag_is_a_one_line_error_before_the_server_starts() -> None:
    """The flag's values come as a tuple: they are read as strictly as the file's (a URL for a
    host was a traceback at the server's start)."""
    from click.testing import CliRunner

    from raas.cli import main

    said = CliRunner().invoke(main, ["serve", "--egress-allow", "http://pypi.org", "--port", "1"])
    assert said.exit_code == 2, said.output
    assert "egress_allow: Value error, 'http://pypi.org': only a host" in said.output
    assert "Traceback" not in said.output


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
    assert validate(parse_flags(flags)).agents.gateway_fixed_sampling is True
    assert ServeSettings().agents.gateway_fixed_sampling is False  # off unless asked for


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "[serve]\nrun_workers = 3\n[serve.pipeline]\nrun_workers = 2\n",
            r"run_workers is given twice, in \[serve\] and \[serve.pipeline\]: keep one",
        ),
        (
            "[serve.pipeline]\ntokenizer = 'x'\n",
            r"tokenizer is a setting of \[serve.inference\], not \[serve.pipeline\]",
        ),
    ],
)
def test_a_setting_twice_or_in_another_groups_table_names_both(
    tmp_path: Path, text: str, error: str
) -> None:
    # Which of two values won would be a guess (the group's table did, silently).
    config = tmp_path / "raas.toml"
    config.write_text(text)
    with pytest.raises(SettingsError, match=f"^{config}: {error}$"):
        load_settings(config, {})


def test_each_setting_is_flat_outside_and_in_its_group_inside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setting's file key, variable and flag are its name alone, whatever its group; a group's
    TOML table ([serve.pipeline]) is read as flat keys are."""
    config = tmp_path / "raas.toml"
    config.write_text("[serve]\nport = 9000\n[serve.pipeline]\nrun_workers = 5\n")
    monkeypatch.setenv("RAAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("RAAS_APPTAINER_IMAGE", "my-env")
    settings = load_settings(config, {"sandbox": "apptainer", "drain_grace_s": 7})
    assert settings.server.port == 9000 and settings.pipeline.run_workers == 5
    assert settings.pipeline.drain_grace_s == 7 and settings.sandboxes.sandbox == "apptainer"
    assert settings.paths.store_dir() == tmp_path / "cache" / "oci"
    assert settings.paths.images_dir() == tmp_path / "cache" / "images"
    assert settings.paths.apptainer_image == "my-env"
    assert to_flags({"cache_dir": "/c"}) == ["--cache-dir", "/c"]
    with pytest.raises(SettingsError, match=r"^invalid settings: run_workers: "):
        validate({"run_workers": 0})


def test_every_setting_has_one_name_and_one_default() -> None:
    """No two groups declare the same setting, and no group is named like a setting."""
    from raas.settings import FIELDS, GROUP_OF, GROUPS

    declared = [name for model in GROUPS.values() for name in model.model_fields]
    assert len(declared) == len(set(declared)) == len(FIELDS) == len(GROUP_OF)
    assert not set(GROUPS) & set(FIELDS)


def test_the_libraries_read_the_same_variables_as_the_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from raas.images.store import default_store_dir
    from raas.llm.models import cache_dir
    from raas.sandbox.config import ApptainerConfig

    monkeypatch.setenv("RAAS_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RAAS_IMAGE_STORE", raising=False)
    monkeypatch.delenv("RAAS_APPTAINER_IMAGES", raising=False)
    assert cache_dir() == tmp_path and default_store_dir() == tmp_path / "oci"
    assert ApptainerConfig().images_dir == tmp_path / "images"
    monkeypatch.setenv("RAAS_IMAGE_STORE", str(tmp_path / "store"))
    assert default_store_dir() == load_settings(None, {}).paths.store_dir() == tmp_path / "store"


def test_a_group_given_whole_yields_to_its_settings_named_one_by_one() -> None:
    from raas.paths import HostPaths

    for values in (
        {"paths": HostPaths(cache_dir=Path("/a"), image_store=Path("/s")), "cache_dir": "/b"},
        {"cache_dir": "/b", "paths": {"cache_dir": "/a", "image_store": "/s"}},
    ):
        paths = validate(values).paths
        assert (paths.cache_dir, paths.image_store) == (Path("/b"), Path("/s"))


def test_the_image_caps_are_settings_and_read_as_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAAS_LAYER_MAX_BYTES", "512M")
    settings = load_settings(None, {"image_max_entries": "7"})
    assert settings.images.layer_max_bytes == 512 << 20 and settings.images.image_max_entries == 7
    with pytest.raises(SettingsError, match="layer_max_entries"):
        validate({"layer_max_entries": 0})


def test_raas_run_takes_the_service_s_settings_as_raas_serve_s_options(tmp_path: Path) -> None:
    """raas run's options for the service it starts are generated from the same settings as
    raas serve's (no copy of their names, types or help); with --url they are refused."""
    from click.testing import CliRunner

    from raas.cli import main
    from raas.cli.run import run
    from raas.cli.serve import serve
    from raas.settings import RUN_SETTINGS

    def described(command: object) -> dict[str, tuple[object, ...]]:
        params = command.params  # type: ignore[attr-defined]
        return {p.name: (p.opts, p.help, p.multiple) for p in params if p.name in RUN_SETTINGS}

    assert {"agents_venv", "sandbox", "cache_dir", "layer_max_bytes"} <= set(RUN_SETTINGS)
    assert described(run) == described(serve) and len(described(run)) == len(RUN_SETTINGS)
    tasks = tmp_path / "t.jsonl"
    tasks.write_text("")
    said = CliRunner().invoke(
        main, ["run", str(tasks), "--url", "http://x:1", "--sandbox", "local"]
    )
    assert said.exit_code == 2 and "--sandbox: settings of the service started here" in said.output
