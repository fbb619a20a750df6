"""The process and its operations: what every part of the server runs inside, and nothing about models.

    settings.py   the typed configuration: defaults -> config file -> flags
    logs.py       plain-text or JSON-lines logging
    eventloop.py  uvloop when installed, else asyncio's loop
    fdlimit.py    the open-file budget and the connections each door may hold
    metrics.py    Prometheus metrics (docs/metrics.md)
    tracing.py    OpenTelemetry spans per request, W3C traceparent, request ids for the logs
    stats.py      per version counters behind KServe ModelStatistics

May import: the standard library, third-party libraries, server.protocol, server.admission (limits as settings),
server.generation.params (generation defaults as settings). Never: the doors, the repository, served models.
"""
