"""Why a reward is below a pass, in words a trainer can act on: a result's ``metrics.reason``.

Every judge and task that scores a job below ``PASS_REWARD`` puts one short line under
``reason`` ("answer read: 12, expected 13", "case 3 of 5 failed: timed out after 6s", "1
FAIL_TO_PASS still failing: TestOps.test_add (FAIL)"); a pass carries none. The dashboard's
job list shows it. It goes into the result the trainer reads, never into a sandbox: it is made
on the host, after the judging, and may name the expected answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from raas.wire import PASS_REWARD

REASON = "reason"
REASON_CHARS = 200  # a line of the dashboard's list; the metrics keep the long output elsewhere
LISTED = 3  # names a reason lists before it says how many more


def clip(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters (a cut one ends in "...")."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def listed(names: Iterable[str], shown: int = LISTED) -> str:
    """``names`` joined with commas, the first ``shown`` only: "a, b, c and 4 more"."""
    every = list(names)
    text = ", ".join(every[:shown])
    return f"{text} and {len(every) - shown} more" if len(every) > shown else text


def one_of(truths: Sequence[str]) -> str:
    """What an answer judge expected: the one truth, or "one of a, b" where any is right."""
    return truths[0] if len(truths) == 1 else f"one of {listed(truths)}"


def wrong_answer(read: object, expected: object) -> str:
    """The reason of an answer judge: what it read and what it expected, or that it read none."""
    if read is None or (isinstance(read, str | list) and not read):
        return "no answer found"
    return clip(f"answer read: {read}, expected {expected}")


def tamper_reason(tamper: str) -> str:
    """The reason of a 0 for a twin that passed (a judge's ``metrics.tamper``, which says which):
    the tests with their expectations changed passed too, so nothing computed what they check."""
    return clip(f"tamper: {tamper}")


def with_reason(reward: float, metrics: dict[str, Any], reason: str) -> dict[str, Any]:
    """``metrics`` with ``reason`` (clipped) where ``reward`` is below a pass; a pass gets none,
    whatever a judge's metrics held, so a reason never stands beside a passing reward."""
    if reward < PASS_REWARD:
        metrics[REASON] = clip(reason)
    else:
        metrics.pop(REASON, None)
    return metrics
