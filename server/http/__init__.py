"""The HTTP front door: KServe v2 REST and an OpenAI-compatible API over the same data plane as gRPC.

    routes.py   the Starlette application: every route family's routes, Starlette's own 404 / 405
    guard.py    the guard every route runs in (auth, errors, metrics) and what routes share (Door)
    serve.py    uvicorn on the server's event loop: bind, TLS, graceful stop
    connections.py  header / body timeouts and a connection cap shared with the metrics port (idle ones closed)
    errors.py   THE data-plane error -> HTTP status mapping, error bodies (KServe and OpenAI shapes)
    body.py     request bodies: size limit, content type, JSON, fields of a JSON object, deadlines
    decode.py   JSON bodies decoded once into typed requests (msgspec), refusals naming the field
    tensors.py  KServe REST tensors (JSON data and Triton's binary extension) <-> numpy
    inference_rest.py  KServe v2 REST: the /v2 routes
    openai/     /v1 routes, one module per resource (models, completions, chat, embeddings, tokenizer)
    ops.py      /health and /metrics, where vLLM serves them (/metrics is also the metrics port's one route)
    token_classify.py  /v1/token-classify
    classify.py  /v1/classify and TEI's /predict (function_to_apply)
    zero_shot.py  /v1/zero-shot-classification
"""
