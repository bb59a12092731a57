"""`raas compare A B`: two runs' results side by side, read from the files `raas run --out` and
`raas export` write; the table's numbers, and one line naming FILE:LINE for what cannot be read."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from raas.cli import main
from raas.client.task_files import write_results
from raas.store.export import write_jsonl
from raas.wire import ErrorInfo, ErrorKind, ExportedResult, RolloutResult, Timing, Trajectory


def result(
    job_id: str,
    data_source: str,
    reward: float | None = None,
    tokens: int = 0,
    turns: int = 0,
    stop: str | None = None,
    error: ErrorKind | None = None,  # the kind of the error that failed it
) -> RolloutResult:
    return RolloutResult(
        job_id=job_id,
        state="failed" if error else "done",
        error=ErrorInfo(type="Boom", message="boom", kind=error) if error else None,
        reward=reward,
        data_source=data_source,
        trajectory=Trajectory(
            prompt_ids=[1],
            response_ids=[7] * tokens,
            loss_mask=[1] * tokens,
            logprobs=[0.0] * tokens,
            turns=[{"output_tokens": 1}] * turns,
            stop_reason=stop,
        ),
        timing=Timing(queue_s=0, init_s=0, run_s=0, eval_s=0, total_s=0),
    )


# Run A (as raas run --out writes it) and run B (as raas export does: rows naming a tenant).
A = [
    result("a1", "math", 1.0, tokens=10, turns=1, stop="finish"),
    result("a2", "math", 0.0, tokens=20, turns=2, stop="finish"),
    result("a3", "math", 1.0, tokens=30, turns=3, stop="max_turns"),
    result("a4", "math", error="infra"),
    result("a5", "code", 0.5, tokens=6, turns=1, stop="finish"),
    result("a6", "code", tokens=2, turns=1, error="policy"),
]
B = [
    *(result(f"b{i}", "math", 1.0, tokens=40, turns=2, stop="finish") for i in range(4)),
    result("b5", "code", 1.0, tokens=5, turns=1, stop="max_turns"),
]


def cells(output: str) -> dict[tuple[str, str], list[str]]:
    """The table's values by (data_source, figure): A, B and B-A."""
    found, group = {}, ""
    for line in output.splitlines():
        parts = re.split(r"\s{2,}", line.strip())
        if len(parts) == 5:
            group = parts.pop(0)
        if len(parts) == 4 and parts[0] not in ("", "data_source"):
            found[group, parts[0]] = parts[1:]
    return found


def test_compare_puts_two_runs_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    write_results(A, Path("a") / "results.jsonl")  # a run's folder
    write_jsonl([ExportedResult(**dict(r), tenant="alice") for r in B], Path("b.jsonl"))
    run = CliRunner().invoke(main, ["compare", "a", "b.jsonl"])
    assert run.exit_code == 0, run.output
    assert run.output.startswith("A: a (6 results)\nB: b.jsonl (5 results)\n"), run.output
    assert max(len(line) for line in run.output.splitlines()) <= 80, run.output
    # Rewards over the scored jobs (a failure is no 0), tokens and turns over every job with a
    # trajectory (a4 failed before any: 0 of each), stop reasons' shares of every job.
    assert cells(run.output) == {
        ("code", "jobs"): ["2", "1", "-1"],
        ("code", "mean reward"): ["0.500", "1.000", "+0.500"],
        ("code", "pass rate"): ["0.0%", "100.0%", "+100.0%"],
        ("code", "response tokens"): ["4.0", "5.0", "+1.0"],
        ("code", "turns"): ["1.00", "1.00", "+0.00"],
        ("code", "stop reason"): ["finish 50%", "max_turns 100%", "other"],
        ("code", "failed"): ["1", "0", "-1"],
        ("code", "policy"): ["1", "0", "-1"],
        ("math", "jobs"): ["4", "4", "+0"],
        ("math", "mean reward"): ["0.667", "1.000", "+0.333"],
        ("math", "pass rate"): ["66.7%", "100.0%", "+33.3%"],
        ("math", "response tokens"): ["15.0", "40.0", "+25.0"],
        ("math", "turns"): ["1.50", "2.00", "+0.50"],
        ("math", "stop reason"): ["finish 50%", "finish 100%", "same"],
        ("math", "failed"): ["1", "0", "-1"],
        ("math", "infra"): ["1", "0", "-1"],
        ("all", "jobs"): ["6", "5", "-1"],
        ("all", "mean reward"): ["0.625", "1.000", "+0.375"],
        ("all", "pass rate"): ["50.0%", "100.0%", "+50.0%"],
        ("all", "response tokens"): ["11.3", "33.0", "+21.7"],
        ("all", "turns"): ["1.33", "1.80", "+0.47"],
        ("all", "stop reason"): ["finish 50%", "finish 80%", "same"],
        ("all", "failed"): ["2", "0", "-2"],
        ("all", "infra"): ["1", "0", "-1"],
        ("all", "policy"): ["1", "0", "-1"],
    }


def test_a_run_of_one_data_source_has_no_all_and_a_missing_figure_is_a_dash(
    tmp_path: Path,
) -> None:
    write_results([result("a", "math", error="infra")], tmp_path / "a.jsonl")
    write_results(
        [result("b", "math", 1.0, tokens=3, turns=1, stop="finish")], tmp_path / "b.jsonl"
    )
    run = CliRunner().invoke(
        main, ["compare", str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")]
    )
    assert run.exit_code == 0, run.output
    table = cells(run.output)
    assert {group for group, _ in table} == {"math"}  # all would say the same again
    assert table["math", "mean reward"] == ["-", "1.000", "-"]  # A scored nothing
    assert table["math", "failed"] == ["1", "0", "-1"]


def test_what_cannot_be_read_is_one_line_naming_the_file_and_line(tmp_path: Path) -> None:
    good = tmp_path / "good.jsonl"
    write_results(A, good)
    line = good.read_text().splitlines()[0]
    cases = {
        "missing.jsonl": (None, "no such results file: {path}"),
        "torn.jsonl": (
            f'{line}\n{{"job_id": 1,}}\n',
            "{path}:2: not JSON: Expecting property name enclosed in double quotes at column 14",
        ),
        "partial.jsonl": (
            f'{line}\n\n{{"job_id": "x", "state": "done"}}\n',
            "{path}:3: trajectory: Field required (not a result as raas run and raas export"
            " write them)",
        ),
        "state.jsonl": (
            line.replace('"state":"done"', '"state":"finished"') + "\n",
            "{path}:1: state: Input should be",
        ),
        "empty.jsonl": ("\n", "{path} holds no results"),
        "r.parquet": ("PAR1", "{path}: a Parquet export; results are read as JSON lines"),
    }
    for name, (text, said) in cases.items():
        path = tmp_path / name
        if text is not None:
            path.write_text(text)
        for args in ([str(path), str(good)], [str(good), str(path)]):  # A or B: the same
            run = CliRunner().invoke(main, ["compare", *args])
            assert run.exit_code == 1, (name, run.output)
            assert run.output.startswith("Error: " + said.format(path=path)), run.output
            assert len(run.output.splitlines()) == 1, run.output
