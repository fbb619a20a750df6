"""Generation engine: continuous batching over one KV-cache ONNX decoder graph (numpy + onnxruntime only)."""
from .engine import GenerationEngine
from .params import GenerationConfig, GenerationParams
from .results import (EngineStoppedError, GeneratedToken, GenerationResult, OverloadedError, StreamChunk,
                      TokenLogprob, Usage)

__all__ = ["GenerationEngine", "GenerationParams", "GenerationConfig", "StreamChunk", "GenerationResult",
           "GeneratedToken", "TokenLogprob", "Usage", "OverloadedError", "EngineStoppedError"]
