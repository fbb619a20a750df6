"""POST /v1/rerank (Cohere / Jina / vLLM), /v1/score (vLLM) and /rerank (text-embeddings-inference): documents
scored against a query by a cross-encoder or an embedding model (server/encoders/rerank.py), one data-plane call each."""
from __future__ import annotations

import time
import uuid
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from server.http.body import deadline_from_headers
from server.http.decode import typed_body
from server.http.guard import KSERVE, OPENAI, Door, route
from server.http.openai.answers import json_answer
from server.http.openai.protocol import refuse_unsupported
from server.http.openai.rerank_protocol import (RerankRequest, ScoreRequest, TeiRerankRequest, rerank_pairs,
                                                score_pairs, tei_pairs)


@route("Rerank", OPENAI)
async def rerank(door: Door, request: Request) -> Response:
    """{model, query, documents, top_n?, return_documents?} -> {id, model, usage, results: [{index,
    relevance_score, document?}]} best first; return_documents defaults to true (vLLM's and Jina's answer)."""
    body = await typed_body(request, door.max_body_bytes, RerankRequest)
    refuse_unsupported(body)
    pairs = rerank_pairs(body)
    result = await door.plane.rerank(body.model, 0, pairs, body.top_n, bool(body.truncate),
                                     deadline=deadline_from_headers(request))
    with_text = body.return_documents is not False
    results: list[dict[str, Any]] = []
    for r in result.results:
        item: dict[str, Any] = {"index": r.index, "relevance_score": r.score}
        if with_text:
            item["document"] = {"text": pairs.right[r.index]}
        results.append(item)
    return json_answer({"id": f"rerank-{uuid.uuid4().hex}", "model": body.model,
                        "usage": {"total_tokens": result.tokens}, "results": results})


@route("Score", OPENAI)
async def score(door: Door, request: Request) -> Response:
    """{model, text_1, text_2} -> {id, object, created, model, data: [{index, object, score}], usage}, in pair
    order."""
    body = await typed_body(request, door.max_body_bytes, ScoreRequest)
    refuse_unsupported(body)
    result = await door.plane.score(body.model, 0, score_pairs(body), bool(body.truncate),
                                    deadline_from_headers(request))
    tokens = result.scores.tokens
    return json_answer({"id": f"score-{uuid.uuid4().hex}", "object": "list", "created": int(time.time()),
                        "model": body.model,
                        "data": [{"index": i, "object": "score", "score": s}
                                 for i, s in enumerate(result.scores.scores)],
                        "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})


@route("TeiRerank", KSERVE)
async def tei_rerank(door: Door, request: Request) -> Response:
    """{model, query, texts, raw_scores?, return_text?, truncate?} -> [{index, score, text?}] best first (TEI's;
    errors as {"error": message})."""
    body = await typed_body(request, door.max_body_bytes, TeiRerankRequest)
    refuse_unsupported(body)
    pairs = tei_pairs(body)
    result = await door.plane.rerank(body.model, 0, pairs, None, bool(body.truncate), bool(body.raw_scores),
                                     deadline_from_headers(request))
    answer: list[dict[str, Any]] = []
    for r in result.results:
        item: dict[str, Any] = {"index": r.index, "score": r.score}
        if body.return_text:
            item["text"] = pairs.right[r.index]
        answer.append(item)
    return json_answer(answer)
