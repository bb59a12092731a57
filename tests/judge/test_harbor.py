"""raas.judge.harbor's verdict on what test.sh did, on a stand-in verifier sandbox: the reward
read, and why a reward below a pass is what it is (the runs themselves, in real sandboxes of a
Harbor image, are the image tier's: tests/tasks/test_harbor_verifier.py)."""

from __future__ import annotations

from typing import Any, cast

import pytest

from raas.judge.harbor import VERIFIER_DIR, VerifierRun, run_verifier
from raas.sandbox import ExecResult, Sandbox, SandboxError, ToolError


class Verifier:
    """A verifier sandbox whose test.sh ends as ``ended`` and leaves ``files`` in
    /logs/verifier (name -> bytes); ``dies``: the sandbox ends under test.sh."""

    def __init__(
        self, ended: ExecResult, files: dict[str, bytes] | None = None, dies: bool = False
    ) -> None:
        self.ended, self.files, self.dies = ended, files or {}, dies

    async def exec(self, argv: list[str], stdin: str = "", **how: Any) -> ExecResult:
        if argv[0] == "mkdir":
            return ExecResult(0, "", "", False, 0, 0)
        if self.dies:
            raise SandboxError("the action server closed the connection")
        return self.ended

    async def write_file(self, path: str, data: bytes | str, mode: int = 0o644) -> None:
        return None

    async def read_file(self, path: str, max_bytes: int | None = None) -> bytes:
        name = path.removeprefix(VERIFIER_DIR + "/")
        if name not in self.files:
            raise ToolError("ToolError", f"no such file: {path}")
        return self.files[name]


def ended(exit_code: int = 0, output: str = "", timed_out: bool = False) -> ExecResult:
    return ExecResult(exit_code, output, "", timed_out, 0, 0)


async def verdict_of(verifier: Verifier) -> tuple[float, dict[str, Any]]:
    run = VerifierRun(tests={"test.sh": (b"#!/bin/bash\n", True)}, timeout_s=30)
    verdict = await run_verifier(cast(Sandbox, verifier), run)
    return verdict.reward, verdict.metrics


PYTEST_TAIL = "tests/test_outputs.py::test_sum FAILED\n===== 1 failed, 2 passed in 0.12s =====\n\n"


@pytest.mark.parametrize(
    ("verifier", "reward", "reason"),
    [
        (Verifier(ended(0, "3 passed"), {"reward.txt": b"1\n"}), 1.0, None),
        (
            Verifier(ended(1, PYTEST_TAIL), {"reward.txt": b"0"}),
            0.0,
            "test.sh scored 0: ===== 1 failed, 2 passed in 0.12s =====",
        ),
        (
            Verifier(ended(0), {"reward.json": b'{"reward": 0.5, "style": 1}'}),
            0.5,
            "test.sh scored 0.5 and printed nothing",
        ),
        (Verifier(ended(timed_out=True)), 0.0, "test.sh ran past its 30 s"),
        (Verifier(ended(-9)), 0.0, "test.sh was killed by signal 9"),
        (
            Verifier(ended(0, "ok")),
            0.0,
            f"test.sh wrote neither {VERIFIER_DIR}/reward.txt nor reward.json",
        ),
        (
            Verifier(ended(), dies=True),
            0.0,
            "the sandbox ended while the candidate's code ran: the action server closed the"
            " connection",
        ),
    ],
)
async def test_a_reward_below_a_pass_says_why(
    verifier: Verifier, reward: float, reason: str | None
) -> None:
    got, metrics = await verdict_of(verifier)
    assert got == reward, metrics
    assert metrics.get("reason") == reason, metrics
    if "verifier_error" in metrics:  # no reward was read: the error is the reason
        assert metrics["verifier_error"] == reason
