"""A sandbox of a config: the one place that maps each provider's config to its sandbox class.

The configs (``raas.sandbox.config``) are plain settings that the providers import; the choice
of a class lives here, above both, so that no provider and its config import each other.
"""

from __future__ import annotations

from typing import assert_never

from raas.sandbox.apptainer import ApptainerSandbox
from raas.sandbox.base import Sandbox
from raas.sandbox.bwrap import BwrapSandbox
from raas.sandbox.config import ApptainerConfig, BwrapConfig, LocalConfig, SandboxConfig
from raas.sandbox.local import LocalSandbox


def create_sandbox(config: SandboxConfig) -> Sandbox:
    """A sandbox of ``config``'s provider (not started yet)."""
    match config:
        case BwrapConfig():
            return BwrapSandbox(config)
        case LocalConfig():
            return LocalSandbox(config)
        case ApptainerConfig():
            return ApptainerSandbox(config)
        case _:
            assert_never(config)
