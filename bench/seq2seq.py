"""Encoder-decoder serving against CTranslate2 and transformers' generate (issue 26's benchmark).

    python -m bench seq2seq [--quick] [--models g2p,marian] [--pieces batch,served,step] [--checkpoint G2P_DIR]
                            [--out bench/results/seq2seq.json] [--docs docs/BENCHMARKS.md]
    python -m bench seq2seq --render-only --docs docs/BENCHMARKS.md          # the block again from --out

Needs bash bench/setup_ct2.sh (CTranslate2 4.8.5 in bench/.venv-ct2). Models (bench/s2s_material.py): the default
g2p model (artifacts/checkpoints/g2p; trained first when absent) and an OPUS-MT-shaped random Marian.

Pieces, the sides taking turns cell by cell (the order reversed every round, a second of rest between turns):
  batch   a batch job over held-out inputs, greedy and beam 4: ortserve through the batch script's in-process
          runners (clients.batch: a LocalRunner over the server's DataPlane per process: `ortserve-batch --local`,
          the same engine as the server without gRPC, like CTranslate2's in-process translate_batch) vs
          CTranslate2 translate_batch over the whole list (max_batch_size, sorted by length by CTranslate2);
          ortserve runs batch_processes processes (the script's --processes) of batch_instances engines, each of
          threads / (processes x instances) onnxruntime threads, as CTranslate2 runs inter_threads replicas of
          intra_threads, and each engine's slots are
          batch_slots x beams, so one of its steps runs as many rows as a CTranslate2 replica's (max_batch_size
          examples x beams; 64 x 4 = 256 rows at beam 4);
          fp32 vs float32, and ortserve's w8 variant (8-bit weights, MatMulNBits, in both graphs) vs CTranslate2's
          int8 (quantization="int8": int8 weights and int8 matrix products; compute_type int8_float32).
  served  1 / 8 / 32 closed-loop clients, greedy: ortserve's real server process streamed over gRPC
          (GenerateStream, the asyncio client: a coroutine per client) vs CTranslate2 and transformers' generate,
          each in a process of its own behind an arrival-batching loop (bench/s2s_loop.py: it runs every request
          that has arrived as one batch); the same sources in the same order for every side. Tokens/s and time to
          first token.
          CTranslate2 runs in two thread layouts (2 replicas x 1 thread, one loop each; 1 x 2 threads) and the
          faster one counts in each row. ortserve streams in two deliveries (DELIVERIES): as the peers' loop hands
          its callers a request (the first token at once, the rest with the end: stream_interval max_new_tokens),
          which the ratios compare, and a message per token, reported beside them.
Expected time on 2 quiet cores: ~7-11 minutes, plus ~2 minutes the first time (the Marian checkpoint, both exports,
four conversions) and ~5 minutes if the g2p model must be trained; --quick ~1.5 minutes once the material exists.
  step    the decoder graph's step in-process at batch 8 with the target at position 16 vs 256 (Marian shape),
          against the time to read the extra self-cache once at the bandwidth numpy reaches in the same run.
Tokens are target tokens without the eos, counted the same way on every side.
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .machine import describe
from .results import publish, read_json, write_json
from .s2s_loop import Record, run_clients_async, summarize
from .s2s_material import CT2_VENV, STEP_LENGTH, MaterialError, Model, build, g2p_sources, marian_sources, peer_env
from .s2s_report import BLOCK, render
from bench.harness import Benchmark

log = logging.getLogger("bench.seq2seq")
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PIECES = ("batch", "served", "step")
MODELS = ("g2p", "marian")


@dataclass(frozen=True)
class Config:
    models: tuple[str, ...] = MODELS
    pieces: tuple[str, ...] = PIECES
    # The Marian shape's batch job is 128 inputs, not 2,000: ortserve's beam 4 runs ~40 tokens/s there, and 2,000
    # inputs would take it ~15 minutes alone (the whole benchmark must fit ~12 minutes on 2 cores).
    batch_inputs: dict[str, int] = field(default_factory=lambda: {"g2p": 2000, "marian": 128})
    new_tokens: dict[str, int] = field(default_factory=lambda: {"g2p": 32, "marian": 16})  # marian: exactly this many
    beams: tuple[int, ...] = (1, 4)
    clients: tuple[int, ...] = (1, 8, 32)
    # served: requests each client sends, per model and client count. g2p's 32 clients send 32 each: with fewer,
    # the fastest side's run was short enough for its clients' start and end to weigh (docs/BENCHMARKS.md, g2p).
    requests_per_client: dict[str, dict[int, int]] = field(default_factory=lambda: {
        "g2p": {1: 24, 8: 24, 32: 32}, "marian": {1: 6, 8: 4, 32: 2}})
    warmup_clients: tuple[tuple[int, int], ...] = ((1, 4), (8, 16), (32, 32))   # (clients, requests) untimed
    rounds: int = 2
    ct2_int8: bool = True
    # the batch job also runs these 8-bit variants of the package (those its gate passed) against CTranslate2's int8
    ortserve_quantized: tuple[str, ...] = ("int8", "w8")
    threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    # CTranslate2's parallel batches (model replicas) x threads per batch = the cores. Two replicas of one thread
    # beat one of two threads on these 2 cores (2026-11-26, shared cores: g2p greedy 35k vs 10k tok/s, Marian shape
    # 640 vs 450); served, the peer runs one arrival loop per replica. --ct2-threads 1x2 for the other layout.
    ct2_inter_threads: int = 2
    ct2_intra_threads: int = 0          # 0: threads / inter_threads
    ct2_max_batch_size: int = 64        # translate_batch's batch job split (examples)
    # The batch job's sources decoded at once per engine: ortserve --max-sequences is this x the beams (each
    # hypothesis takes a slot), so a step runs as many rows as one CTranslate2 replica's (max_batch_size examples x
    # beams) ...
    batch_slots: int = 64
    # ... the batch runner's records in flight (the batch script's --concurrency): two per slot, so a slot whose
    # sequence ends finds the next one already queued in its process ...
    batch_concurrency: int = 256
    # ... and its processes (--processes), each with batch_instances engines of threads / (processes x instances)
    # onnxruntime threads, as CTranslate2 runs inter_threads replicas of intra_threads: one interpreter per engine,
    # so the engines' Python does not take turns on one lock (clients/batch/processes.py).
    batch_processes: int = 2
    batch_instances: int = 1
    served_slots: int = 32              # ortserve --max-sequences for the served piece; the peers' max batch
    step_batch: int = 8
    step_positions: tuple[int, int] = (16, STEP_LENGTH)
    step_rounds: int = 5
    work: Path = ROOT / "bench" / "results" / "seq2seq-work"

    @classmethod
    def quick(cls) -> "Config":
        return cls(batch_inputs={"g2p": 300, "marian": 24}, new_tokens={"g2p": 32, "marian": 8},
                   requests_per_client={"g2p": {1: 4, 8: 2, 32: 1}, "marian": {1: 2, 8: 1, 32: 1}},
                   warmup_clients=((1, 4), (8, 8)), rounds=1, step_rounds=2)

    @property
    def ct2_intra(self) -> int:
        return self.ct2_intra_threads or max(1, self.threads // self.ct2_inter_threads)


# ----------------------------------------------------------------------------- sources


@dataclass(frozen=True)
class Sources:
    """One model's inputs as every side takes them: text (ortserve), token strings (CTranslate2), ids (transformers)."""

    texts: list[str]
    tokens: list[list[str]]
    ids: list[list[int]]


