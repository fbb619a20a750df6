"""Generation against the peers, on one 124M-shaped GPT-2 checkpoint (12 layers, 768 wide, vocab 8000, fp32).

    python -m bench generation [--quick] [--out bench/results/generation.json]

Pieces, each interleaved run by run so both sides share the machine's noise:
  streams   aggregate tokens/s and time to first token at 1/4/8/16/32 concurrent streams: ortserve
            (GenerateStream over gRPC, in-place engine) vs vLLM's CPU build (OpenAI /v1/completions,
            streamed); 32-token prompts (first token varied: no prefix-cache hits), 128 new tokens, greedy,
            ignore eos;
  arrival   4 streams decoding when a 900-token prompt arrives: the largest gap the running streams
            see vs their median inter-token latency, and the long prompt's time to first token vs a lone
            prefill of it, for several prefill chunk sizes;
  leave     16 streams with staggered lengths: the inter-token gap right after a sequence leaves vs the median;
  step      one decode step at batch 8 with past 1000 vs past 16 (in-process), against the time to read
            the extra cache once at the memory bandwidth measured in the same run;
  genai     onnxruntime-genai running the same model.onnx in-process at batch 1 and 8 vs ortserve over gRPC;
  prefix    a long context, then a new question on the same context: time to first token of both, with the
            server's prefix caching on and off (and vLLM's automatic prefix caching, when vLLM runs).
Peers live in their own environments: bench/setup_vllm.sh, bench/setup_genai.sh.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import re
import shutil
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelpkg import CACHE_ELEMENT_TYPES, past_names, present_names
from server.generation import GenerationConfig
from testing.closedloop import drive, per_client
from testing.launch import ChildProcess as Process, ServerProcess, free_port, start_peer

from .generation_report import DURING_NEW_TOKENS, current_runs, write_docs
from .results import write_json
from .machine import describe
from .stats import percentile
from .material import bpe_tokenizer_dir, random_gpt
from .vllm_env import VllmLaunch, bound_cores, vllm_launch
from bench.harness import Benchmark

ENGINE_DEFAULTS = GenerationConfig()     # what the server runs with, as the reports print it
log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
VLLM_VENV = HERE / ".venv-vllm"
GENAI_VENV = HERE / ".venv-genai"
SHAPE = {"n_layer": 12, "n_embd": 768, "n_head": 12}


@dataclass
class Config:
    concurrency: tuple[int, ...] = (1, 4, 8, 16, 32)
    prompt_tokens: int = 32
    new_tokens: int = 128
    repeats: int = 2
    spinning: str = "on"             # the server's --intra-op-spinning (on: one shared pool, spinning)
    chunk_sizes: tuple[int, ...] = (16, 20, 28)   # 20 = the server's default
    long_prompt: int = 900
    threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))   # every core, for every side
    work: Path = ROOT / "bench" / "results" / "generation-work"
    pieces: tuple[str, ...] = ("step", "streams", "arrival", "leave", "genai", "spinning", "prefix")
    model: str = "gpt2"             # "gpt2" or "llama" (grouped-query attention)
    variant: str | None = None      # the package variant ortserve serves and genai runs (None: the package default)
    extra_variants: tuple[str, ...] = ()   # exported beside fp32 and kv8 (e.g. w8, w4: weight-quantized)
    stream_interval: int = 1        # the server's --stream-interval (1: a message per token, its default)

    @classmethod
    def quick(cls) -> "Config":
        return cls(concurrency=(1, 4), new_tokens=32, repeats=1, chunk_sizes=(20,), long_prompt=300)


# ----------------------------------------------------------------------------- material


LLAMA_TRAIN_STEPS = 150


def trained_llama(work: Path) -> Path:
    """The Llama of the 124M budget (12 layers, 768 wide, 12 heads / 4 kv heads, SwiGLU 2048, vocab 8000, tied head:
    `python -m training lm --arch llama --preset base`) trained briefly on Shakespeare with the bench tokenizer.

    Speed does not depend on the weights, but the export gate does: on random weights the next-token logits are
    almost flat, and the weight-quantized variants' greedy continuations drift from fp32 on near-ties (w8 23.2,
    w4 4.0 of 32 tokens, under the gate's limits). 150 steps of 8 x 64 tokens (~3 minutes on the 2 cores; test
    perplexity ~420) give logits with margins, so w8 / w4 are judged by the same gate as any model. It is not a
    good language model: the accuracy of the variants is stated on the trained defaults (docs/BENCHMARKS.md,
    "Weight-quantized decoders")."""
    out = work / "llama-124m-trained"
    if (out / "config.json").is_file():
        return out
    tok_dir = bpe_tokenizer_dir(work)
    log.info("training the 124M Llama for the benchmarks (%d steps, ~3 minutes on 2 cores) into %s",
             LLAMA_TRAIN_STEPS, out)
    subprocess.run([sys.executable, "-m", "training", "lm", "--arch", "llama", "--preset", "base",
                    "--tokenizer", str(tok_dir), "--steps", str(LLAMA_TRAIN_STEPS), "--batch-size", "8",
                    "--max-length", "64", "--lr", "1e-3", "--warmup", "15", "--schedule", "cosine",
                    "--dropout", "0", "--out", str(out)], cwd=ROOT, check=True)
    return out


def material(cfg: Config) -> tuple[Path, Path, list[int]]:
    """(checkpoint dir, model repository with the in-place export, token ids to draw prompts from)."""
    from tokenizers import Tokenizer

    cfg.work.mkdir(parents=True, exist_ok=True)
    if cfg.model == "llama":
        ckpt = trained_llama(cfg.work)
        exports: tuple[tuple[str, str], ...] = (("gpt", "inplace"),)
        repo = cfg.work / "repository-llama-trained"
    else:
        ckpt = random_gpt(cfg.work, "gpt2-124m-random", overrides_from=SHAPE).path
        exports = (("gpt", "inplace"),)
        repo = cfg.work / "repository"
    for name, layout in exports:
        pkg = repo / name / "1"
        wanted = ("fp32", "kv8", *cfg.extra_variants) if layout == "inplace" else ("fp32",)
        if (pkg / "parity.json").is_file() and layout == "inplace":
            manifest = json.loads((pkg / "model.json").read_text())
            if "kv8" not in manifest["cache"].get("mixed_graphs", {}) \
                    or any(v not in manifest["variants"] for v in cfg.extra_variants):
                shutil.rmtree(pkg)     # made before kv8 (and its mixed twin) existed, or without a wanted variant
        if not (pkg / "parity.json").is_file():
            export_decoder(ckpt, repo, name, layout, wanted, cfg.threads)
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir(cfg.work) / "tokenizer.json"))
    from .material import passages

    ids: list[int] = []
    for text in passages(400, 40, seed=1):
        ids += tok.encode(text).ids
    return ckpt, repo, ids


def export_decoder(ckpt: Path, repo: Path, name: str, layout: str, wanted: tuple[str, ...], threads: int) -> None:
    """`python -m export` with the wanted variants; when the gate refuses (exit 1), again without kv8, then with fp32
    alone (a variant the gate refused is then missing from the package, and serving it fails naming it)."""
    cmd = [sys.executable, "-m", "export", str(ckpt), "--task", "generate", "--repository", str(repo),
           "--name", name, "--version", "1", "--threads", str(threads)]
    attempts = list(dict.fromkeys([wanted, tuple(v for v in wanted if v != "kv8"), ("fp32",)]))
    for i, variants in enumerate(attempts):
        done = subprocess.run([*cmd, "--variants", ",".join(variants)], cwd=ROOT)
        if done.returncode == 0:
            return
        if done.returncode != 1 or i == len(attempts) - 1:
            raise subprocess.CalledProcessError(done.returncode, done.args)
        log.warning("%s: the parity gate refused variants of %s; exporting %s", name, ",".join(variants),
                    ",".join(attempts[i + 1]))


def prompts(pool: list[int], n: int, length: int, salt: int) -> list[list[int]]:
    """n prompts of `length` ids; the first id differs per prompt so no prefix cache can reuse another's work."""
    out = []
    for i in range(n):
        start = (salt * 7919 + i * 613) % (len(pool) - length)
        p = pool[start:start + length]
        p[0] = (salt * 31 + i) % 7000 + 500
        out.append(p)
    return out


