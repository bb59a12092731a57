"""Sandboxes: a library that knows nothing of jobs or tasks.

``create_sandbox(BwrapConfig())`` gives a bubblewrap sandbox (``ApptainerConfig``: an Apptainer one;
``sandbox_config(name)``: any provider's, by its type name); ``SandboxPool`` keeps some warm.
Tools go through the in-sandbox action server (``raas/sandbox/inside``) over a Unix socket.
A server claims a runtime directory of its own (``claim_runtime_dir``) and gives it to its
sandboxes (a config's ``runtime_dir``), so that a restart cleans up what a crash left.
"""

from raas.sandbox.base import Sandbox
from raas.sandbox.client import BashResult, ExecResult, IPythonResult, SandboxError, ToolError
from raas.sandbox.config import (
    ApptainerConfig,
    BwrapConfig,
    LocalConfig,
    SandboxConfig,
    SandboxLimits,
    sandbox_config,
)
from raas.sandbox.fork import ForkCarry
from raas.sandbox.pool import SandboxPool
from raas.sandbox.providers import create_sandbox
from raas.sandbox.runtime import RuntimeDir, claim_runtime_dir, runtime_root

__all__ = [
    "ApptainerConfig",
    "BashResult",
    "BwrapConfig",
    "ExecResult",
    "ForkCarry",
    "IPythonResult",
    "LocalConfig",
    "RuntimeDir",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "ToolError",
    "claim_runtime_dir",
    "create_sandbox",
    "runtime_root",
    "sandbox_config",
]
