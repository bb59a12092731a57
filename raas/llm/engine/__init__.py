"""The embedded CPU inference engine: transformers + torch behind vLLM's completions protocol.

``create_engine_app("smollm2")`` loads a model and returns the FastAPI app; ``Engine`` is the
batching generator underneath, usable without HTTP. Requires torch, transformers and safetensors.

The names load on first use, so that ``raas.llm.engine.protocol`` (pydantic only: the oracle
serves it too) imports without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from raas.llm.engine.app import create_engine_app, engine_app
    from raas.llm.engine.generator import Engine, GenerationParams

# The rest: EngineStopped, PromptError, WeightsError in .generator; GenerationResult in .completion.
__all__ = ["Engine", "GenerationParams", "create_engine_app", "engine_app"]
_HOMES = {
    "Engine": "generator",
    "GenerationParams": "generator",
    "create_engine_app": "app",
    "engine_app": "app",
}


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