# ----------------------------------------------------------------------------- clients (one thread per stream)


@dataclass
class StreamRecord:
    start: float
    stamps: list[float] = field(default_factory=list)   # arrival time of each token
    tokens: int = 0

    @property
    def ttft(self) -> float:
        return self.stamps[0] - self.start

    def gaps(self) -> list[float]:
        return list(np.diff(self.stamps))


class OrtserveStreams:
    def __init__(self, address: str, model: str) -> None:
        import grpc

        from protos import ortserve_pb2 as pb
        from protos import ortserve_pb2_grpc as rpc

        self.pb, self.model = pb, model
        self.channel = grpc.insecure_channel(address)
        self.stub = rpc.TaskServiceStub(self.channel)

    def stream(self, ids: list[int], new_tokens: int, tok) -> StreamRecord:
        pb = self.pb
        prompt = tok.decode(ids)
        req = pb.GenerateRequest(model=self.model, prompt=prompt,
                                 parameters=pb.GenerationParameters(max_new_tokens=new_tokens, ignore_eos=True))
        rec = StreamRecord(time.perf_counter())
        for chunk in self.stub.GenerateStream(req, timeout=600):
            now = time.perf_counter()
            for _ in chunk.tokens:
                rec.stamps.append(now)
            rec.tokens += len(chunk.tokens)
        return rec

    def close(self) -> None:
        self.channel.close()


