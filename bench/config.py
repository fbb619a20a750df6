"""Configuration of the suite, one dataclass per concern; `quick()` gives the short development run."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

PIECES = ("encoder", "decoder", "server", "peer")
ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Sources:
    """Trained checkpoints to measure when present (else random models of the same shapes stand in)."""

    classifier: Path = ROOT / "artifacts" / "checkpoints" / "classifier"
    lm: Path = ROOT / "artifacts" / "checkpoints" / "lm"


@dataclass(frozen=True)
class EncoderConfig:
    threads: int = 2
    sources: Sources = field(default_factory=Sources)
    shapes: tuple[tuple[int, int], ...] = ((1, 32), (8, 128))
    repeats: dict[tuple[int, int], int] = field(default_factory=lambda: {(1, 32): 40, (8, 128): 12})
    sgemm_n: int = 2048
    sgemm_repeats: int = 10
    base_layers: int = 12            # the BERT-base-shaped model (quick: fewer layers, same width)
    profile_runs: int = 5
    accuracy_limit: int | None = None  # genre test examples for the int8 accuracy drop (None: all)

    @classmethod
    def quick(cls) -> "EncoderConfig":
        return cls(repeats={(1, 32): 5, (8, 128): 3}, sgemm_repeats=3, base_layers=2, profile_runs=2,
                   accuracy_limit=96)


@dataclass(frozen=True)
class DecoderConfig:
    threads: int = 2
    sources: Sources = field(default_factory=Sources)
    new_tokens: int = 256
    prompt_tokens: int = 16
    repeats: int = 5                 # full generations per backend
    uncached_repeats: int = 3        # full recompute is slow: fewer generations
    past_lengths: tuple[int, ...] = (16, 32, 64, 128, 256, 512)
    step_repeats: int = 50           # timed single steps per past length
    batch_sizes: tuple[int, ...] = (1, 4, 8)  # sequences per batched step (the server's 1/4/8 streams)

    @classmethod
    def quick(cls) -> "DecoderConfig":
        return cls(new_tokens=64, repeats=1, past_lengths=(16, 128, 512), step_repeats=8)


@dataclass(frozen=True)
class ServerBenchConfig:
    """Classify: requests_per_level requests per run at each concurrency, shared by its clients."""

    threads: int = 2
    sources: Sources = field(default_factory=Sources)
    batch_size: int = 1              # texts per Classify request, the same in-process and over gRPC
    concurrency: tuple[int, ...] = (1, 4, 16)
    requests_per_level: int = 400    # per run at each concurrency, split over its clients (>= 10 each)
    latency_requests: int = 300      # sequential batch-1 requests for the p50 overhead
    repeats: int = 5
    streams: tuple[int, ...] = (1, 4, 8)
    stream_new_tokens: int = 64
    stream_repeats: int = 3

    @classmethod
    def quick(cls) -> "ServerBenchConfig":
        return cls(requests_per_level=60, latency_requests=30, repeats=1, stream_new_tokens=16, stream_repeats=1)


@dataclass(frozen=True)
class PeerConfig:
    """Requests per client = rows_per_cell / (clients × batch), at least 10: the same work in every cell,
    so a slow trained model does not make the batch-8 cells take minutes."""

    threads: int = 2
    # ortserve's batcher runs `instances` batches at once with threads / instances intra-op threads each (the
    # same thread budget as MLServer's one session of `threads`); 1 = one session run at a time, like MLServer.
    # On the MiniLM classifier (a ~5 ms graph at batch 1 on 2 threads) one spinning 2-thread session won: the
    # lone request runs on both cores (p50 at 1 client), and batches of ~4 rows keep the 8-client rate as high
    # as 2 x 1 thread (bench/FINDINGS.md, 2026-11-23 21:40 UTC). Spinning is onnxruntime's default, MLServer's too.
    instances: int = 1
    spinning: str = "on"
    ceiling_batches: tuple[int, ...] = (1, 4, 8, 16)   # batch sizes of the in-process graph ceiling
    sources: Sources = field(default_factory=Sources)
    clients: tuple[int, ...] = (1, 8)
    batches: tuple[int, ...] = (1, 8)
    seq: int = 32
    rows_per_cell: int = 800         # rows per run of a (clients, batch) cell, split over requests and clients
    repeats: int = 3
    startup_timeout: float = 120.0

    @classmethod
    def quick(cls) -> "PeerConfig":
        return cls(rows_per_cell=120, repeats=1)


@dataclass(frozen=True)
class SuiteConfig:
    out: Path
    only: tuple[str, ...] = PIECES
    quick: bool = False
    docs: Path | None = None         # Markdown report (None: not written)
    plots: Path | None = None        # PNG directory
    encoder: EncoderConfig = field(default_factory=EncoderConfig)
    decoder: DecoderConfig = field(default_factory=DecoderConfig)
    server: ServerBenchConfig = field(default_factory=ServerBenchConfig)
    peer: PeerConfig = field(default_factory=PeerConfig)

    @classmethod
    def build(cls, out: Path, only: tuple[str, ...] = PIECES, quick: bool = False, docs: Path | None = None,
              plots: Path | None = None, sources: Sources | None = None) -> "SuiteConfig":
        sources = sources or Sources()
        pieces = ((EncoderConfig.quick(), DecoderConfig.quick(), ServerBenchConfig.quick(), PeerConfig.quick())
                  if quick else (EncoderConfig(), DecoderConfig(), ServerBenchConfig(), PeerConfig()))
        enc, dec, srv, peer = (dataclasses.replace(p, sources=sources) for p in pieces)
        return cls(out=out, only=only, quick=quick, docs=docs, plots=plots, encoder=enc, decoder=dec, server=srv,
                   peer=peer)
