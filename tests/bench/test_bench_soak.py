"""`raas bench soak` without its servers: its options, what it measures from the fake models'
logs (the turns generated again, the loop's time between turns), how it tells what became of a
job in flight at a kill, and its report in 80 columns from given figures. The soak itself is not
run here: it prints figures and asserts nothing (on speed least of all)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from raas.bench import soak
from raas.bench.soak import Final, Kill, Request
from raas.cli import main
from raas.cli.bench import known


def test_it_is_a_benchmark() -> None:
    assert "soak" in known()


def test_options_default_and_checkpoint_modes(capsys: pytest.CaptureFixture[str]) -> None:
    args = soak.parser().parse_args([])
    assert (args.checkpoint, args.compare_checkpoint_off, args.turns) == ("turn", False, 2)
    args = soak.parser().parse_args(["--checkpoint", "Every-3", "--compare-checkpoint-off"])
    assert (args.checkpoint, args.compare_checkpoint_off) == ("every-3", True)
    assert soak.parser().parse_args(["--checkpoint", "off"]).checkpoint == "off"
    with pytest.raises(SystemExit):
        soak.parser().parse_args(["--checkpoint", "sometimes"])
    assert "none of off, turn, every-N" in capsys.readouterr().err


def test_help_explains_every_option() -> None:
    for action in soak.parser()._actions:
        assert action.help and action.help != argparse.SUPPRESS, action.dest
    result = CliRunner().invoke(main, ["bench", "soak", "--", "--help"])
    assert result.exit_code == 0, result.output
    assert "--compare-checkpoint-off" in result.output and "--checkpoint" in result.output


# -- what is measured ------------------------------------------------------------------------------


def _final(task: str = "think", turns: int = 3, attempts: int = 1, **more: Any) -> Final:
    fields: dict[str, Any] = {"resumed_at": None, "refused": None, "checkpoints": None}
    return Final(task, "done", turns, attempts, **(fields | more))


def _log(path: Path, lines: list[str]) -> None:
    path.write_text("".join(f"{line}\n" for line in lines))


def test_requests_are_read_from_every_log_in_time_order_and_a_cut_line_skipped(
    tmp_path: Path,
) -> None:
    _log(tmp_path / "llm-1-10.log", ["q soak-1 0 1.0", "a soak-1 0 1.2", "q soak-1 1"])
    _log(tmp_path / "llm-2-11.log", ["q soak-2 0 1.1", "x soak-2 0 1.3"])
    (tmp_path / "other.txt").write_text("q soak-9 0 0.5\n")
    found = soak.read_requests(tmp_path)
    assert found == [
        Request("q", "soak-1", 0, 1.0),
        Request("q", "soak-2", 0, 1.1),
        Request("a", "soak-1", 0, 1.2),
    ]


def test_turns_generated_again_are_the_requests_beyond_the_turns_kept() -> None:
    asks = [Request("q", job, turn, 0.0) for job, turn in [("a", 0), ("a", 1), ("a", 1)]]
    asks += [Request("q", "b", 0, 0.0), Request("a", "b", 0, 0.0)]
    finals = {"a": _final(turns=2), "b": _final(turns=1), "c": _final(turns=0)}
    assert soak.generated_again(asks, finals) == {"a": 1, "b": 0, "c": 0}


def test_the_loop_time_between_turns_leaves_out_retries_and_faults() -> None:
    requests = [
        Request("a", "j", 0, 1.00),
        Request("q", "j", 1, 1.01),  # 10 ms after the answer to turn 0
        Request("q", "j", 1, 1.50),  # the same turn again (a backend retry): no second gap
        Request("a", "j", 1, 1.60),
        Request("q", "j", 2, 3.00),  # a fault lies between: left out
        Request("q", "k", 1, 0.50),  # no answer to its turn 0 logged: no gap
    ]
    gaps = soak.turn_gaps(requests, faults=[(2.0, 2.5)])
    assert list(gaps) == ["j"] and gaps["j"] == pytest.approx([0.01])


def test_what_became_of_a_job_in_flight_at_a_kill() -> None:
    outcome = soak.kill_outcome
    assert outcome(None, "run", [0]) == ("not finished", None)
    assert outcome(_final(attempts=2, resumed_at=2), "run", [0, 1, 2]) == ("resumed", None)
    why = "what shapes the rollout changed since its checkpoints (model): it ran from the start"
    assert outcome(_final(attempts=2, refused=why), "run", [0, 1]) == ("from the start", why)
    assert outcome(_final(), "eval", [0, 1, 2]) == ("before", None)  # never ran again
    assert outcome(_final(attempts=2), "init", []) == (
        "from the start",
        "had not asked the model before the kill (init)",
    )
    assert "first turn" in str(outcome(_final(attempts=2), "run", [0])[1])
    assert "no checkpoint" in str(outcome(_final(attempts=2), "run", [0, 1])[1])


def test_a_request_the_killed_server_sent_as_it_died_is_its_own() -> None:
    kill = Kill(10.0, {}, successor_at=10.5)
    assert kill.asked_by_it(Request("q", "j", 1, 9.9))
    assert kill.asked_by_it(Request("q", "j", 1, 10.2))  # logged after the kill, sent before
    assert not kill.asked_by_it(Request("q", "j", 1, 10.6))  # its successor's


def test_a_kill_strikes_within_a_jobs_time(tmp_path: Path) -> None:
    args = soak.parser().parse_args(["--turns", "4", "--llm-latency-ms", "20"])
    run = soak.Soak(args, tmp_path, "turn")
    assert run.job_s() == pytest.approx(0.16)  # before any result: about a job's RUN
    run.latency = [9.0] * 60 + [1.0, 2.0, 3.0] * 10  # the last 50: 20 x 9 s, 30 below
    assert run.job_s() == pytest.approx(3.0)


def test_figures_fit_their_columns() -> None:
    for seconds in (3e-6, 9.99e-4, 0.0123, 0.5, 0.99996, 12.3, 4567.0, float("nan")):
        assert len(soak.duration(seconds)) <= 7, seconds
    for n in (0, 999, 1000, 10_240, 1023 * 1024, 5e6, 3e9, float("nan")):
        assert len(soak.size(n)) <= 7, n
    assert (soak.size(10_240), soak.duration(0.0123), soak.ratio(2.0, 1.0)) == (
        "10 KiB",
        "12.3 ms",
        "2.00x",
    )
    assert soak.ratio(1.0, float("nan")) == "-"


# -- the report ----------------------------------------------------------------------------------


def _soak(tmp_path: Path, checkpoint: str) -> soak.Soak:
    """A soak that never started, given what a run would have gathered: one kill at t=10 s."""
    run = soak.Soak(soak.parser().parse_args(["--turns", "3"]), tmp_path, checkpoint)
    costs = {"written": 2, "bytes": 20_480, "loop_s": 0.003, "write_s": 0.09, "stopped": None}
    on = checkpoint != "off"
    run.finals = {
        # asked turn 2 at the kill, resumed there: one turn again
        "soak-1": _final(attempts=2, resumed_at=2 if on else None, checkpoints=costs),
        # killed in its first turn: one turn again
        "soak-2": _final(attempts=2, checkpoints=costs),
        # its result was written before the kill took effect
        "soak-3": _final(checkpoints=costs),
        # not in flight at the kill; a backend retry asked its turn 1 twice
        "soak-4": _final(checkpoints=costs),
        # in INIT at the kill
        "soak-10": _final("think_sandboxed", attempts=2, checkpoints=costs),
    }
    for job in run.finals:
        run.submitted[job] = 0.0
        run.seen[job] = 1
    run.latency = [1.0, 2.0, 3.0, 4.0, 5.0]
    run.outcomes.update({"done": 5, "ran more than once": 3})
    run.faults.update({"server SIGKILL": 1, "backend SIGKILL": 1})
    listed = {"soak-1": ("run", 2), "soak-2": ("run", 0), "soak-3": ("eval", 3)}
    run.kills = [Kill(10.0, listed | {"soak-10": ("init", 0)}, successor_at=10.5)]
    run.windows = [(10.0, 12.0), (20.0, 20.1)]
    lines = []
    for job, turns in [("soak-1", [0, 1, 2]), ("soak-3", [0, 1, 2]), ("soak-4", [0, 1])]:
        for turn in turns:
            lines += [f"q {job} {turn} {5 + turn:.6f}", f"a {job} {turn} {5.5 + turn:.6f}"]
    again = [2] if on else [0, 1, 2]
    lines += [f"q soak-1 {turn} {13 + turn:.6f}" for turn in again]
    lines += ["q soak-2 0 9.5"] + [f"q soak-2 {turn} {14 + turn:.6f}" for turn in range(3)]
    lines += ["q soak-2 2 20.05"]  # asked again at a backend's SIGKILL: extra, not the kill's
    lines += [f"q soak-10 {turn} {14 + turn:.6f}" for turn in range(3)]
    lines += ["q soak-4 1 30.0", "q soak-4 2 31.0"]
    _log(run.log_dir / "llm-1-1.log", lines)
    return run


def test_the_report_fits_80_columns_and_counts_the_turns_generated_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    legs = []
    for mode in ("turn", "off"):
        (tmp_path / mode).mkdir()
        legs.append(_soak(tmp_path / mode, mode).report(12.0))
    soak.compare(legs)
    out = capsys.readouterr().out
    assert all(len(line) <= soak.WIDTH for line in out.splitlines()), out
    turn, off = out.split("soak, --checkpoint off")
    rows = _kill_table(turn)
    # listed, before, asked, again, median, max, extra, resumed, restarted
    assert rows["think"] == ["3", "1", "2", "2", "1", "1", "3", "1", "1"], turn
    assert rows["think_sandboxed"] == ["1", "0", "0", "0", "-", "-", "0", "0", "1"], turn
    assert "extra requests of the jobs not in flight at a server SIGKILL: 1 (1 jobs)" in turn
    assert "killed in its first turn" in turn and "had not asked the model" in turn
    assert "checkpoint cost per turn" in turn and "checkpoint cost per turn" not in off
    # soak-1 ran from the start under --checkpoint off: its 3 turns again, not 1
    assert _kill_table(off)["think"][3:7] == ["4", "2", "3", "5"], off
    assert "against --checkpoint off" in off


def _kill_table(report: str) -> dict[str, list[str]]:
    """The rows of the table of jobs in flight at a server SIGKILL, by task."""
    lines = report.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["task", "listed"])
    return {line.split()[0]: line.split()[1:] for line in lines[header + 1 : header + 3]}