class OpenAIStreams:
    """Streamed /v1/completions of an OpenAI-compatible server (vLLM, llama-server), prompts sent as token ids."""

    def __init__(self, port: int, model: str) -> None:
        import requests
        import requests.adapters

        self.session = requests.Session()
        # One kept-alive connection per stream (the default pool of 10 would reconnect beyond 10 streams).
        adapter = requests.adapters.HTTPAdapter(pool_connections=1, pool_maxsize=64)
        self.session.mount("http://", adapter)
        self.url = f"http://127.0.0.1:{port}/v1/completions"
        self.model = model

    def stream(self, ids: list[int], new_tokens: int, tok) -> StreamRecord:
        import requests

        body = {"model": self.model, "prompt": ids, "max_tokens": new_tokens, "temperature": 0.0, "ignore_eos": True,
                "stream": True, "stream_options": {"include_usage": True}}
        try:
            return self._stream(body)
        except requests.ConnectionError:
            # A kept-alive connection that the server closed (its keep-alive timeout, 5 s) as this request went
            # out: nothing was generated, so send it again on a new connection.
            log.warning("the server closed a kept-alive connection; sending the request again")
            return self._stream(body)

    def _stream(self, body: dict[str, Any]) -> StreamRecord:
        rec = StreamRecord(time.perf_counter())
        with self.session.post(self.url, json=body, stream=True, timeout=600) as r:
            r.raise_for_status()
            for line in r.iter_lines():
                if not line.startswith(b"data: ") or line == b"data: [DONE]":
                    continue
                event = json.loads(line[6:])
                now = time.perf_counter()
                if event.get("choices") and event["choices"][0].get("text") is not None and \
                        (event["choices"][0]["text"] or event["choices"][0].get("finish_reason") is None):
                    rec.stamps.append(now)
                if event.get("usage"):
                    rec.tokens = int(event["usage"]["completion_tokens"])
        if not rec.tokens:      # a server that sends no usage: one event per token
            rec.tokens = len(rec.stamps)
        return rec

    def close(self) -> None:
        self.session.close()


VllmStreams = OpenAIStreams


def run_streams(client: Any, batch: list[list[int]], new_tokens: int, tok, stagger: float = 0.0
                ) -> tuple[float, list[StreamRecord]]:
    """All streams at once (optionally staggered); wall time from the first start to the last token.

    The threads meet at a barrier before sending: a pool starts its threads one by one, and without it the
    first request went out up to 8 ms before the second, so "8 streams at once" reached a server as one
    prompt, then seven (measured 2026-11-24: the server prefilled them over ~14 steps, ~10% of a 128-token run)."""
    def one(c: int, i: int, first: Any) -> StreamRecord:
        time.sleep(stagger * c)
        return client.stream(batch[c], new_tokens, tok)

    run = drive(one, len(batch), per_client(1))
    recs = [r.output for r in sorted(run.records, key=lambda r: r.client)]
    t0 = min(r.start for r in recs)
    return max(r.stamps[-1] if r.stamps else r.start for r in recs) - t0, recs


# ----------------------------------------------------------------------------- servers


def start_ortserve(repo: Path, cfg: Config, chunk: int | None = None, slots: int = 32,
                   spinning: str | None = None, prefix_caching: str = "on", extra_args: tuple[str, ...] = ()
                   ) -> ServerProcess:
    """The server with its defaults except: 2 threads, 32 slots (the peers' --max-num-seqs), no polling, and
    cfg.spinning (default "on": spinning threads on one shared pool, as for a dedicated machine, like the
    peers' threads); `extra_args` last."""
    spinning = spinning or cfg.spinning
    extra = ["--prefill-chunk-tokens", str(chunk)] if chunk is not None else []
    extra += ["--prefix-caching", prefix_caching]
    if cfg.variant:
        extra += ["--variant", cfg.variant]
    if cfg.stream_interval != 1:
        extra += ["--stream-interval", str(cfg.stream_interval)]
    return ServerProcess(repo, ["--metrics-port", "-1", "--intra-op-threads", str(cfg.threads),
                                "--max-sequences", str(slots), "--poll-interval", "0",
                                "--intra-op-spinning", spinning, *extra, *extra_args])


@dataclass
class VllmServer:
    """vLLM's OpenAI server as started for a run, and the environment it was given (the report prints both)."""

    proc: Process
    port: int
    launch: VllmLaunch

    def describe(self) -> dict[str, Any]:
        """Threads and binding as configured, and the cores vLLM's own log says it bound to."""
        return {**self.launch.describe(), "logged_core_ids": bound_cores(self.proc.lines)}

    def stop(self) -> None:
        self.proc.stop()


def start_vllm(ckpt: Path, cfg: Config) -> VllmServer:
    """vLLM as its CPU docs recommend for a dedicated machine: compute bound to cfg.threads cores of this process's
    affinity with none reserved (its default reserves one: on 2 cores it computed on one), tcmalloc + libiomp5
    preloaded (bench/vllm_env.py)."""
    py = VLLM_VENV / "bin" / "python"
    if not py.is_file() or not (VLLM_VENV / ".complete").is_file():
        raise RuntimeError("vLLM peer not installed: run bash bench/setup_vllm.sh")
    launch = vllm_launch(VLLM_VENV, sorted(os.sched_getaffinity(0))[:cfg.threads])
    port = free_port()
    proc = start_peer([*launch.command_prefix(), str(py), "-m", "vllm.entrypoints.openai.api_server", "--model",
                       str(ckpt), "--port", str(port), "--dtype", "float32", "--max-model-len", "1024",
                       "--served-model-name", "gpt", "--max-num-seqs", "32"], "vLLM's startup line",
                      line=re.compile(r"Application startup complete|Uvicorn running"), timeout=900, env=launch.env)
    server = VllmServer(proc, port, launch)
    logged = bound_cores(proc.lines)
    if logged is not None and sorted(logged) != list(launch.cores):
        log.warning("vLLM bound its compute to cores %s, not %s as configured", logged, list(launch.cores))
    log.info("vLLM: %s", server.describe())
    return server


