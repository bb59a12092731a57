"""The embedded CPU inference engine: transformers + torch behind vLLM's completions protocol.

``create_engine_app("smollm2")`` loads a model and returns the FastAPI app; ``Engine`` is the
batching generator underneath, usable without HTTP. Requires torch, transformers and safetensors.
"""

from raas.llm.engine.app import create_engine_app, engine_app
from raas.llm.engine.generator import Engine, GenerationParams

# The rest (EngineStopped, PromptError, WeightsError, GenerationResult) is in .generator.
__all__ = ["Engine", "GenerationParams", "create_engine_app", "engine_app"]
