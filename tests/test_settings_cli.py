from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.api.settings import SettingsError, load_settings
from raas.cli import main
from raas.pipeline import Stage


def test_precedence_file_then_env_then_flags(tmp_path: Path) -> None:
    config = tmp_path / "raas.toml"
    config.write_text('[serve]\nrun_workers = 3\neval_workers = 5\ninit_workers = 7\ndb = "x.db"\n')
    env = {"RAAS_EVAL_WORKERS": "11", "RAAS_INIT_WORKERS": "13", "RAAS_API_KEY": "k"}
    settings = load_settings(config, {"init_workers": 17, "port": None}, env)
    assert (settings.run_workers, settings.eval_workers, settings.init_workers) == (3, 11, 17)
    assert settings.db == Path("x.db") and settings.api_key == "k" and settings.port == 8000
    cfg = settings.pipeline_config()
    assert cfg.workers[Stage.RUN] == 3 and cfg.queue_size[Stage.INIT] == 1024


def test_bad_settings_name_the_key(tmp_path: Path) -> None:
    config = tmp_path / "raas.toml"
    config.write_text("run_wokers = 3\n")
    with pytest.raises(SettingsError, match="run_wokers"):
        load_settings(config, {}, {})
    with pytest.raises(SettingsError, match="eval_workers"):
        load_settings(None, {}, {"RAAS_EVAL_WORKERS": "zero"})
    with pytest.raises(SettingsError, match="cannot read config file"):
        load_settings(tmp_path / "missing.toml", {}, {})


def test_help_explains_the_commands() -> None:
    runner = CliRunner()
    top = runner.invoke(main, ["--help"])
    assert top.exit_code == 0
    for command in ("serve", "status", "submit", "export", "bench", "demo"):
        assert command in top.output
    serve = runner.invoke(main, ["serve", "--help"])
    assert "--run-workers" in serve.output and "RAAS_" in serve.output


def test_serve_refuses_bad_settings_with_a_usage_error() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "raas", "serve", "--run-workers", "0"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 2 and "run_workers" in run.stderr


def test_bench_names_what_exists() -> None:
    result = CliRunner().invoke(main, ["bench", "nope"])
    assert result.exit_code == 2 and "pipeline" in result.output
