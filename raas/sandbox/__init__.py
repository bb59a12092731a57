"""Sandboxes: a library that knows nothing of jobs or tasks.

``create_sandbox(BwrapConfig())`` gives a bubblewrap sandbox (``ApptainerConfig``: an Apptainer
one); ``SandboxPool`` keeps some warm.
Tools go through the in-sandbox action server (``raas/sandbox/inside``) over a Unix socket.
"""

from raas.sandbox.base import Sandbox
from raas.sandbox.client import BashResult, IPythonResult, SandboxError, ToolError
from raas.sandbox.config import (
    ApptainerConfig,
    BwrapConfig,
    LocalConfig,
    SandboxConfig,
    SandboxLimits,
)
from raas.sandbox.images import resolve_image
from raas.sandbox.pool import SandboxPool, create_sandbox

__all__ = [
    "ApptainerConfig",
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
    "resolve_image",
]
