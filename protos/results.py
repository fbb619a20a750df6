"""The typed results that the server hands its front doors and the client hands its caller, field for field the
task API's messages of the same names (protos/ortserve.proto).

Hand-written, standard library only: installed with the generated stubs, so the server and the client share
these classes without either importing the other. Only what both sides hold the same lives here; a result with
server-only fields (the version that computed it, numpy arrays, ranks) or client-only ones (a parsed manifest)
stays in server/protocol/types.py or clients/types.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Classification:
    label: str
    score: float
    scores: list[LabelScore] = field(default_factory=list)  # top_k (or all) labels, best first


@dataclass(frozen=True)
class TokenCandidate:
    """One token that may stand for a mask."""

    token: str
    token_id: int
    score: float
    sequence: str  # the text with this mask filled by this token (other masks left as they were)


@dataclass(frozen=True)
class MaskPrediction:
    position: int  # token index of the mask in the encoded sequence
    candidates: list[TokenCandidate] = field(default_factory=list)


@dataclass(frozen=True)
class TokenSpan:
    """One token of a Tokenize answer."""

    id: int
    text: str        # the token as the vocabulary writes it ("##ing", "Ġthe", "[CLS]")
    special: bool    # a special token (added by the tokenizer's template, or one written in the text)
    start: int       # characters [start, stop) of the text it came from; (0, 0) for an added special token
    stop: int


@dataclass(frozen=True)
class TokenEntity:
    """One entry of a token-classification answer (transformers pipeline's entity)."""

    label: str          # the token's or word's label (aggregation "none"), or the entity group's tag (the others)
    score: float
    word: str           # the token string ("none", "simple" pieces) or the decoded text of the group
    start: int          # character offsets into the text, end exclusive
    end: int
    index: int | None = None   # the token's position in the sequence (aggregation "none" only)


@dataclass(frozen=True)
class TokenLogprob:
    token_id: int
    token: str       # the token decoded alone (may be U+FFFD for a partial UTF-8 character)
    logprob: float


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0    # of prompt_tokens, found in the server's cache (prefix caching), not prefilled


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class ZeroShotClassification:
    """One text's zero-shot answer, as transformers' zero-shot-classification pipeline gives it."""

    sequence: str
    labels: list[str]     # the candidate labels, best first
    scores: list[float]   # their scores, in the same order


__all__ = ["Classification", "LabelScore", "MaskPrediction", "TokenCandidate", "TokenEntity", "TokenLogprob",
           "TokenSpan", "Usage", "ZeroShotClassification"]
