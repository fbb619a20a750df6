"""Text pairs to score and the data plane's rerank / score results (the logic: server/encoders/rerank.py)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pairs:
    """Pair i is (left[i], right[i]), or (left[0], right[i]) when one left text is broadcast to every right one."""

    left: list[str]
    right: list[str]
    left_field: str
    right_field: str

    @classmethod
    def broadcast(cls, left_field: str, left: str, right_field: str, right: list[str]) -> "Pairs":
        return cls([left], right, left_field, right_field)

    @property
    def broadcasts(self) -> bool:
        return len(self.left) == 1

    def __len__(self) -> int:
        return len(self.right)

    def left_name(self, i: int) -> str:
        return self.left_field if self.broadcasts else f"{self.left_field}[{i}]"

    def pairs(self) -> list[tuple[str, str]]:
        return [(self.left[0 if self.broadcasts else i], text) for i, text in enumerate(self.right)]


@dataclass(frozen=True)
class PairScores:
    scores: list[float]   # one per pair, in order: a cross-encoder's logit under its activation, or cosine
    raw: list[float]      # a cross-encoder's logit, or cosine
    tokens: int           # tokens the model ran (special tokens included)


@dataclass(frozen=True)
class RankedDocument:
    index: int            # position in the request
    score: float


@dataclass(frozen=True)
class ScoreResult:
    model: str
    version: int
    scores: PairScores


@dataclass(frozen=True)
class RerankResult:
    model: str
    version: int
    results: list[RankedDocument]   # best first, at most top_n
    tokens: int


__all__ = ["PairScores", "Pairs", "RankedDocument", "RerankResult", "ScoreResult"]
