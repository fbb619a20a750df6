"""Serving overhead: the same repository served in-process (server.dataplane.DataPlane) and by a real
`python -m server` process over gRPC on a free localhost port.

Classify: throughput and latency at concurrency 1/4/16 with the same texts per request; the gRPC load is
driven by grpc.aio stubs in this process (one coroutine per concurrent client), the in-process load by
coroutines calling the data plane on the same event loop. Both configurations run in rounds, alternating,
so they share the machine's noise. Generation: aggregate tokens/s and time to first token at 1/4/8
concurrent GenerateStream calls, also both ways.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testing.closedloop import drive_async, per_client as per_client_plan
from testing.launch import ServerProcess

from .config import ServerBenchConfig
from .material import classifier_checkpoint, export_package, lm_checkpoint, passages, shared_dir
from .pyprofile import profile_server
from .stats import Summary, percentile, ratio

log = logging.getLogger(__name__)

CLASSIFIER = "bench-classifier"
LM = "bench-lm"


@dataclass
class LoadResult:
    seconds: float
    latencies: list[float]      # seconds per request
    items: int                  # texts (classify) or tokens (generate) served

    @property
    def throughput(self) -> float:
        return self.items / self.seconds


async def closed_loop(call: Callable[[int, int], Awaitable[int]], concurrency: int, per_client: int) -> LoadResult:
    """`concurrency` clients, each sending `per_client` requests back to back; call(client, i) -> items."""
    run = await drive_async(lambda c, i, first: call(c, i), concurrency, per_client_plan(per_client))
    return LoadResult(run.wall, run.latencies(), sum(r.output for r in run.records))


def _summarise_load(runs: list[LoadResult]) -> dict[str, Any]:
    all_lat = [x for r in runs for x in r.latencies]
    return {"throughput_per_s": Summary.of([r.throughput for r in runs]).as_json(),
            "latency_ms": {"p50": percentile(all_lat, 50) * 1e3, "p95": percentile(all_lat, 95) * 1e3,
                           "p50_per_repeat": Summary.of([percentile(r.latencies, 50) * 1e3 for r in runs]).as_json()},
            "requests": len(all_lat)}


async def _stream_load(open_stream: Callable[[int], Any], streams: int) -> dict[str, Any]:
    """`streams` concurrent generations; per stream: time to first token and tokens received."""
    async def one(c: int, i: int, first: Callable[[], None]) -> int:
        tokens = 0
        async for n in open_stream(c):
            if n:
                first()
            tokens += n
        return tokens

    run = await drive_async(one, streams, per_client_plan(1))
    tokens = sum(r.output for r in run.records)
    ttft = [r.first - r.sent if r.first is not None else float("nan") for r in run.records]
    return {"seconds": run.wall, "tokens": tokens, "tokens_per_s": tokens / run.wall, "ttft_s": ttft}


class InProcess:
    """The data plane on this event loop, configured like the server process."""

    def __init__(self, repo: Path, threads: int, classifier: str = CLASSIFIER, lm: str = LM) -> None:
        from server.runtime.settings import ServerSettings

        self.classifier, self.lm = classifier, lm
        self.settings = ServerSettings(repository=repo, port=0, metrics_port=-1, poll_interval=0,
                                       intra_op_threads=threads, inter_op_threads=1).validate()
        self.plane: Any = None

    async def start(self) -> None:
        from server.dataplane import DataPlane

        self.plane = await DataPlane.start(self.settings, poll=False)

    async def close(self) -> None:
        await self.plane.close()

    async def classify(self, texts: list[str]) -> int:
        res = await self.plane.classify(self.classifier, 0, [(t, None) for t in texts])
        return len(res.results)

    async def stream(self, prompt: str, new_tokens: int):
        from server.generation import GenerationParams

        params = GenerationParams.validate(max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True)
        async for part in await self.plane.generate_stream(self.lm, 0, prompt, params):
            yield len(part.chunk.tokens)


class OverGrpc:
    """grpc.aio stubs to a server process (one channel: what one client application would hold)."""

    def __init__(self, address: str, classifier: str = CLASSIFIER, lm: str = LM) -> None:
        self.address = address
        self.classifier, self.lm = classifier, lm
        self.channel: Any = None
        self.stub: Any = None

    async def start(self) -> None:
        import grpc

        from protos import ortserve_pb2_grpc

        self.channel = grpc.aio.insecure_channel(self.address)
        await asyncio.wait_for(self.channel.channel_ready(), 30)
        self.stub = ortserve_pb2_grpc.TaskServiceStub(self.channel)

    async def close(self) -> None:
        await self.channel.close()

    async def classify(self, texts: list[str]) -> int:
        from protos import ortserve_pb2 as pb

        res = await self.stub.Classify(pb.ClassifyRequest(model=self.classifier, inputs=[pb.TextInput(text=t) for t in texts]))
        return len(res.results)

    async def stream(self, prompt: str, new_tokens: int):
        from protos import ortserve_pb2 as pb

        req = pb.GenerateRequest(model=self.lm, prompt=prompt, parameters=pb.GenerationParameters(
            max_new_tokens=new_tokens, temperature=0.0, ignore_eos=True))
        async for msg in self.stub.GenerateStream(req):
            yield len(msg.tokens)


def build_repository(work: Path, cfg: ServerBenchConfig) -> tuple[Path, dict[str, Any]]:
    threads, new_tokens = cfg.threads, cfg.stream_new_tokens
    repo = work / "repository"
    clf = classifier_checkpoint(shared_dir(work), cfg.sources.classifier)
    clf.name = CLASSIFIER
    cpkg = export_package(clf, "classify", repo, ("fp32", "optimized", "int8"), threads=threads)
    lm, notes = lm_checkpoint(shared_dir(work), min_positions=64 + new_tokens, default=cfg.sources.lm)
    lm.name = LM
    lpkg = export_package(lm, "generate", repo, ("fp32",), threads=threads)
    return repo, {"classifier": {**clf.describe(), "default_variant": cpkg.manifest.get("default_variant"),
                                 "notes": cpkg.notes},
                  "lm": {**lm.describe(), "notes": notes + lpkg.notes}}


async def _measure(cfg: ServerBenchConfig, repo: Path, server: ServerProcess) -> dict[str, Any]:
    texts = passages(64, min_words=20, seed=5)
    inproc, grpc_ = InProcess(repo, cfg.threads), OverGrpc(server.address)
    await inproc.start()
    await grpc_.start()
    ways = {"in_process": inproc, "grpc": grpc_}
    try:
        def classify_call(way: Any) -> Callable[[int, int], Awaitable[int]]:
            async def call(c: int, i: int) -> int:
                start = (c * 7 + i) % len(texts)
                return await way.classify((texts + texts)[start:start + cfg.batch_size])
            return call

        for way in ways.values():  # warm-up: sessions, batcher, channel
            await closed_loop(classify_call(way), 4, 5)
        classify: dict[str, Any] = {}
        for conc in cfg.concurrency:
            runs: dict[str, list[LoadResult]] = {k: [] for k in ways}
            for _ in range(cfg.repeats):
                for k, way in ways.items():
                    runs[k].append(await closed_loop(classify_call(way), conc,
                                                     max(10, cfg.requests_per_level // conc)))
            summary = {k: _summarise_load(v) for k, v in runs.items()}
            thr = {k: Summary.from_json(v["throughput_per_s"]) for k, v in summary.items()}
            summary["grpc_vs_in_process_throughput"] = ratio(thr["grpc"], thr["in_process"])
            classify[str(conc)] = summary
            log.info("classify c=%d: in-process %.1f/s, grpc %.1f/s", conc, thr["in_process"].median,
                     thr["grpc"].median)
        # Batch-1 latency, one request at a time, alternating in-process / gRPC request by request.
        lat: dict[str, list[float]] = {k: [] for k in ways}
        for i in range(cfg.latency_requests):
            for k, way in ways.items():
                t0 = time.perf_counter()
                await way.classify([texts[i % len(texts)]])
                lat[k].append(time.perf_counter() - t0)
        p50 = {k: percentile(v, 50) * 1e3 for k, v in lat.items()}
        latency = {"requests": cfg.latency_requests,
                   "p50_ms": p50, "p95_ms": {k: percentile(v, 95) * 1e3 for k, v in lat.items()},
                   "grpc_overhead_p50_ms": p50["grpc"] - p50["in_process"]}
        log.info("batch-1 p50: in-process %.2f ms, grpc %.2f ms", p50["in_process"], p50["grpc"])

        prompts = passages(max(cfg.streams), min_words=12, seed=6)
        for way in ways.values():  # warm-up
            async for _ in way.stream(prompts[0], 4):
                pass
        generation: dict[str, Any] = {}
        for n in cfg.streams:
            per: dict[str, list[dict[str, Any]]] = {k: [] for k in ways}
            for _ in range(cfg.stream_repeats):
                for k, way in ways.items():
                    per[k].append(await _stream_load(
                        lambda i, way=way: way.stream(prompts[i], cfg.stream_new_tokens), n))
            entry = {}
            for k, runs_ in per.items():
                entry[k] = {"tokens_per_s": Summary.of([r["tokens_per_s"] for r in runs_]).as_json(),
                            "ttft_ms": Summary.of([t * 1e3 for r in runs_ for t in r["ttft_s"]]).as_json(),
                            "tokens": [r["tokens"] for r in runs_]}
            generation[str(n)] = entry
            log.info("generate %d streams: in-process %.1f tok/s, grpc %.1f tok/s", n,
                     entry["in_process"]["tokens_per_s"]["median"], entry["grpc"]["tokens_per_s"]["median"])
        first, last = str(cfg.streams[0]), str(cfg.streams[-1])
        scaling = {k: ratio(Summary.from_json(generation[last][k]["tokens_per_s"]),
                            Summary.from_json(generation[first][k]["tokens_per_s"])) for k in ways}
        return {"classify": classify, "batch1_latency": latency, "generation": generation,
                "generation_scaling_last_vs_first": scaling}
    finally:
        await grpc_.close()
        await inproc.close()


async def _sequential_classify(address: str, texts: list[str], n: int) -> None:
    way = OverGrpc(address)
    await way.start()
    try:
        for i in range(n):
            await way.classify([texts[i % len(texts)]])
    finally:
        await way.close()


def profile_grpc_classify(repo: Path, args: list[str], requests: int, work: Path) -> dict[str, Any]:
    """A separate server process under cProfile, sent `requests` sequential batch-1 Classify calls: where
    the server's main thread spends its time per request (not part of any timed figure)."""
    texts = passages(32, min_words=20, seed=5)
    return profile_server(lambda prof: ServerProcess(repo, args, profile_to=prof),
                          lambda server: asyncio.run(_sequential_classify(server.address, texts, requests)),
                          requests, work)


def run(cfg: ServerBenchConfig, work: Path) -> dict[str, Any]:
    repo, models = build_repository(work, cfg)
    args = ["--intra-op-threads", str(cfg.threads), "--inter-op-threads", "1"]
    with ServerProcess(repo, args) as server:
        result = asyncio.run(_measure(cfg, repo, server))
    result["grpc_classify_profile"] = profile_grpc_classify(repo, args, cfg.latency_requests, work)
    return {"piece": "server", "threads": cfg.threads, "batch_size": cfg.batch_size, "models": models,
            "load": "grpc.aio stubs, one channel, one coroutine per client; in-process: the same coroutines "
                    "calling DataPlane", "stream_new_tokens": cfg.stream_new_tokens, **result}