def ortserve_side(cfg: Config, variant: str | None = None) -> dict[str, Any]:
    """What start_ortserve gives the server (printed in the report beside the peers')."""
    return {"threads": cfg.threads, "binding": "not pinned (onnxruntime's default)",
            "intra_op_spinning": cfg.spinning, "max_sequences": 32, "variant": variant or "package default",
            "stream_interval": cfg.stream_interval, "decode_steps": ENGINE_DEFAULTS.decode_steps,
            "decode_run_ms": ENGINE_DEFAULTS.decode_run_ms}


# ----------------------------------------------------------------------------- pieces


def streams_piece(cfg: Config, clients: dict[str, Any], pool: list[int], tok) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for n in cfg.concurrency:
        rows: dict[str, list[dict[str, float]]] = {k: [] for k in clients}
        for rep in range(cfg.repeats):
            for name, client in clients.items():        # interleaved: ortserve, vllm, ortserve, vllm, ...
                time.sleep(1.0)   # the other side's threads stop spinning (OpenMP spins ~100s of ms after work)
                batch = prompts(pool, n, cfg.prompt_tokens, salt=1000 * n + 10 * rep + len(rows[name]))
                wall, recs = run_streams(client, batch, cfg.new_tokens, tok)
                tokens = sum(r.tokens for r in recs)
                rows[name].append({"tokens_per_s": tokens / wall, "ttft_p50_ms": 1000 * percentile([r.ttft for r in recs], 50),
                                   "itl_p50_ms": 1000 * percentile([g for r in recs for g in r.gaps()], 50), "tokens": tokens})
                log.info("streams %d %s: %.1f tok/s", n, name, rows[name][-1]["tokens_per_s"])
        out[str(n)] = {name: {"runs": r, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in r),
                              "ttft_p50_ms": statistics.median(x["ttft_p50_ms"] for x in r)} for name, r in rows.items()}
        if "vllm" in out[str(n)]:
            out[str(n)]["ratio_tokens_per_s"] = out[str(n)]["ortserve"]["tokens_per_s"] / out[str(n)]["vllm"]["tokens_per_s"]
    return out


def arrival_once(client: Any, pool: list[int], cfg: Config, tok, salt: int) -> dict[str, float]:
    """4 streams decode; a long prompt arrives after 1 s. Returns gap/ITL/TTFT figures."""
    running = prompts(pool, 4, cfg.prompt_tokens, salt)
    long = prompts(pool, 1, cfg.long_prompt, salt + 1)[0]
    new = cfg.new_tokens * 2
    result: dict[str, Any] = {}

    def arrive() -> None:
        time.sleep(1.0)
        result["long"] = client.stream(long, 4, tok)

    t = threading.Thread(target=arrive)
    t.start()
    _, recs = run_streams(client, running, new, tok)
    t.join()
    long_rec: StreamRecord = result["long"]
    gaps = [g for r in recs for g in r.gaps()]
    # The gaps the running streams saw while the long prompt was being admitted (arrival .. its first token).
    window = [b - a for r in recs for a, b in zip(r.stamps, r.stamps[1:])
              if b >= long_rec.start and a <= long_rec.stamps[0]]
    return {"largest_gap_ms": 1000 * max(window or gaps), "median_itl_ms": 1000 * statistics.median(gaps),
            "long_ttft_ms": 1000 * long_rec.ttft}


