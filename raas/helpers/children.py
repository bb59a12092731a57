"""Child processes: guarded (SIGTERM when this process dies) and terminated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Sequence
from typing import Any

# The child gets SIGTERM when the process that started it dies, even by SIGKILL, so a crashed
# parent leaves no server behind. The parent-pid check closes the race where the parent died
# before prctl ran; exec keeps the pid. The signal follows the *thread* that forked. Linux only.
_GUARD = (
    "import ctypes, os, signal, sys\n"
    "libc = ctypes.CDLL(None)\n"
    "if hasattr(libc, 'prctl'): libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(3)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def guarded(argv: Sequence[str]) -> list[str]:
    """``argv`` (a full path first) as a child that gets SIGTERM when this process dies."""
    return [sys.executable, "-c", _GUARD, str(os.getpid()), *argv]


def terminate(proc: subprocess.Popen[Any], timeout_s: float) -> int:
    """SIGTERM (a raas server then drains), SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode
