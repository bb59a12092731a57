"""Sandboxes: a library that knows nothing of jobs or tasks.

``create_sandbox(BwrapConfig())`` gives a bubblewrap sandbox; ``SandboxPool`` keeps some warm.
Tools go through the in-sandbox action server (``raas/sandbox/inside``) over a Unix socket.
"""

from raas.sandbox.base import Sandbox
from raas.sandbox.client import BashResult, IPythonResult, SandboxError, ToolError
from raas.sandbox.config import BwrapConfig, LocalConfig, SandboxConfig, SandboxLimits
from raas.sandbox.pool import SandboxPool, create_sandbox

__all__ = [
    "BashResult",
    "BwrapConfig",
    "IPythonResult",
    "LocalConfig",
    "Sandbox",
    "SandboxConfig",
    "SandboxError",
    "SandboxLimits",
    "SandboxPool",
    "ToolError",
    "create_sandbox",
]