def arrival_piece(cfg: Config, repo: Path, vllm: Any, pool: list[int], tok) -> dict[str, Any]:
    out: dict[str, Any] = {"ortserve": {}}
    for chunk in cfg.chunk_sizes:
        server = start_ortserve(repo, cfg, chunk=chunk)
        client = OrtserveStreams(server.address, "gpt")
        try:
            runs, lone = [], []
            for rep in range(cfg.repeats):
                lone.append(1000 * client.stream(prompts(pool, 1, cfg.long_prompt, 500 + rep)[0], 4, tok).ttft)
                runs.append(arrival_once(client, pool, cfg, tok, salt=600 + 10 * rep))
        finally:
            client.close()
            server.stop()
        gap, itl = statistics.median(r["largest_gap_ms"] for r in runs), statistics.median(r["median_itl_ms"] for r in runs)
        ttft, lone_ttft = statistics.median(r["long_ttft_ms"] for r in runs), statistics.median(lone)
        out["ortserve"][str(chunk)] = {"runs": runs, "lone_prefill_ms": lone, "largest_gap_ms": gap, "median_itl_ms": itl,
                                       "gap_over_itl": gap / itl, "long_ttft_ms": ttft,
                                       "ttft_over_lone": ttft / lone_ttft}
        log.info("arrival chunk %d: gap %.0f ms = %.1fx ITL, TTFT %.0f ms = %.2fx lone", chunk, gap, gap / itl, ttft,
                 ttft / lone_ttft)
    if vllm is not None:
        runs = [arrival_once(vllm, pool, cfg, tok, salt=700 + 10 * rep) for rep in range(cfg.repeats)]
        lone = [1000 * vllm.stream(prompts(pool, 1, cfg.long_prompt, 800 + rep)[0], 4, tok).ttft for rep in range(cfg.repeats)]
        gap, itl = statistics.median(r["largest_gap_ms"] for r in runs), statistics.median(r["median_itl_ms"] for r in runs)
        out["vllm"] = {"runs": runs, "lone_prefill_ms": lone, "largest_gap_ms": gap, "median_itl_ms": itl,
                       "gap_over_itl": gap / itl, "long_ttft_ms": statistics.median(r["long_ttft_ms"] for r in runs),
                       "ttft_over_lone": statistics.median(r["long_ttft_ms"] for r in runs) / statistics.median(lone)}
    return out


def prefix_piece(cfg: Config, repo: Path, vllm: Any, pool: list[int], tok) -> dict[str, Any]:
    """A context of long_prompt - prompt_tokens tokens with a first question, then the same context with a second
    question: both requests' time to first token. Sides take turns; every run has a context of its own (first
    id varied), so only the second request of a run can find its prefix cached."""
    servers = {f"ortserve_prefix_{mode}": start_ortserve(repo, cfg, prefix_caching=mode) for mode in ("on", "off")}
    clients: dict[str, Any] = {name: OrtserveStreams(srv.address, "gpt") for name, srv in servers.items()}
    if vllm is not None:
        clients["vllm"] = vllm
    context_len = cfg.long_prompt - cfg.prompt_tokens
    rows: dict[str, dict[str, list[float]]] = {name: {"first_ms": [], "second_ms": [], "during_ms": []}
                                               for name in clients}
    try:
        for rep in range(2 * cfg.repeats):
            names = list(clients) if rep % 2 == 0 else list(reversed(clients))
            for i, name in enumerate(names):
                time.sleep(1.0)  # the other side's threads stop spinning
                salt = 3000 + 10 * rep + i
                context = prompts(pool, 1, context_len, salt)[0]
                q1, q2 = prompts(pool, 2, cfg.prompt_tokens, salt + 500)
                for key, question in (("first_ms", q1), ("second_ms", q2)):
                    rows[name][key].append(1000 * clients[name].stream(context + question, 4, tok).ttft)
                # Another context: its second question arrives while the first request still decodes.
                context = prompts(pool, 1, context_len, salt + 5)[0]
                with ThreadPoolExecutor(1) as first:
                    running = first.submit(clients[name].stream, context + q1, DURING_NEW_TOKENS, tok)
                    time.sleep(rows[name]["first_ms"][-1] / 1000 + 0.2)     # its first token is out: it decodes
                    rows[name]["during_ms"].append(1000 * clients[name].stream(context + q2, 4, tok).ttft)
                    running.result()
                log.info("prefix %s: first %.0f ms, second %.0f ms, second while the first decodes %.0f ms", name,
                         rows[name]["first_ms"][-1], rows[name]["second_ms"][-1], rows[name]["during_ms"][-1])
    finally:
        for name, client in clients.items():
            if name in servers:
                client.close()
        for srv in servers.values():
            srv.stop()
    out: dict[str, Any] = {"context_tokens": context_len, "question_tokens": cfg.prompt_tokens}
    for name, r in rows.items():
        first, second = statistics.median(r["first_ms"]), statistics.median(r["second_ms"])
        out[name] = {"runs": r, "first_ttft_ms": first, "second_ttft_ms": second, "second_over_first": second / first,
                     "during_ttft_ms": statistics.median(r["during_ms"])}
    on, off = out["ortserve_prefix_on"], out["ortserve_prefix_off"]
    out["second_on_over_off"] = on["second_ttft_ms"] / off["second_ttft_ms"]
    out["first_on_over_off"] = on["first_ttft_ms"] / off["first_ttft_ms"]
    if "vllm" in out:
        out["second_on_over_vllm"] = on["second_ttft_ms"] / out["vllm"]["second_ttft_ms"]
    return out


