"""The reason a judge gives for a reward below a pass: one short line, and none on a pass."""

from __future__ import annotations

from raas.judge.reasons import REASON_CHARS, clip, listed, one_of, with_reason, wrong_answer
from raas.wire import PASS_REWARD


def test_a_reason_is_one_short_line() -> None:
    assert clip("exit 1:\n  Traceback\t(most recent)") == "exit 1: Traceback (most recent)"
    cut = clip("x" * 500)
    assert len(cut) == REASON_CHARS and cut.endswith("...")
    assert clip("short") == "short"


def test_lists_are_cut_saying_how_many_more() -> None:
    assert listed(["a", "b"]) == "a, b"
    assert listed(["a", "b", "c", "d", "e"]) == "a, b, c and 2 more"
    assert one_of(["13"]) == "13" and one_of(["3", "4"]) == "one of 3, 4"


def test_a_wrong_answer_names_what_was_read_and_expected() -> None:
    assert wrong_answer("12", 13) == "answer read: 12, expected 13"
    assert wrong_answer(None, 13) == wrong_answer("", 13) == "no answer found"


def test_only_a_reward_below_a_pass_carries_a_reason() -> None:
    failed = with_reason(0.0, {"passed": False}, "line one\nline two")
    assert failed == {"passed": False, "reason": "line one line two"}
    assert with_reason(0.5, {}, "half")["reason"] == "half"  # a partial reward is below a pass
    # A pass drops whatever reason the metrics held (a verdict's, made before the twins ran).
    assert with_reason(PASS_REWARD, {"reason": "stale", "passed": True}, "why") == {"passed": True}
