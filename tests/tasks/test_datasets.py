from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from click.testing import CliRunner

from raas.cli import main
from raas.client.task_files import TaskFileError, read_tasks
from raas.tasks import TaskJob
from raas.tasks.datasets import BUNDLED, HARBOR_DIR, DatasetError, bundled
from raas.tasks.math import MathTask


def test_verl_parquet_rows_become_math_instances(tmp_path: Path) -> None:
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": "Tom has 3 apples and buys 4. How many?"}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": "7"},
            "extra_info": {"index": 11, "split": "train"},
        }
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    ((where, instance),) = read_tasks(path)
    # The row keeps its own data_source; the service runs it as math (raas.tasks.sources).
    assert where == f"{path}:1" and instance == {**rows[0], "instance_id": "openai/gsm8k-11"}
    task = MathTask()
    task.validate(TaskJob("j", instance, {}))
    assert task.messages(instance) == rows[0]["prompt"]


def test_jsonl_rows_requests_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    lines = [
        {"data_source": "math", "problem": "1+1", "answer": "2"},
        {"instance": {"data_source": "math", "problem": "2+2", "answer": "4"}, "job_id": "x"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    assert [task for _, task in read_tasks(path)] == lines
    path.write_text('{"problem": "no source"}\n{"data_source": "math", "problem": "own"}\n')
    with pytest.raises(TaskFileError, match=r"tasks\.jsonl:1: no data_source .*--task NAME"):
        read_tasks(path)
    # --task names the task of rows without one (SWE-Gym's); a row's own data_source wins.
    assert [t["data_source"] for _, t in read_tasks(path, "swe")] == ["swe", "math"]
    (tmp_path / "x.csv").write_text("a,b\n")
    with pytest.raises(TaskFileError, match=r"use \.jsonl, \.parquet or a Harbor task directory"):
        read_tasks(tmp_path / "x.csv")
    # A directory is a Harbor task, or a dataset of them: each one a harbor instance.
    harbor = read_tasks(HARBOR_DIR)
    assert [t["data_source"] for _, t in harbor] == ["harbor"] * 6
    assert harbor[0][0].endswith("create-file") and "task.toml" in harbor[0][1]["files"]
    # Named by its directory in tables and results (not by a job id's hash).
    assert harbor[0][1]["instance_id"] == "create-file"
    with pytest.raises(TaskFileError, match="holds no Harbor task"):
        read_tasks(tmp_path)
    with pytest.raises(TaskFileError, match="no such task file"):
        read_tasks(tmp_path / "missing.jsonl")


def test_bundled_sets() -> None:
    assert len(bundled("humaneval")) == 164 and len(bundled("countdown")) == 64
    for name in BUNDLED:
        items = bundled(name)
        assert items and all(item.get("data_source") for item in items), name
    demo = bundled("demo")
    assert sorted({d["data_source"] for d in demo}) == ["code", "math", "swe"]
    with pytest.raises(DatasetError, match="no bundled set 'nope'"):
        bundled("nope")
    with pytest.raises(DatasetError, match="did you mean 'humaneval'"):
        bundled("humanevl")


def test_datasets_cli(tmp_path: Path) -> None:
    runner = CliRunner()
    listing = runner.invoke(main, ["datasets", "list"])
    assert listing.exit_code == 0 and "humaneval   164" in listing.output
    assert max(map(len, listing.output.splitlines())) <= 80, listing.output  # swe's was 92
    out = tmp_path / "he.parquet"
    export = runner.invoke(main, ["datasets", "export", "humaneval", "--out", str(out)])
    assert export.exit_code == 0, export.output
    table = pq.read_table(out)
    assert table.num_rows == 164 and "entry_point" in table.column_names
    assert json.loads(table.column("task")[0].as_py())["data_source"] == "code"