def spinning_piece(cfg: Config, repo: Path, pool: list[int], tok) -> dict[str, Any]:
    """The server's own decode loop with onnxruntime's intra-op spinning on vs off, interleaved."""
    servers = {mode: start_ortserve(repo, cfg, spinning=mode) for mode in ("on", "off")}
    clients = {mode: OrtserveStreams(srv.address, "gpt") for mode, srv in servers.items()}
    out: dict[str, Any] = {}
    try:
        for n in (1, 8):
            rows: dict[str, list[float]] = {m: [] for m in clients}
            for rep in range(cfg.repeats):
                for mode, client in clients.items():
                    batch = prompts(pool, n, cfg.prompt_tokens, salt=1500 + 10 * rep + n)
                    wall, recs = run_streams(client, batch, cfg.new_tokens, tok)
                    rows[mode].append(sum(r.tokens for r in recs) / wall)
            med = {m: statistics.median(v) for m, v in rows.items()}
            out[str(n)] = {"runs": rows, "on_tokens_per_s": med["on"], "off_tokens_per_s": med["off"],
                           "off_cost": 1 - med["off"] / med["on"]}
            log.info("spinning %d streams: on %.1f, off %.1f tok/s", n, med["on"], med["off"])
    finally:
        for c in clients.values():
            c.close()
        for srv in servers.values():
            srv.stop()
    return out