def sources(model: Model, n: int) -> Sources:
    from tokenizers import Tokenizer

    texts = g2p_sources(n) if model.name == "g2p" else marian_sources(n)
    tok = Tokenizer.from_file(str(model.package / "tokenizer.json"))
    enc = tok.encode_batch(texts)
    return Sources(texts, [e.tokens for e in enc], [e.ids for e in enc])


# ----------------------------------------------------------------------------- peers (their own processes)


class PeerError(RuntimeError):
    pass


class Peer:
    """A bench/s2s_peer.py `serve` process: JSON requests on its stdin, answers on its stdout."""

    def __init__(self, name: str, python: Path, args: list[str], log_dir: Path) -> None:
        self.name = name
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.log"
        self._log = open(self.log_path, "w")
        self.proc = subprocess.Popen([str(python), "-m", "bench.s2s_peer", "serve", *args], cwd=ROOT, env=peer_env(),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True)
        ready = self._read()
        self.threads: dict[str, Any] = ready["threads"]

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            tail = self.log_path.read_text(errors="replace").strip().splitlines()[-3:]
            raise PeerError(f"{self.name} peer exited (code {self.proc.poll()}): {' | '.join(tail)}")
        reply = json.loads(line)
        if "error" in reply:
            raise PeerError(f"{self.name} peer: {reply['error']}")
        return reply

    def request(self, payload: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(payload) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        try:
            if self.proc.poll() is None and self.proc.stdin is not None:
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.flush()
            self.proc.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.proc.kill()
            self.proc.wait()
        finally:
            self._log.close()


def ct2_peer(model: Model, precision: str, cfg: Config, layout: tuple[int, int] | None = None) -> Peer:
    """CTranslate2 with `layout` = (inter_threads, intra_threads), default the configured one."""
    py = CT2_VENV / "bin" / "python"
    if not (CT2_VENV / ".complete").is_file():
        raise MaterialError("CTranslate2 peer not installed: run bash bench/setup_ct2.sh")
    inter, intra = layout or (cfg.ct2_inter_threads, cfg.ct2_intra)
    return Peer(f"ct2-{model.name}-{precision}-{inter}x{intra}", py,
                ["--engine", "ct2", "--model", str(model.ct2[precision]), "--inter-threads", str(inter),
                 "--intra-threads", str(intra)], cfg.work / "logs")


def ct2_layouts(cfg: Config) -> dict[str, tuple[int, int]]:
    """Served, CTranslate2 runs in two thread layouts and the faster counts per cell: replicas (inter_threads) serve
    many clients best, one replica with every core (intra_threads) one client."""
    configured = (cfg.ct2_inter_threads, cfg.ct2_intra)
    other = (1, cfg.threads) if configured != (1, cfg.threads) else (2, max(1, cfg.threads // 2))
    return {"ct2": configured, "ct2_alt": other}


def hf_peer(model: Model, cfg: Config) -> Peer:
    return Peer(f"hf-{model.name}", Path(sys.executable), ["--engine", "hf", "--model", str(model.checkpoint),
                                                           "--threads", str(cfg.threads)], cfg.work / "logs")


# ----------------------------------------------------------------------------- token counting


def limits(model: Model, cfg: Config) -> tuple[int, int]:
    """(max new tokens, min new tokens): random weights generate exactly max new tokens on every side."""
    n = cfg.new_tokens[model.name]
    return n, (n if model.fixed_length else 0)


def ortserve_params(model: Model, cfg: Config, beam: int) -> dict[str, Any]:
    max_new, min_new = limits(model, cfg)
    params: dict[str, Any] = {"max_new_tokens": max_new}
    if beam > 1:
        params["num_beams"] = beam
        if model.fixed_length:
            params["ignore_eos"] = True          # min_tokens is a sampling parameter the beam search refuses
    elif min_new:
        params["min_tokens"] = min_new
    return params


def agreement(a: list[str], b: list[str]) -> float:
    """Fraction of outputs (whitespace-normalised text) that are identical."""
    same = sum(" ".join(x.split()) == " ".join(y.split()) for x, y in zip(a, b))
    return same / max(1, len(a))


# ----------------------------------------------------------------------------- batch job


class OrtserveBatch:
    """The batch script's in-process runner as `ortserve-batch --local REPO --processes P --instances I
    --max-sequences S --concurrency C` runs it (clients/batch/processes.py: P processes, each the server's DataPlane
    with I engines; LocalRunner alone when P is 1), answers converted as they would reach a client, `concurrency`
    records in flight, answers kept in memory as translate_batch keeps them. Not the script's output file: it
    appends, flushes and fsyncs every answer on the event loop (its resumability), which is the output's cost, not
    the engine's."""

    def __init__(self, model: Model, cfg: Config, variant: str = "fp32", beam: int = 1) -> None:
        from clients.batch.processes import engine_threads
        from clients.batch.tasks import TaskConfig
        from clients.types import GenerationParams

        self.model, self.cfg, self.variant, self.beam = model, cfg, variant, beam
        self.slots = cfg.batch_slots * beam
        self.threads = engine_threads(cfg.batch_processes, cfg.batch_instances, cfg.threads)
        self.task = TaskConfig(task="generate", model=model.name,
                               generation=GenerationParams(**ortserve_params(model, cfg, beam)))
        self.loop = asyncio.new_event_loop()
        self.runner = self.loop.run_until_complete(self._start())

    async def _start(self) -> Any:
        from clients.batch.local import LocalRunner
        from clients.batch.processes import ProcessRunner

        cfg = self.cfg
        options = {"intra_op_threads": self.threads, "instances": cfg.batch_instances, "max_sequences": self.slots,
                   "variant": self.variant, "max_queued_requests": cfg.batch_concurrency * self.beam}
        if cfg.batch_processes > 1:
            return await ProcessRunner.start(self.model.repository, self.task, cfg.batch_processes, **options)
        return await LocalRunner.start(self.model.repository, self.task, **options)

    def describe(self) -> dict[str, Any]:
        cfg = self.cfg
        return {"variant": self.variant, "processes": cfg.batch_processes,
                "generation_instances": f"{cfg.batch_instances} per process",
                "threads": f"{self.threads} per instance",
                "max_sequences": f"{cfg.batch_slots} x beams per instance",
                "requests_in_flight": cfg.batch_concurrency,
                "path": f"ortserve-batch --local --processes {cfg.batch_processes}'s runner (clients.batch: a "
                        "LocalRunner over the server's DataPlane in each process, no gRPC), answers kept in memory"}

    def run(self, texts: list[str]) -> tuple[float, list[str], int]:
        """(seconds, output texts, tokens without eos) of one batch job over `texts`."""
        return self.loop.run_until_complete(self._run(texts))

    async def _run(self, texts: list[str]) -> tuple[float, list[str], int]:
        from clients.batch.input import Record as BatchRecord

        in_flight = asyncio.Semaphore(self.cfg.batch_concurrency)

        async def one(i: int, text: str) -> dict[str, Any]:
            async with in_flight:
                return await self.runner.run(BatchRecord(line=i + 1, id=i + 1, text=text))
        t0 = time.perf_counter()
        rows = await asyncio.gather(*(one(i, t) for i, t in enumerate(texts)))
        wall = time.perf_counter() - t0
        tokens = sum(r["usage"]["completion_tokens"] - (r["finish_reason"] == "eos") for r in rows)
        return wall, [r["text"] for r in rows], tokens

    def close(self) -> None:
        self.loop.run_until_complete(self.runner.close())
        self.loop.close()


def has_variant(model: Model, variant: str) -> bool:
    from modelpkg import Manifest

    return variant in Manifest.from_json((model.package / "model.json").read_text()).variants


def batch_piece(model: Model, cfg: Config, src: Sources, sides: dict[str, Any]) -> dict[str, Any]:
    max_new, min_new = limits(model, cfg)
    variants = {"ortserve": "fp32", **{f"ortserve_{v}": v for v in cfg.ortserve_quantized
                                       if has_variant(model, v)}}    # the gate may have refused one
    peers = {"ct2": ct2_peer(model, "float32", cfg)}
    if cfg.ct2_int8:
        peers["ct2_int8"] = ct2_peer(model, "int8", cfg)
    mine: dict[str, OrtserveBatch] = {}
    for name, p in peers.items():
        sides.setdefault(f"{name}_batch", {**p.threads, "max_batch_size": cfg.ct2_max_batch_size,
                                           "batch_type": "examples", "path": "translate_batch over every input"})
    out: dict[str, Any] = {"inputs": len(src.texts), "max_new_tokens": max_new, "min_new_tokens": min_new}
    try:
        for beam, count in ((1, 16), (max(cfg.beams), 8)):           # warm-up: sessions, allocator, shapes
            for p in peers.values():
                p.request({"op": "batch", "sources": src.tokens[:count], "beam": beam, "max_new": max_new,
                           "min_new": min_new, "max_batch_size": cfg.ct2_max_batch_size})
        for beam in cfg.beams:
            # ortserve's slots are per beam width (one data plane per variant while its beam width runs)
            mine = {name: OrtserveBatch(model, cfg, v, beam) for name, v in variants.items()}
            for name, side in mine.items():
                sides.setdefault(f"{name}_batch", side.describe())
                side.run(src.texts[:16])
            runs: dict[str, list[dict[str, Any]]] = {**{k: [] for k in mine}, **{k: [] for k in peers}}
            texts: dict[str, list[str]] = {}
            order = list(runs)
            for r in range(cfg.rounds):
                for side in (order if r % 2 == 0 else order[::-1]):
                    time.sleep(1.0)          # the other side's threads stop spinning
                    if side in mine:
                        wall, outs, tokens = mine[side].run(src.texts)
                    else:
                        reply = peers[side].request({"op": "batch", "sources": src.tokens, "beam": beam,
                                                     "max_new": max_new, "min_new": min_new,
                                                     "max_batch_size": cfg.ct2_max_batch_size})
                        wall, outs = reply["wall_s"], [" ".join(o) for o in reply["outputs"]]
                        tokens = sum(len(o) for o in reply["outputs"])
                    texts[side] = outs
                    runs[side].append({"wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall})
                    log.info("batch %s beam %d %s: %d tokens in %.2f s = %.0f tok/s", model.name, beam, side, tokens,
                             wall, tokens / wall)
            cell: dict[str, Any] = {s: {"runs": v, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in v)}
                                    for s, v in runs.items()}
            cell["ratio_vs_ct2"] = cell["ortserve"]["tokens_per_s"] / cell["ct2"]["tokens_per_s"]
            cell["identical_outputs_vs_ct2"] = agreement(texts["ortserve"], texts["ct2"])
            if "ct2_int8" in texts:
                cell["identical_outputs_ct2_int8_vs_float32"] = agreement(texts["ct2_int8"], texts["ct2"])
            for v in cfg.ortserve_quantized:
                if f"ortserve_{v}" in texts and "ct2_int8" in texts:
                    cell[f"ratio_{v}_vs_ct2_int8"] = (cell[f"ortserve_{v}"]["tokens_per_s"]
                                                      / cell["ct2_int8"]["tokens_per_s"])
                    cell[f"identical_outputs_{v}_vs_fp32"] = agreement(texts[f"ortserve_{v}"], texts["ortserve"])
            cell["examples"] = [{"source": s, "ortserve": texts["ortserve"][i], "ct2": texts["ct2"][i]}
                                for i, s in enumerate(src.texts[:3])]
            out[f"beam{beam}"] = cell
            for side in mine.values():
                side.close()
            mine = {}
    finally:
        for side in mine.values():
            side.close()
        for p in peers.values():
            p.close()
    return out


# ----------------------------------------------------------------------------- served


SERVED_VARIANT = "fp32"


class OrtserveServed:
    """A real server process of `threads` onnxruntime threads (spinning between runs when more than one), and its
    clients: the asyncio client library (clients/aio.py), every client a coroutine on one event loop of a thread of
    its own — the load generator that takes the least of the cores the server shares with it (bench/FINDINGS.md,
    "The served g2p request's event loop, and the benchmark's clients")."""

    def __init__(self, model: Model, cfg: Config, threads: int, root: Path = ROOT,
                 flags: tuple[str, ...] = ()) -> None:
        """root: the source tree whose server runs, flags: server flags after the benchmark's (bench/s2s_ab.py)."""
        from clients.aio import AsyncOrtserveClient
        from testing.launch import ServerProcess

        self.model, self.cfg, self.threads = model, cfg, threads
        self.spinning = "on" if threads > 1 else "off"
        # fp32 against the peers' float32: the package's CPU default may be an 8-bit variant (the export times them)
        self.server = ServerProcess(model.repository, ["--intra-op-threads", str(threads), "--intra-op-spinning",
                                                       self.spinning, "--max-sequences", str(cfg.served_slots),
                                                       "--variant", SERVED_VARIANT, *flags], startup_timeout=300,
                                    root=root)
        self.params = ortserve_params(model, cfg, 1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="ortserve-clients", daemon=True)
        self._thread.start()
        self.client = AsyncOrtserveClient(self.server.address, timeout=600)
        self._on_loop(self.client.__aenter__())     # the channel belongs to this loop

    def describe(self, delivery: str) -> dict[str, Any]:
        return {"variant": SERVED_VARIANT, "threads": self.threads, "intra_op_spinning": self.spinning,
                "max_sequences": self.cfg.served_slots, "delivery": DELIVERIES[delivery],
                "path": "python -m server (a real server process), GenerateStream over gRPC with the asyncio client "
                        "(one coroutine per client on one event loop)"}

    def serve(self, delivery: str, n_clients: int, texts: list[str]) -> tuple[float, list[Record]]:
        """run_clients' answer for n_clients closed-loop clients sending `texts` in `delivery`: "answer": the first
        token as soon as it exists, then the rest with the end (stream_interval = max_new_tokens), what the peers'
        loop gives its callers (a callback at the first step, the output at the end); "tokens": a message per
        token."""
        params = {**self.params, "stream_interval": self.params["max_new_tokens"]} if delivery == "answer" \
            else self.params

        async def call(text: str, on_token: Callable[[], None]) -> list[int]:
            ids: list[int] = []
            async for chunk in self.client.generate_stream(text, self.model.name, **params):
                if chunk.tokens:
                    on_token()
                ids += [t.token_id for t in chunk.tokens]
            if ids and ids[-1] == self.model.eos_id and not self.model.fixed_length:
                ids.pop()
            return ids
        return self._on_loop(run_clients_async(n_clients, texts, call))

    def _on_loop(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def close(self) -> None:
        try:
            self._on_loop(self.client.close())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join()
            self._loop.close()
            self.server.stop()


# Served ortserve's two deliveries of a stream (OrtserveServed.serve): delivery -> its description, and the suffix
# of its side names and ratio keys ("ortserve_alt_tokens", "ratio_tokens_vs_ct2"; the peers' delivery has none).
DELIVERIES = {"answer": "GenerateStream with stream_interval = max_new_tokens: the first token at once, the rest "
                        "with the end (what the peers' loop hands its callers)",
              "tokens": "GenerateStream, a message per token"}
SUFFIX = {"answer": "", "tokens": "_tokens"}


def ortserve_layouts(cfg: Config) -> dict[str, int]:
    """Served, ortserve runs in two thread layouts as CTranslate2 does (ct2_layouts) and the faster counts per
    cell: every core in the decode step serves one client best; one thread leaves the other cores to the event
    loop (gRPC's own code) and the clients when many stream at once."""
    return {"ortserve": cfg.threads, "ortserve_alt": 1} if cfg.threads > 1 else {"ortserve": 1}


def served_piece(model: Model, cfg: Config, src: Sources, sides: dict[str, Any]) -> dict[str, Any]:
    max_new, min_new = limits(model, cfg)
    servers = {name: OrtserveServed(model, cfg, threads) for name, threads in ortserve_layouts(cfg).items()}
    # Each server in both deliveries: "ortserve" / "ortserve_alt" as the peers deliver, "..._tokens" per token.
    ours = {name + SUFFIX[delivery]: (server, delivery) for name, server in servers.items() for delivery in DELIVERIES}
    layouts = ct2_layouts(cfg)
    peers = {**{name: ct2_peer(model, "float32", cfg, lay) for name, lay in layouts.items()}, "hf": hf_peer(model, cfg)}
    for name, (server, delivery) in ours.items():
        sides.setdefault(f"{name}_served", server.describe(delivery))

    def path(call: str, loops: int) -> str:
        return (f"{call} per batch, greedy, in its own process: closed-loop client threads and {loops} "
                f"arrival-batching loop{'s' if loops > 1 else ''} (max {cfg.served_slots} rows a batch)")
    for name, (inter, _) in layouts.items():
        sides.setdefault(f"{name}_served", {**peers[name].threads, "path": path("translate_batch", inter)})
    sides.setdefault("hf_served", {**peers["hf"].threads, "path": path("generate", 1)})
    out: dict[str, Any] = {"max_new_tokens": max_new, "min_new_tokens": min_new, "peer_max_batch": cfg.served_slots}
    try:
        for n, count in cfg.warmup_clients:      # untimed: first calls of each batch shape (torch's above all)
            for server, delivery in ours.values():
                server.serve(delivery, n, src.texts[:count])
            for p in peers.values():
                p.request({"op": "clients", "clients": n, "sources": _peer_sources(p, src)[:count], "max_new": max_new,
                           "min_new": min_new, "max_batch": cfg.served_slots})
        for n in cfg.clients:
            count = n * cfg.requests_per_client[model.name][n]
            rows: dict[str, list[dict[str, Any]]] = {**{k: [] for k in ours}, **{k: [] for k in peers}}
            order = list(rows)
            for r in range(cfg.rounds):
                for side in (order if r % 2 == 0 else order[::-1]):
                    time.sleep(1.0)
                    if side in ours:
                        server, delivery = ours[side]
                        wall, recs = server.serve(delivery, n, src.texts[:count])
                        summary = summarize(wall, recs)
                        summary["batches"] = None
                    else:
                        reply = peers[side].request({"op": "clients", "clients": n, "max_new": max_new,
                                                     "min_new": min_new, "max_batch": cfg.served_slots,
                                                     "sources": _peer_sources(peers[side], src)[:count]})
                        recs = [Record(**r) for r in reply["records"]]
                        summary = summarize(reply["wall_s"], recs)
                        summary["batches"] = _batch_sizes(reply["batches"])
                    rows[side].append(summary)
                    log.info("served %s %d clients %s: %.0f tok/s, TTFT p50 %.0f ms", model.name, n, side,
                             summary["tokens_per_s"], summary["ttft_p50_ms"])
            cell: dict[str, Any] = {
                s: {"runs": v, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in v),
                    "ttft_p50_ms": statistics.median(x["ttft_p50_ms"] for x in v),
                    "ttft_p90_ms": statistics.median(x["ttft_p90_ms"] for x in v)} for s, v in rows.items()}
            cell["requests"] = count
            best = max(layouts, key=lambda k: cell[k]["tokens_per_s"])
            cell["ct2_best"] = {"side": best, "layout": "{}x{}".format(*layouts[best])}
            for delivery, suffix in SUFFIX.items():
                mine = max((k for k in ours if ours[k][1] == delivery), key=lambda k: cell[k]["tokens_per_s"])
                cell[f"ortserve{suffix}_best"] = {"side": mine, "threads": ours[mine][0].threads}
                cell[f"ratio{suffix}_vs_ct2"] = cell[mine]["tokens_per_s"] / cell[best]["tokens_per_s"]
                cell[f"ratio{suffix}_vs_hf"] = cell[mine]["tokens_per_s"] / cell["hf"]["tokens_per_s"]
            out[str(n)] = cell
    finally:
        for side in [*servers.values(), *peers.values()]:
            side.close()
    return out


def _peer_sources(peer: Peer, src: Sources) -> list:
    return src.tokens if peer.name.startswith("ct2") else src.ids


def _batch_sizes(batches: list[int]) -> dict[str, float]:
    return {"calls": len(batches), "mean_rows": float(np.mean(batches)) if batches else 0.0,
            "max_rows": max(batches, default=0)}


# ----------------------------------------------------------------------------- step growth


class StepTimer:
    """The fp32 decoder graph's step at a batch (export.seq2seq_speed's stepper: the self cache bound in place,
    cross keys/values of `source` positions), on one shared spinning pool as the server runs it."""

    def __init__(self, package: Path, threads: int, batch: int, source: int = 24) -> None:
        import onnxruntime as ort

        from export.seq2seq_speed import Seq2SeqStepper as DecoderStepper
        from modelpkg import Manifest

        manifest = Manifest.from_json((package / "model.json").read_text())
        spec = manifest.encoder_decoder
        assert spec is not None
        try:     # one shared spinning pool, as the server's (step_piece runs this in a process of its own)
            ort.set_global_thread_pool_sizes(threads, 1)
        except Exception:       # noqa: BLE001 - made already: join it
            pass
        opts = ort.SessionOptions()
        opts.use_per_session_threads = False
        opts.add_session_config_entry("session.intra_op.allow_spinning", "1")
        self.sess = ort.InferenceSession(str(package / spec.decoder_file("fp32")), opts,
                                         providers=["CPUExecutionProvider"])
        self.spec, self.batch = spec, batch
        self.stepper = DecoderStepper(self.sess, spec, batch, 0, source)

    def step_ms(self, position: int, n: int = 15) -> float:
        """Median ms of a step writing the token at `position` (past = position tokens)."""
        self.stepper.at(position)
        for _ in range(3):
            self.stepper.step()
        times = []
        for _ in range(n):
            t = time.perf_counter()
            self.stepper.step()
            times.append(time.perf_counter() - t)
        return 1000 * statistics.median(times)

    def extra_cache_bytes(self, short: int, long: int) -> int:
        s = self.spec
        return self.batch * s.num_layers * 2 * s.num_heads * (long - short) * s.head_dim * 4


def step_piece(model: Model, cfg: Config) -> dict[str, Any]:
    """measure_step in a process of its own: a process has one onnxruntime pool of spinning threads, which the step
    makes with every core (the benchmark's own process may hold engines of fewer threads)."""
    args = [str(model.package), cfg.threads, cfg.step_batch, list(cfg.step_positions), cfg.step_rounds]
    code = ("import json, sys; from bench.seq2seq import measure_step; "
            "print(json.dumps(measure_step(*json.loads(sys.argv[1]))))")
    done = subprocess.run([sys.executable, "-c", code, json.dumps(args)], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    if done.returncode != 0:
        raise MaterialError(f"{model.name}: the step piece failed: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_step(package: str, threads: int, batch: int, positions: list[int], rounds: int) -> dict[str, Any]:
    from .generation import read_bandwidth

    short, long = positions
    stepper = StepTimer(Path(package), threads, batch)
    if stepper.spec.max_target_length <= long:
        raise MaterialError(f"{package}: the self cache holds {stepper.spec.max_target_length} target tokens, "
                            f"the step piece writes position {long}")
    times: dict[int, list[float]] = {short: [], long: []}
    for _ in range(rounds):
        for pos in (short, long):
            times[pos].append(stepper.step_ms(pos))
    bandwidth = read_bandwidth(threads)
    a, b = statistics.median(times[short]), statistics.median(times[long])
    extra = stepper.extra_cache_bytes(short, long)
    floor = 1000 * extra / bandwidth
    return {"batch": batch, "positions": [short, long], "rounds": rounds,
            "runs": {str(k): v for k, v in times.items()},
            "short_ms": a, "long_ms": b, "growth_ms": b - a, "extra_cache_bytes": extra,
            "read_bandwidth_gb_s": bandwidth / 1e9, "read_floor_ms": floor, "growth_over_floor": (b - a) / floor}


# ----------------------------------------------------------------------------- main


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def run(cfg: Config, command: str, g2p: Path | None, out_path: Path) -> dict[str, Any]:
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    t0 = time.monotonic()
    models = build(cfg.work, cfg.models, g2p, cfg.threads)
    sides: dict[str, Any] = {}
    report: dict[str, Any] = {"command": command, "started": started, "machine": describe(ROOT),
                              "config": {k: (str(v) if isinstance(v, Path) else v)
                                         for k, v in dataclasses.asdict(cfg).items()},
                              "sides": sides, "models": {}, "material_s": round(time.monotonic() - t0, 1)}
    report["config"]["requests_per_client"] = {m: {str(k): v for k, v in per.items()}
                                               for m, per in cfg.requests_per_client.items()}

    def save() -> None:
        report["load_at_end"] = _load()
        report["elapsed_s"] = round(time.monotonic() - t0, 1)
        write_json(out_path, report)

    for name, model in models.items():
        entry: dict[str, Any] = report["models"].setdefault(name, {"checkpoint": str(model.checkpoint),
                                                                   "ct2_conversion": model.ct2_conversion})
        n_batch = cfg.batch_inputs[name]
        most = max([n * cfg.requests_per_client[name][n] for n in cfg.clients]
                   + [count for _, count in cfg.warmup_clients])
        src = sources(model, max(n_batch, most))
        if "batch" in cfg.pieces:
            entry["batch"] = batch_piece(model, cfg, Sources(src.texts[:n_batch], src.tokens[:n_batch],
                                                             src.ids[:n_batch]), sides)
            save()
        if "served" in cfg.pieces:
            entry["served"] = served_piece(model, cfg, src, sides)
            save()
        if "step" in cfg.pieces and model.name == "marian":
            entry["step"] = step_piece(model, cfg)
            sides.setdefault("ortserve_step", {"threads": cfg.threads, "intra_op_spinning": "on",
                                               "path": "decoder.onnx in-process, IOBinding, cache bound in place"})
            save()
    save()
    return report


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="short runs for development (noisy; ~2 min once built)")
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma list of {','.join(MODELS)}")
    ap.add_argument("--pieces", default=",".join(PIECES), help=f"comma list of {','.join(PIECES)}")
    ap.add_argument("--checkpoint", type=Path, default=None,
                    help="the g2p checkpoint (default artifacts/checkpoints/g2p, trained first when absent)")
    ap.add_argument("--ct2-threads", default=None, metavar="INTERxINTRA",
                    help="CTranslate2's inter_threads x intra_threads (default 2 x CORES/2: two replicas)")
    ap.add_argument("--rounds", type=int, default=None, help="turns per side and cell")
    ap.add_argument("--marian-inputs", type=int, default=None,
                    help=f"the Marian shape's batch-job inputs (default {Config().batch_inputs['marian']}; the issue's "
                         "2,000 take ~10 minutes a round)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "seq2seq.json")
    ap.add_argument("--work", type=Path, default=Config.work, help="checkpoints, packages and conversions (reused)")
    ap.add_argument("--docs", type=Path, default=None, help="write the seq2seq block of this report")
    ap.add_argument("--render-only", action="store_true", help="only (re)write --docs from --out")


def cli(a: argparse.Namespace) -> int | None:
    try:
        if a.render_only:
            if a.docs is None:
                raise ValueError("--render-only: needs --docs")
            if not a.out.is_file():
                raise ValueError(f"--out: {a.out} does not exist (run the benchmark first)")
            publish(read_json(a.out), None, a.docs, BLOCK, render)
            return 0
        cfg = Config.quick() if a.quick else Config()
        cfg = dataclasses.replace(cfg, models=_choice("--models", a.models, MODELS),
                                  pieces=_choice("--pieces", a.pieces, PIECES), work=a.work)
        if a.rounds is not None:
            if a.rounds < 1:
                raise ValueError(f"--rounds: must be >= 1, got {a.rounds}")
            cfg = dataclasses.replace(cfg, rounds=a.rounds)
        if a.marian_inputs is not None:
            if a.marian_inputs < 1:
                raise ValueError(f"--marian-inputs: must be >= 1, got {a.marian_inputs}")
            cfg = dataclasses.replace(cfg, batch_inputs={**cfg.batch_inputs, "marian": a.marian_inputs})
        if a.ct2_threads:
            inter, _, intra = a.ct2_threads.partition("x")
            if not (inter.isdigit() and intra.isdigit() and int(inter) >= 1 and int(intra) >= 1):
                raise ValueError(f"--ct2-threads: expected INTERxINTRA such as 1x2, got {a.ct2_threads!r}")
            cfg = dataclasses.replace(cfg, ct2_inter_threads=int(inter), ct2_intra_threads=int(intra))
        command = a.invocation
        report = run(cfg, command, a.checkpoint, a.out)
    except (ValueError, MaterialError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(publish(report, None, a.docs, BLOCK, render)))
    return 0


def _choice(flag: str, text: str, known: tuple[str, ...]) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    bad = [x for x in names if x not in known]
    if bad or not names:
        raise ValueError(f"{flag}: unknown {bad[0]!r} (choose from {', '.join(known)})" if bad else f"{flag}: empty")
    return names


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "ctranslate2", "transformers"), pieces=PIECES, options=options, run=cli)
