"""The request bodies of rerank and score (msgspec Structs, decoded once by server/http/decode.py), and the
texts they carry as the data plane's Pairs (server/encoders/rerank.py) under the field names each shape uses.

    RerankRequest       POST /v1/rerank    Cohere / Jina / vLLM: query, documents, top_n, return_documents
    ScoreRequest        POST /v1/score     vLLM: text_1, text_2 (one to one, one to many, or many to many)
    TeiRerankRequest    POST /rerank       text-embeddings-inference: query, texts, raw_scores, return_text

Fields of these APIs that would change the answer and are not implemented are refused unless off
(protocol.refuse_unsupported).
"""
from __future__ import annotations

from typing import Any, ClassVar

import msgspec

from server.protocol.errors import ServingError
from server.http.openai.protocol import UNSET
from server.protocol.pairs import Pairs


class RerankRequest(msgspec.Struct, kw_only=True):
    model: str
    query: str
    documents: list[Any]            # strings, or objects {"text": string} (Cohere's and Jina's)
    top_n: int | None = None
    return_documents: bool | None = None
    truncate: bool | None = None
    max_tokens_per_doc: Any = UNSET
    rank_fields: Any = UNSET
    truncate_prompt_tokens: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"max_tokens_per_doc": (), "rank_fields": ([],),
                                                         "truncate_prompt_tokens": ()}


class ScoreRequest(msgspec.Struct, kw_only=True):
    model: str
    text_1: str | list[Any]
    text_2: str | list[Any]
    truncate: bool | None = None
    truncate_prompt_tokens: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"truncate_prompt_tokens": ()}


class TeiRerankRequest(msgspec.Struct, kw_only=True):
    model: str                      # TEI serves one model; this server serves many: name it
    query: str
    texts: list[Any]
    truncate: bool | None = None
    raw_scores: bool | None = None
    return_text: bool | None = None
    truncation_direction: Any = UNSET

    UNSUPPORTED: ClassVar[dict[str, tuple[Any, ...]]] = {"truncation_direction": ("Right", "right")}


def _texts(given: list[Any], field: str, objects: bool = False) -> list[str]:
    """A list of strings (or, `objects`, of {"text": string}); INVALID_ARGUMENT naming the first other entry."""
    texts = []
    for i, item in enumerate(given):
        if objects and isinstance(item, dict) and isinstance(item.get("text"), str):
            item = item["text"]
        if not isinstance(item, str):
            shape = 'a string or {"text": string}' if objects else "a string"
            raise ServingError.invalid(f"{field}[{i}]", f"must be {shape}, got {type(item).__name__}")
        texts.append(item)
    return texts


def rerank_pairs(body: RerankRequest) -> Pairs:
    return Pairs.broadcast("query", body.query, "documents", _texts(body.documents, "documents", objects=True))


def tei_pairs(body: TeiRerankRequest) -> Pairs:
    return Pairs.broadcast("query", body.query, "texts", _texts(body.texts, "texts"))


def score_pairs(body: ScoreRequest) -> Pairs:
    """vLLM's pairing: text_1 a string scores against each of text_2; two lists pair up index by index."""
    left = [body.text_1] if isinstance(body.text_1, str) else _texts(body.text_1, "text_1")
    right = [body.text_2] if isinstance(body.text_2, str) else _texts(body.text_2, "text_2")
    if len(left) != 1 and len(left) != len(right):
        raise ServingError.invalid("text_2", f"holds {len(right)} texts and text_1 {len(left)}: give text_1 one text "
                                             "or as many as text_2")
    return Pairs(left, right, "text_1", "text_2")


__all__ = ["RerankRequest", "ScoreRequest", "TeiRerankRequest", "rerank_pairs", "score_pairs", "tei_pairs"]
