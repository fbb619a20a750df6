"""Python client of the ortserve task API (sync and asyncio), CLI and batch inference."""
from .aio import AsyncOrtserveClient
from .client import OrtserveClient
from .config import Backoff, ClientConfig, TLSConfig
from .errors import OrtserveError
from .types import (
    Classification,
    Embedding,
    FillMaskResult,
    GeneratedToken,
    Generation,
    GenerationParams,
    LabelScore,
    MaskPrediction,
    ModelInfo,
    ModelStatus,
    RankedDocument,
    StreamChunk,
    TokenCandidate,
    Tokenization,
    TokenSpan,
    TokenLogprob,
    Usage,
    ZeroShotClassification,
)

__all__ = [
    "AsyncOrtserveClient", "Backoff", "Classification", "ClientConfig", "Embedding", "FillMaskResult", "GeneratedToken",
    "Generation", "GenerationParams", "LabelScore", "MaskPrediction", "ModelInfo", "ModelStatus",
    "OrtserveClient", "OrtserveError", "RankedDocument", "StreamChunk", "TLSConfig", "TokenCandidate", "TokenLogprob",
    "Tokenization", "TokenSpan", "Usage", "ZeroShotClassification",
]
