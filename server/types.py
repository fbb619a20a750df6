"""Results of the data plane (protocol-independent; the servicers turn them into protobuf)."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field


class ModelState(str, enum.Enum):
    LOADING = "LOADING"
    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"
    UNLOADED = "UNLOADED"


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class Classification:
    label: str
    score: float
    scores: list[LabelScore]  # top_k (or all) labels, best first


@dataclass(frozen=True)
class ClassifyResult:
    model: str
    version: int
    results: list[Classification]  # one per input, in order


@dataclass(frozen=True)
class TokenCandidate:
    token: str
    token_id: int
    score: float
    sequence: str  # the text with this mask filled by this token


@dataclass(frozen=True)
class MaskPrediction:
    position: int  # token index of the mask in the encoded sequence
    candidates: list[TokenCandidate]


@dataclass(frozen=True)
class FillMaskResult:
    model: str
    version: int
    results: list[list[MaskPrediction]]  # per text, per mask


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: int
    task: str
    state: ModelState
    reason: str = ""


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
