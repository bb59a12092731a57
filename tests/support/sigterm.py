"""A pytest plugin: SIGTERM to the test run ends it as Ctrl-C does (KeyboardInterrupt), so the
``finally`` blocks of the test in progress run: the README tier's stops the block's process
group, whose servers a plain SIGTERM (``timeout``, a CI runner's cancel) left running for
half an hour, holding the ports the next run's blocks need. Registered by tests/conftest.py."""

from __future__ import annotations

import signal
from types import FrameType

import pytest


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:  # never over a handler of its host
        signal.signal(signal.SIGTERM, _interrupt)
