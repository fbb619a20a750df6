"""The OpenAI-compatible API (what the `openai` client, vLLM and TGI speak), one module per resource, each a
converter over the data plane: the body decoded once into a typed request (protocol.py, by msgspec), one pass
to the data plane, the answer encoded.

    models.py          GET  /v1/models, /v1/models/{model}
    completions.py     POST /v1/completions (logprobs, echo, vLLM's prompt_logprobs, stream)
    chat.py            POST /v1/chat/completions (DataPlane.chat: messages -> prompt with the package's template)
    embeddings.py      POST /v1/embeddings
    tokenizer.py       POST /tokenize, /detokenize (vLLM's), every model kind
    rerank.py          POST /v1/rerank (Cohere / Jina / vLLM), /v1/score (vLLM), /rerank (TEI's shape)
    rerank_protocol.py their typed request bodies
    protocol.py        the typed request bodies
    params.py          typed request -> GenerationParams per choice (n), OpenAI's defaults and field names
    answers.py         finish reasons, usage, JSON encoding
    stream.py          server-sent events: streams opened together, merged, [DONE]

Errors: OpenAI's JSON error shape, status from server/http/errors.py (400 / 401 / 404 / 429 / 503 ...).
Extra sampling fields beyond OpenAI's, as vLLM accepts them: top_k, min_p, min_tokens, repetition_penalty,
stop_token_ids, ignore_eos.
"""
from __future__ import annotations

from starlette.routing import Route

from server.http.openai import chat, completions, embeddings, models, rerank, tokenizer


def routes() -> list[Route]:
    return [
        Route("/v1/models", models.list_models, methods=["GET"]),
        Route("/v1/models/{model:path}", models.get_model, methods=["GET"]),
        Route("/v1/completions", completions.completions, methods=["POST"]),
        Route("/v1/chat/completions", chat.chat_completions, methods=["POST"]),
        Route("/v1/embeddings", embeddings.embeddings, methods=["POST"]),
        Route("/tokenize", tokenizer.tokenize, methods=["POST"]),
        Route("/detokenize", tokenizer.detokenize, methods=["POST"]),
        Route("/v1/rerank", rerank.rerank, methods=["POST"]),
        Route("/v1/score", rerank.score, methods=["POST"]),
        Route("/rerank", rerank.tei_rerank, methods=["POST"]),
    ]
