"""Sandboxes: a library that knows nothing of jobs or tasks.

``BwrapConfig().create()`` gives a bubblewrap sandbox (``ApptainerConfig``: an Apptainer one;
``sandbox_config(name)``: any provider's, by its type name); ``SandboxPool`` keeps some warm.
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
    sandbox_config,
)
from raas.sandbox.images import resolve_image
from raas.sandbox.pool import SandboxPool

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
    "resolve_image",
    "sandbox_config",
]
