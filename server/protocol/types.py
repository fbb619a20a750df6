"""Results of the data plane (protocol-independent; the front doors turn them into protobuf or JSON)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

# The results the client holds the same, field for field (protos/results.py); the data plane's are below.
from protos.results import Classification, MaskPrediction, TokenEntity

if TYPE_CHECKING:
    import numpy as np

    from server.generation import GenerationResult, StreamChunk


class ModelState(str, enum.Enum):
    LOADING = "LOADING"
    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"
    UNLOADED = "UNLOADED"
    BUILDING = "BUILDING"    # not in the repository yet: the deploy pipeline is training / exporting it


@dataclass(frozen=True)
class ClassifyResult:
    model: str
    version: int
    results: list[Classification]  # one per input, in order
    labels: list[str] = field(default_factory=list)  # the model's labels in logit-column order


@dataclass(frozen=True)
class FillMaskResult:
    model: str
    version: int
    results: list[list[MaskPrediction]]  # per text, per mask
    mask_token: str = ""                 # the model's mask token, as it appears in the texts


@dataclass(frozen=True)
class EmbedResult:
    model: str
    version: int
    embeddings: np.ndarray       # [texts, dimension] float32, one row per text in order
    token_counts: list[int]      # tokens of each text as the model saw them (special tokens included)
    normalized: bool = False     # rows have unit L2 norm (the package's pooling config says so)


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: int
    task: str
    state: ModelState
    reason: str = ""
    variant: str = ""   # the ONNX variant a loaded version runs ("" when none is loaded)


@dataclass(frozen=True)
class ModelInfo:
    status: ModelStatus
    labels: list[str] = field(default_factory=list)
    max_length: int = 0
    mask_token: str = ""
    variant: str = ""
    providers: list[str] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    max_batch_size: int = 0
    manifest_json: str = ""
    cache_bytes_per_slot: int = 0   # a generation model's KV cache: one slot's bytes, and every slot's together
    cache_bytes: int = 0


@dataclass(frozen=True)
class TensorMetadata:
    name: str
    datatype: str          # KServe name ("INT64", "FP32", "BYTES")
    shape: list[int]       # -1 for a dynamic axis


@dataclass(frozen=True)
class ModelMetadata:
    """What KServe ModelMetadata reports: the graph signature of one loaded version."""

    name: str
    versions: list[int]
    platform: str
    inputs: list[TensorMetadata]
    outputs: list[TensorMetadata]


@dataclass(frozen=True)
class DurationStat:
    count: int
    ns: int


@dataclass(frozen=True)
class BatchStat:
    batch_size: int
    compute_infer: DurationStat


@dataclass(frozen=True)
class ModelStatistics:
    """A snapshot of one version's counters (server/runtime/stats.py), taken under its lock."""

    name: str
    version: int
    last_inference_ms: int
    inference_count: int
    execution_count: int
    success: DurationStat
    fail: DurationStat
    queue: DurationStat
    compute_infer: DurationStat
    batches: list[BatchStat]


@dataclass(frozen=True)
class RepositoryEntry:
    """A model of the repository index: a loaded version (any state), or a name on disk never loaded."""

    name: str
    version: int | None    # None: no version directory (the index then shows "")
    state: ModelState
    reason: str = ""


@dataclass(frozen=True)
class InferResult:
    """Raw graph outputs of one ModelInfer, with the version that computed them."""

    model: str
    version: int
    outputs: dict[str, np.ndarray]   # output name -> array


@dataclass(frozen=True)
class GenerateResult:
    model: str
    version: int
    output: GenerationResult
    prompt_text: str | None = None   # asked with echo: the prompt as text (token ids decoded by this version)


@dataclass(frozen=True)
class ChatTemplate:
    """A generation model's chat template (Jinja) and the special-token variables it may use."""

    template: str
    variables: dict[str, str] = field(default_factory=dict)   # bos_token, eos_token


@dataclass(frozen=True)
class StreamPart:
    model: str
    version: int
    chunk: StreamChunk
    prompt_text: str | None = None   # asked with echo, on the first part: as GenerateResult.prompt_text


class PartStream(Protocol):
    """A generation request's stream as a door reads it (the data plane's RequestStream, server/leases.py): its
    parts, the last one's chunk final; aclose() when not read to the end cancels the rest."""

    model: str
    version: int

    def __aiter__(self) -> "PartStream": ...

    async def __anext__(self) -> StreamPart: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class TokenClassifyResult:
    model: str
    version: int
    results: list[list[TokenEntity]]     # per text, its entities in text order (server/encoders/token_aggregation.py)
    labels: list[str]                     # the model's labels, in logit order
    aggregation_strategy: str = "none"
