"""Batch inference over a JSONL, CSV or text file (`ortserve-batch` / `python -m clients.batch`).

    clients.batch.cli        command line: arguments -> BatchConfig -> run
    clients.batch.input      records from JSONL / CSV / text, parsed lazily
    clients.batch.output     the resumable JSONL output log
    clients.batch.run        the ordered concurrent loop over a runner, run-level aborts
    clients.batch.tasks      per-task request configs, answer payloads, the Runner protocol
    clients.batch.server     runner over a server (the asyncio client)
    clients.batch.local      runner in-process through the server's data plane (no server, no gRPC)
    clients.batch.ray_pool   the in-process runner in a Ray Data actor pool
"""
from .cli import main

__all__ = ["main"]