def leave_piece(cfg: Config, client: Any, pool: list[int], tok) -> dict[str, Any]:
    """16 streams of different lengths: the others' next gap after each departure vs their median gap."""
    out = {}
    for n in (8, 16):
        batch = prompts(pool, n, cfg.prompt_tokens, salt=900 + n)
        lengths = [cfg.new_tokens // 2 + (cfg.new_tokens * i) // n for i in range(n)]

        def one(i: int) -> StreamRecord:
            return client.stream(batch[i], lengths[i], tok)

        with ThreadPoolExecutor(n) as ex:
            recs = list(ex.map(one, range(n)))
        ends = sorted(r.stamps[-1] for r in recs)[:-1]
        gaps = [g for r in recs for g in r.gaps()]
        med = statistics.median(gaps)
        after = []
        for end in ends:
            nxt = [b - a for r in recs for a, b in zip(r.stamps, r.stamps[1:]) if a <= end < b]
            if nxt:
                after.append(max(nxt))
        out[str(n)] = {"median_gap_ms": 1000 * med, "worst_gap_after_a_leave_ms": 1000 * max(after),
                       "worst_over_median": max(after) / med, "leaves": len(after)}
    return out


def step_piece(cfg: Config, repo: Path, rounds: int = 4) -> dict[str, Any]:
    """In-process decode steps on the in-place graph, batch 8, past 16 vs 1000; read bandwidth in the same run.
    The fp32 cache's figures at the top level; the int8 cache's (kv8 variant) under "kv8" when the package has it.
    The variants take turns, round by round, on one shared onnxruntime pool (as the server's spinning "on"), so
    neither sees the other's idle pool spinning and both share the machine's drift."""
    import onnxruntime as ort

    pkg = repo / "gpt" / "1"
    manifest = json.loads((pkg / "model.json").read_text())
    ort.set_global_thread_pool_sizes(cfg.threads, 1)
    steppers = {v: Stepper(pkg / manifest["variants"][v], manifest) for v in ("fp32", "kv8")
                if v in manifest["variants"]}
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(rounds):
        for v, stepper in steppers.items():
            for past in (16, 1000):
                times.setdefault((v, past), []).append(stepper.step_ms(past))
    bw = read_bandwidth(cfg.threads)
    c = manifest["cache"]
    out: dict[str, Any] = {"batch": Stepper.BATCH, "rounds": rounds, "read_bandwidth_gb_s": bw / 1e9}
    for v in steppers:
        short, long = (statistics.median(times[v, p]) for p in (16, 1000))
        extra = Stepper.BATCH * c["num_layers"] * 2 * c["num_kv_heads"] * (1000 - 16) * c["head_dim"] * \
            steppers[v].itemsize
        floor = 1000 * extra / bw
        figures = {"past16_ms": short, "past1000_ms": long, "growth_ms": long - short, "extra_cache_bytes": extra,
                   "read_floor_ms": floor, "growth_over_floor": (long - short) / floor}
        if v == "fp32":
            out.update(figures)
        else:
            out[v] = figures
    return out


class Stepper:
    """One decode step of a graph at batch 8 (or `batch`) over its own cache buffers (random contents), bound once."""

    BATCH = 8

    def __init__(self, graph: Path, manifest: dict[str, Any], batch: int = BATCH) -> None:
        import onnxruntime as ort

        c = manifest["cache"]
        opts = ort.SessionOptions()
        opts.use_per_session_threads = False
        self.sess = ort.InferenceSession(str(graph), opts, providers=["CPUExecutionProvider"])
        types = {i.name: i.type for i in self.sess.get_inputs()}
        dtype, self.positions = np.dtype(CACHE_ELEMENT_TYPES[types[past_names(1)[0]]]), "position_ids" in types
        self.itemsize = dtype.itemsize
        self.batch = batch
        shape = (batch, c["num_kv_heads"], manifest["max_length"], c["head_dim"])
        rng = np.random.default_rng(0)
        self.io = self.sess.io_binding()
        self.bufs = []
        for p, q in zip(past_names(c["num_layers"]), present_names(c["num_layers"])):
            buf = rng.integers(-100, 100, shape, dtype=dtype) if dtype.kind == "i" else \
                rng.standard_normal(shape).astype(dtype)
            self.bufs.append(buf)
            v = ort.OrtValue.ortvalue_from_numpy(buf)
            self.io.bind_ortvalue_input(p, v)
            self.io.bind_ortvalue_output(q, v)

    def step_ms(self, past: int, n: int = 15) -> float:
        b, io = self.batch, self.io
        io.bind_cpu_input("input_ids", np.ones((b, 1), np.int64))
        io.bind_cpu_input("attention_mask", np.ones((b, past + 1), np.int64))
        if self.positions:     # learned positions (GPT-2); rotary graphs derive them from the mask
            io.bind_cpu_input("position_ids", np.full((b, 1), past, np.int64))
        io.bind_output("logits")
        for _ in range(3):
            self.sess.run_with_iobinding(io)
        ts = []
        for _ in range(n):
            t = time.perf_counter()
            self.sess.run_with_iobinding(io)
            ts.append(time.perf_counter() - t)
        return 1000 * statistics.median(ts)


def read_bandwidth(threads: int, mb: int = 1024) -> float:
    """Bytes/s summing a large float32 array split over `threads` threads (numpy drops the GIL in reductions)."""
    a = np.random.default_rng(1).standard_normal(mb * 2 ** 20 // 4, dtype=np.float32)
    parts = np.array_split(a, threads)
    best = 0.0
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(5):
            t = time.perf_counter()
            list(pool.map(np.sum, parts))
            best = max(best, a.nbytes / (time.perf_counter() - t))
    return best


def genai_piece(cfg: Config, repo: Path, client: Any, pool: list[int], tok) -> dict[str, Any]:
    py = GENAI_VENV / "bin" / "python"
    if not (GENAI_VENV / ".complete").is_file():
        raise RuntimeError("onnxruntime-genai peer not installed: run bash bench/setup_genai.sh")
    # The variant the server runs: the one asked for, else the package's default for the CPU (what it serves).
    manifest = json.loads((repo / "gpt" / "1" / "model.json").read_text())
    genai_variant = cfg.variant or (manifest.get("default_variant") or {}).get("cpu") or "fp32"
    out: dict[str, Any] = {"variant": genai_variant}
    for b in (1, 8):
        rows: dict[str, list[float]] = {"ortserve_grpc": [], "genai_in_process": []}
        for rep in range(cfg.repeats):
            batch = prompts(pool, b, cfg.prompt_tokens, salt=1200 + 10 * rep + b)
            wall, recs = run_streams(client, batch, cfg.new_tokens, tok)
            rows["ortserve_grpc"].append(sum(r.tokens for r in recs) / wall)
            res = subprocess.run([str(py), str(HERE / "genai_run.py"), str(repo / "gpt" / "1"), json.dumps(batch),
                                  str(cfg.new_tokens), str(cfg.threads), genai_variant], capture_output=True, text=True)
            if res.returncode != 0:
                raise RuntimeError(f"genai_run.py failed: {(res.stderr.strip().splitlines() or ['no output'])[-1]}")
            rows["genai_in_process"].append(json.loads(res.stdout.strip().splitlines()[-1])["tokens_per_s"])
        med = {k: statistics.median(v) for k, v in rows.items()}
        out[str(b)] = {"runs": rows, **{k: v for k, v in med.items()},
                       "ratio": med["ortserve_grpc"] / med["genai_in_process"]}
        log.info("genai batch %d: ortserve %.1f tok/s, genai %.1f tok/s", b, med["ortserve_grpc"], med["genai_in_process"])
    return out


# ----------------------------------------------------------------------------- main


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pieces", default=None, help=f"comma list of {','.join(Config.pieces)}")
    ap.add_argument("--no-vllm", action="store_true", help="skip the vLLM peer")
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2", help="which 124M-shaped decoder")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "generation.json")
    ap.add_argument("--docs", type=Path, default=None,
                    help="write the section into this report (e.g. docs/BENCHMARKS.md); also `--render-only`")
    ap.add_argument("--render-only", action="store_true", help="only (re)write --docs from --out")
    ap.add_argument("--merge", action="store_true", help="keep the pieces already in --out (re-measure only --pieces)")
    ap.add_argument("--spinning", choices=("on", "auto", "off"), default=None,
                    help=f"the server's --intra-op-spinning (default {Config.spinning})")
    ap.add_argument("--repeats", type=int, default=None, help=f"runs per cell and side (default {Config.repeats})")
    ap.add_argument("--chunk-sizes", default=None, help="arrival piece: comma list of --prefill-chunk-tokens to try "
                                                        f"(default {','.join(map(str, Config.chunk_sizes))})")
    ap.add_argument("--variant", default=None,
                    help="package variant ortserve serves and genai runs (e.g. w8, w4); exported if the package lacks it")
    ap.add_argument("--stream-interval", type=int, default=None,
                    help="the server's --stream-interval: tokens per streamed message after the first (default 1)")
    ap.add_argument("--threads", type=int, default=None,
                    help=f"threads of every side (default: this process's cores, {len(os.sched_getaffinity(0))})")


def cli(a: argparse.Namespace) -> int | None:
    if a.render_only:
        report = json.loads(a.out.read_text())
        write_docs({**report, "runs": current_runs(report.get("runs", []))}, a.docs or ROOT / "docs" / "BENCHMARKS.md")
        return 0
    cfg = dataclasses.replace(Config.quick() if a.quick else Config(), model=a.model)
    if a.repeats:
        cfg = dataclasses.replace(cfg, repeats=a.repeats)
    if a.spinning:
        cfg = dataclasses.replace(cfg, spinning=a.spinning)
    if a.chunk_sizes:
        cfg = dataclasses.replace(cfg, chunk_sizes=tuple(int(x) for x in a.chunk_sizes.split(",")))
    if a.variant:
        extra = () if a.variant in ("fp32", "kv8") else (a.variant,)
        cfg = dataclasses.replace(cfg, variant=a.variant, extra_variants=extra)
    if a.stream_interval is not None:
        if a.stream_interval < 1:
            ap.error(f"--stream-interval: must be >= 1, got {a.stream_interval}")
        cfg = dataclasses.replace(cfg, stream_interval=a.stream_interval)
    if a.threads:
        if not 1 <= a.threads <= len(os.sched_getaffinity(0)):
            ap.error(f"--threads: must be 1..{len(os.sched_getaffinity(0))} (this process's cores), got {a.threads}")
        cfg = dataclasses.replace(cfg, threads=a.threads)
    pieces = tuple(a.pieces.split(",")) if a.pieces else cfg.pieces
    from tokenizers import Tokenizer

    ckpt, repo, pool = material(cfg)
    tok = Tokenizer.from_file(str(repo / "gpt" / "1" / "tokenizer.json"))
    report: dict[str, Any] = json.loads(a.out.read_text()) if a.merge and a.out.is_file() else {}
    # Each run records how its sides ran (threads, binding, preloads): with --merge, pieces of several runs share
    # the report, and each piece's figures are described by the run that measured them.
    sides: dict[str, Any] = {"ortserve": ortserve_side(cfg, cfg.variant)}
    runs = current_runs([*report.get("runs", []), {
        "command": a.invocation, "pieces": list(pieces),
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "sides": sides}])
    report.update({"machine": describe(ROOT), "config": {k: str(v) for k, v in cfg.__dict__.items()}, "runs": runs,
                   "command": runs[0]["command"], "started": runs[0]["started"]})

    def save() -> None:     # after every piece: a later failure keeps what was measured
        write_json(a.out, report)
    if "step" in pieces:
        report["step"] = step_piece(cfg, repo)
        log.info("step: %s", report["step"])
        save()
    vllm_proc: VllmServer | None = None
    vllm = None

    def start_peer() -> tuple[VllmServer, VllmStreams]:
        server = start_vllm(ckpt, cfg)
        sides["vllm"] = server.describe()
        return server, VllmStreams(server.port, "gpt")
    if not a.no_vllm and {"streams", "arrival", "prefix"} & set(pieces):
        vllm_proc, vllm = start_peer()
    try:
        if {"streams", "leave", "genai"} & set(pieces):
            server = start_ortserve(repo, cfg)
            ours = OrtserveStreams(server.address, "gpt")
            try:
                if "streams" in pieces:
                    clients = {"ortserve": ours, **({"vllm": vllm} if vllm else {})}
                    report["streams"] = streams_piece(cfg, clients, pool, tok)
                    save()
                if "leave" in pieces:
                    report["leave"] = leave_piece(cfg, ours, pool, tok)
                    save()
                if "genai" in pieces:
                    if vllm_proc is not None:      # the idle peer must not share the CPU with this piece
                        vllm_proc.stop()
                        vllm_proc, vllm = None, None
                    report["genai"] = genai_piece(cfg, repo, ours, pool, tok)
                    sides["genai"] = {"threads": cfg.threads, "binding": "not pinned (onnxruntime's default)",
                                      "intra_op_spinning": "on (onnxruntime's default)",
                                      "variant": report["genai"]["variant"]}
                    save()
            finally:
                ours.close()
                server.stop()
        if "spinning" in pieces:
            if vllm_proc is not None:
                vllm_proc.stop()
                vllm_proc, vllm = None, None
            report["spinning"] = spinning_piece(cfg, repo, pool, tok)
            save()
        for piece, run in (("arrival", arrival_piece), ("prefix", prefix_piece)):
            if piece not in pieces:
                continue
            if vllm is None and not a.no_vllm:
                vllm_proc, vllm = start_peer()
            report[piece] = run(cfg, repo, vllm, pool, tok)
            save()
    finally:
        if vllm_proc is not None:
            vllm_proc.stop()
    save()
    if a.docs is not None:
        write_docs(report, a.docs)
    print(json.dumps({k: v for k, v in report.items() if k not in ("machine", "config")}, indent=1)[:6000])
    return 0



BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "vllm", "genai"), pieces=Config.pieces, options=options, run=cli)
