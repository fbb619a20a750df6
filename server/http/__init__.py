"""The HTTP front door: KServe v2 REST and an OpenAI-compatible API over the same data plane as gRPC.

    app.py      the Starlette application: every route family's routes, Starlette's own 404 / 405
    guard.py    the guard every route runs in (auth, errors, metrics) and what routes share (Door)
    serve.py    uvicorn on the server's event loop: bind, TLS, graceful stop
    errors.py   THE data-plane error -> HTTP status mapping, error bodies (KServe and OpenAI shapes)
    body.py     request bodies: size limit, content type, JSON, typed fields, deadlines
    tensors.py  KServe REST tensors (JSON data and Triton's binary extension) <-> numpy
    kserve.py   /v2 routes
    openai.py   /v1 routes (models, completions, chat completions, embeddings)
    ops.py      /health and /metrics, where vLLM serves them
"""
