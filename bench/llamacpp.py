"""llama.cpp as a peer at the same bits on both sides, on the Llama-shaped 124M checkpoint of bench/generation.py
(`--material llama-124m`: 12 layers, 768 wide, 12 heads / 4 kv heads, SwiGLU 2048, tied head, vocab 8000) or a
Qwen3-0.6B-shaped one (`--material qwen3-0.6b`: random weights, Qwen's vocabulary, a 4,096-token package:
bench/llamacpp_material.py).

    python -m bench llamacpp [--material qwen3-0.6b] [--pieces convert,raw,served,ttft,rss] [--variants fp32,w8,w4]
                             [--quick] [--docs docs/BENCHMARKS.md]

Pairs (ours -> llama.cpp's): fp32 -> f32, w8 -> Q8_0, w4 -> Q4_0 (w8/w4: the weight-quantized variants of the export
stage; asked for with --variants, they are exported into the package when it lacks them).
Pieces:
  convert  the checkpoint -> GGUF f32 (llama.cpp's own converter in bench/.venv-gguf, the pre-tokenizer named:
           bench/gguf_convert.py), then llama-quantize to Q8_0 / Q4_0; llama.cpp's tokenization of sample strings
           (llama-server /tokenize) must equal ours, and its greedy continuation of a prompt is compared with ortserve's.
  raw      batch-1 decode: `llama-bench -t <cores> -p 0 -n 128` per GGUF against one decode step of our graph of the
           matching variant in-process (batch 1, past 64: the middle of 128 new tokens); rounds interleaved.
  ttft     time to first token of lone requests (32-token prompts, one at a time, 0.2 s apart), each server up ALONE
           (the other stopped: no idle neighbour), sides taking turns round by round; the same clients as served.
  served   `llama-server -t <cores> --parallel 32` (OpenAI /v1/completions, streamed) vs ortserve (GenerateStream
           over gRPC, `--variant` of the pair): 1 / 8 / 32 streams, 32-token prompts, 128 new tokens, greedy,
           ignore_eos; the sides take turns run by run (bench/generation.py's load generator). With qwen3-0.6b
           ortserve serves with --max-model-len 512, the context llama-server gives each of its slots.
  rss      the served package's resident memory with 16 slots at its cap against the model's own positions (no cap):
           the cache bytes computed first, a server started only where they fit in half the free memory
           (bench/llamacpp_rss.py).
The tools come from bench/setup_llamacpp.sh (built from the llama-cpp-python 0.3.36 sdist's vendored llama.cpp).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .llamacpp_material import MATERIALS, Material, llama_material, qwen3_material
from .llamacpp_report import QUANTS, render
from .llamacpp_server import LLAMACPP_VENV, LlamaCppError, LlamaServer, start_llama_server, tool
from .openmp import OWN, unset_command
from .llamacpp_rss import rss_piece
from .machine import describe
from .results import DOCS, publish, read_json, write_json
from bench.harness import Benchmark

log = logging.getLogger(__name__)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
GGUF_VENV = Path(os.environ.get("GGUF_VENV", HERE / ".venv-gguf"))
# Our variant -> llama.cpp's file type at the same bits (both: per-block scales, 32 weights a block).
# Strings the tokenization check runs: spaces and newlines, digits, contractions, punctuation runs, non-ASCII.
CHECK_TEXTS = (
    "To be, or not to be, that is the question:",
    "  Whether 'tis nobler\tin the mind to suffer\n\nThe slings and arrows",
    "I've been told he's there; you'll see, we'd know. 1234567 3.14 x=y+2",
    "Café naïve — “quoted” ¿qué? 我想 😀 ‼️......!!!???",
    "\n \n\n   \t leading and trailing spaces   ",
    "ACT III. SCENE I. A room in the castle. Enter KING, QUEEN, POLONIUS, OPHELIA",
)
PIECES = ("convert", "raw", "served", "ttft", "rss")


@dataclass
class Config:
    levels: tuple[int, ...] = (1, 8, 32)
    prompt_tokens: int = 32
    new_tokens: int = 128
    repeats: int = 2                   # served runs per cell and side
    raw_rounds: int = 3                # interleaved llama-bench / in-process rounds
    parallel: int = 32                 # llama-server --parallel (ortserve gets as many sequence slots)
    threads: int = field(default_factory=lambda: len(os.sched_getaffinity(0)))
    variants: tuple[str, ...] = ("fp32",)
    stream_interval: int = 1           # ortserve's --stream-interval (llama-server sends a message per token)
    ttft_rounds: int = 3               # ttft piece: rounds, each server up alone in turn
    ttft_requests: int = 12            # ttft piece: lone requests per round and side
    work: Path = ROOT / "bench" / "results" / "generation-work"
    material: str = "llama-124m"       # bench/llamacpp_material.py MATERIALS
    serve_len: int = 512               # qwen3-0.6b: ortserve's --max-model-len (llama-server's context per slot)

    @classmethod
    def quick(cls) -> "Config":
        return cls(levels=(1, 8), new_tokens=32, repeats=1, raw_rounds=1, parallel=8)


# ----------------------------------------------------------------------------- tools and files


def _run(cmd: list[str], what: str, timeout: float = 1800) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(unset_command(cmd), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        last = [ln for ln in (done.stderr + done.stdout).splitlines() if ln.strip()]
        raise LlamaCppError(f"{what} failed (exit {done.returncode}): {last[-1] if last else 'no output'}")
    return done


def convert(ckpt: Path, dest: Path, pre_tokenizer: str) -> Path:
    """The checkpoint as GGUF f32, written through a temporary name (no partial file under `dest`)."""
    if dest.is_file():
        return dest
    if not (GGUF_VENV / ".complete").is_file():
        raise LlamaCppError(f"GGUF converter environment missing ({GGUF_VENV}): run bash bench/setup_llamacpp.sh")
    tmp = dest.with_name(dest.name + ".tmp")
    dest.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    _run([str(GGUF_VENV / "bin" / "python"), str(HERE / "gguf_convert.py"), str(LLAMACPP_VENV / "src" / "llama.cpp"),
          str(ckpt), str(tmp), pre_tokenizer], f"convert_hf_to_gguf.py on {ckpt}")
    os.replace(tmp, dest)
    log.info("converted %s -> %s in %.0f s", ckpt, dest, time.perf_counter() - started)
    return dest


def quantize(f32: Path, quant: str, threads: int) -> Path:
    """llama-quantize of the f32 file to `quant` (e.g. q4_0) beside it."""
    dest = f32.with_name(f32.name.replace("-f32.gguf", f"-{quant}.gguf"))
    if dest.is_file():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    _run([str(tool("llama-quantize")), str(f32), str(tmp), quant.upper(), str(threads)], f"llama-quantize {quant}")
    os.replace(tmp, dest)
    return dest


def gguf_files(mat: Material, cfg: Config) -> dict[str, Path]:
    """variant -> the GGUF at the same bits."""
    f32 = convert(mat.ckpt, cfg.work / "gguf" / f"{mat.ckpt.name}-f32.gguf", mat.pre_tokenizer)
    return {v: f32 if QUANTS[v] == "f32" else quantize(f32, QUANTS[v], cfg.threads) for v in cfg.variants}


def tokenization_mismatches(ours: Callable[[str], list[int]], theirs: Callable[[str], list[int]],
                            texts: Iterable[str]) -> list[dict[str, Any]]:
    """The texts two tokenizers split differently, each with both id lists."""
    out = []
    for text in texts:
        a, b = ours(text), theirs(text)
        if a != b:
            out.append({"text": text, "ours": a, "theirs": b})
    return out


def ortserve_greedy(address: str, ids: list[int], n: int, model: str) -> list[int]:
    import grpc

    from protos import ortserve_pb2 as pb
    from protos import ortserve_pb2_grpc as rpc

    with grpc.insecure_channel(address) as channel:
        res = rpc.TaskServiceStub(channel).Generate(pb.GenerateRequest(
            model=model, prompt_ids=ids, parameters=pb.GenerationParameters(max_new_tokens=n, ignore_eos=True)),
            timeout=120)
    return [t.token_id for t in res.tokens]


# ----------------------------------------------------------------------------- pieces


def parse_llama_bench(stdout: str) -> float:
    """Tokens/s of the text-generation test in `llama-bench -o json` output."""
    rows = json.loads(stdout[stdout.index("["):])
    tg = [r for r in rows if int(r.get("n_gen", 0)) > 0 and int(r.get("n_prompt", 0)) == 0]
    if not tg:
        raise LlamaCppError("llama-bench: no text-generation result in its output")
    return float(tg[0]["avg_ts"])


def convert_piece(cfg: Config, mat: Material, ggufs: dict[str, Path]) -> dict[str, Any]:
    """The tokenizer check and a greedy comparison on the f32 file (the converter's output before quantizing)."""
    from .generation import Config as GenConfig
    from .generation import start_ortserve

    tok = mat.tok
    f32 = ggufs.get("fp32") or convert(mat.ckpt, cfg.work / "gguf" / f"{mat.ckpt.name}-f32.gguf", mat.pre_tokenizer)
    server = LlamaServer(f32, cfg.threads, 1)
    try:
        bad = tokenization_mismatches(lambda t: tok.encode(t).ids, server.tokenize, CHECK_TEXTS)
        prompt = mat.pool[:cfg.prompt_tokens]
        theirs = server.greedy(prompt, 32)
    finally:
        server.stop()
    if bad:
        raise LlamaCppError(f"llama.cpp tokenizes {len(bad)} of {len(CHECK_TEXTS)} check strings differently, e.g. "
                            f"{bad[0]['text']!r}: ours {bad[0]['ours'][:12]} vs {bad[0]['theirs'][:12]}")
    ours_srv = start_ortserve(mat.repo, dataclasses.replace(GenConfig(), threads=cfg.threads, variant="fp32"),
                              slots=1, extra_args=mat.serve_args)
    try:
        ours = ortserve_greedy(ours_srv.address, prompt, 32, mat.model)
    finally:
        ours_srv.stop()
    from export.parity_inplace import leading_equal

    agree = leading_equal(ours, theirs)
    log.info("tokenizer check: %d strings equal; greedy: %d of 32 leading tokens equal", len(CHECK_TEXTS), agree)
    return {"files": {v: {"path": str(p), "bytes": p.stat().st_size} for v, p in ggufs.items()},
            "pre_tokenizer": mat.pre_tokenizer, "tokenizer_check": {"texts": list(CHECK_TEXTS), "mismatches": 0},
            "greedy_32": {"ortserve_fp32": ours, "llamacpp_f32": theirs, "leading_equal": agree}}


def raw_piece(cfg: Config, mat: Material, ggufs: dict[str, Path]) -> dict[str, Any]:
    """llama-bench tg128 vs our batch-1 decode step, rounds interleaved, both on every core."""
    import onnxruntime as ort

    from .generation import Stepper

    pkg = mat.package
    manifest = json.loads((pkg / "model.json").read_text())
    ort.set_global_thread_pool_sizes(cfg.threads, 1)     # one spinning pool, as the server's "--intra-op-spinning on"
    steppers = {v: Stepper(pkg / manifest["variants"][v], manifest, batch=1) for v in ggufs}
    runs: dict[str, dict[str, list[float]]] = {v: {"llamacpp": [], "ortserve": []} for v in ggufs}
    for _ in range(cfg.raw_rounds):
        for v, gguf in ggufs.items():
            done = _run([str(tool("llama-bench")), "-m", str(gguf), "-t", str(cfg.threads), "-p", "0",
                         "-n", str(cfg.new_tokens), "-r", "1", "-o", "json"], f"llama-bench {gguf.name}")
            runs[v]["llamacpp"].append(parse_llama_bench(done.stdout))
            if QUANTS[v] != "f32":   # what llama-server loses when it has to run --no-repack (start_llama_server)
                done = _run([str(tool("llama-bench")), "-m", str(gguf), "-t", str(cfg.threads), "-p", "0",
                             "-n", str(cfg.new_tokens), "-r", "1", "--repack", "0", "-o", "json"],
                            f"llama-bench --repack 0 {gguf.name}")
                runs[v].setdefault("llamacpp_no_repack", []).append(parse_llama_bench(done.stdout))
            time.sleep(0.5)
            runs[v]["ortserve"].append(1000.0 / steppers[v].step_ms(cfg.new_tokens // 2, n=cfg.new_tokens // 2))
            log.info("raw %s: llama.cpp %.1f tok/s, ortserve graph %.1f tok/s", v, runs[v]["llamacpp"][-1],
                     runs[v]["ortserve"][-1])
    out: dict[str, Any] = {"threads": cfg.threads, "new_tokens": cfg.new_tokens, "rounds": cfg.raw_rounds}
    for v, r in runs.items():
        a, b = statistics.median(r["ortserve"]), statistics.median(r["llamacpp"])
        out[v] = {"quant": QUANTS[v], "runs": r, "ortserve_tokens_per_s": a, "llamacpp_tokens_per_s": b,
                  "ratio": a / b}
        if r.get("llamacpp_no_repack"):
            out[v]["llamacpp_no_repack_tokens_per_s"] = statistics.median(r["llamacpp_no_repack"])
    return out


def served_piece(cfg: Config, mat: Material, ggufs: dict[str, Path], sides: dict[str, Any]) -> dict[str, Any]:
    """Per variant: ortserve serving it and llama-server on the matching GGUF, both up, taking turns run by run."""
    from .generation import Config as GenConfig
    from .generation import ENGINE_DEFAULTS, OpenAIStreams, OrtserveStreams, prompts, run_streams, start_ortserve

    out: dict[str, Any] = {}
    for v, gguf in ggufs.items():
        gcfg = dataclasses.replace(GenConfig(), threads=cfg.threads, variant=v, stream_interval=cfg.stream_interval)
        ours_srv = start_ortserve(mat.repo, gcfg, slots=cfg.parallel, extra_args=mat.serve_args)
        try:
            peer = start_llama_server(gguf, cfg.threads, cfg.parallel)
        except BaseException:
            ours_srv.stop()
            raise
        sides[f"llamacpp_{v}"] = peer.describe()
        sides[f"ortserve_{v}"] = {"threads": cfg.threads, "binding": "not pinned (onnxruntime's default)",
                                  "intra_op_spinning": gcfg.spinning, "max_sequences": cfg.parallel, "variant": v,
                                  "stream_interval": cfg.stream_interval, "decode_steps": ENGINE_DEFAULTS.decode_steps,
                                  "decode_run_ms": ENGINE_DEFAULTS.decode_run_ms, "args": list(mat.serve_args),
                                  **({"ungated": mat.ungated[v]} if v in mat.ungated else {})}
        clients = {"ortserve": OrtserveStreams(ours_srv.address, mat.model),
                   "llamacpp": OpenAIStreams(peer.port, mat.model)}
        pool, tok = mat.pool, mat.tok
        try:
            cells: dict[str, Any] = {}
            for n in cfg.levels:
                rows: dict[str, list[dict[str, float]]] = {k: [] for k in clients}
                for rep in range(cfg.repeats):
                    for name, client in clients.items():
                        time.sleep(1.0)     # the other side's threads go idle
                        batch = prompts(pool, n, cfg.prompt_tokens, salt=4000 + 1000 * n + 10 * rep + len(rows[name]))
                        wall, recs = run_streams(client, batch, cfg.new_tokens, tok)
                        tokens = sum(r.tokens for r in recs)
                        rows[name].append({"tokens_per_s": tokens / wall, "tokens": tokens,
                                           "ttft_p50_ms": 1000 * statistics.median(r.ttft for r in recs)})
                        log.info("served %s %d streams %s: %.1f tok/s", v, n, name, rows[name][-1]["tokens_per_s"])
                cell = {k: {"runs": r, "tokens_per_s": statistics.median(x["tokens_per_s"] for x in r),
                            "ttft_p50_ms": statistics.median(x["ttft_p50_ms"] for x in r)} for k, r in rows.items()}
                cell["ratio_tokens_per_s"] = cell["ortserve"]["tokens_per_s"] / cell["llamacpp"]["tokens_per_s"]
                cells[str(n)] = cell
            out[v] = {"quant": QUANTS[v], "streams": cells}
        finally:
            clients["ortserve"].close()
            clients["llamacpp"].close()
            peer.stop()
            ours_srv.stop()
    return out


def ttft_piece(cfg: Config, mat: Material, ggufs: dict[str, Path]) -> dict[str, Any]:
    """Per variant: p50 time to first token of lone requests, each server started alone in its turn."""
    from .generation import Config as GenConfig
    from .generation import OpenAIStreams, OrtserveStreams, prompts, start_ortserve

    out: dict[str, Any] = {}
    for v, gguf in ggufs.items():
        gcfg = dataclasses.replace(GenConfig(), threads=cfg.threads, variant=v, stream_interval=cfg.stream_interval)
        rows: dict[str, list[float]] = {"ortserve": [], "llamacpp": []}
        for rnd in range(cfg.ttft_rounds):
            for name in (("ortserve", "llamacpp") if rnd % 2 == 0 else ("llamacpp", "ortserve")):
                if name == "ortserve":
                    srv: Any = start_ortserve(mat.repo, gcfg, slots=cfg.parallel, extra_args=mat.serve_args)
                    client: Any = OrtserveStreams(srv.address, mat.model)
                else:
                    srv = start_llama_server(gguf, cfg.threads, cfg.parallel)
                    client = OpenAIStreams(srv.port, mat.model)
                try:
                    batch = prompts(mat.pool, cfg.ttft_requests + 2, cfg.prompt_tokens, salt=9000 + 100 * rnd)
                    got = []
                    for ids in batch:
                        got.append(client.stream(ids, 8, mat.tok).ttft * 1000)
                        time.sleep(0.2)
                    rows[name] += got[2:]     # the first two warm the server up
                    log.info("ttft %s round %d %s: p50 %.1f ms", v, rnd + 1, name, statistics.median(got[2:]))
                finally:
                    client.close()
                    srv.stop()
                time.sleep(1.0)
        out[v] = {"quant": QUANTS[v], "requests": len(rows["ortserve"]),
                  **{f"{k}_ttft_p50_ms": statistics.median(x) for k, x in rows.items()},
                  **{f"{k}_ttft_ms": x for k, x in rows.items()}}
    return out


# ----------------------------------------------------------------------------- main


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--pieces", default=",".join(PIECES), help=f"comma list of {','.join(PIECES)}")
    ap.add_argument("--variants", default="fp32",
                    help=f"comma list of our variants to pair ({', '.join(f'{k}->{v}' for k, v in QUANTS.items())})")
    ap.add_argument("--material", default="llama-124m", choices=MATERIALS,
                    help="the checkpoint both sides run (bench/llamacpp_material.py; default llama-124m)")
    ap.add_argument("--quick", action="store_true", help="short runs (development; noisy)")
    ap.add_argument("--repeats", type=int, default=None, help="served runs per cell and side")
    ap.add_argument("--levels", default=None, help="comma list of concurrent streams (default 1,8,32)")
    ap.add_argument("--new-tokens", type=int, default=None)
    ap.add_argument("--stream-interval", type=int, default=1,
                    help="ortserve's --stream-interval: tokens per streamed message after the first (default 1, "
                         "a message per token as llama-server sends)")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/llamacpp.json (llama-124m), llamacpp-MATERIAL.json (others)")
    ap.add_argument("--docs", type=Path, default=None, help="write the section into this report")
    ap.add_argument("--render-only", action="store_true", help="only (re)write --docs from --out")


def cli(a: argparse.Namespace) -> int | None:
    # Each material has its own result file and block of docs/BENCHMARKS.md (the Llama one keeps its old name).
    block = "llamacpp" if a.material == "llama-124m" else f"llamacpp-{a.material}"
    pieces = tuple(p.strip() for p in a.pieces.split(",") if p.strip())
    if pieces == ("rss",):      # memory alone: its own block, beside the speed tables it does not redo
        block += "-rss"
    out = a.out or ROOT / "bench" / "results" / f"{block}.json"
    if a.render_only:
        publish(read_json(out), None, a.docs or DOCS, block, render)
        return 0
    variants = tuple(v.strip() for v in a.variants.split(",") if v.strip())
    for name, given, allowed in (("--pieces", pieces, PIECES), ("--variants", variants, tuple(QUANTS))):
        bad = [x for x in given if x not in allowed]
        if bad or not given:
            print(f"error: {name}: {'unknown ' + repr(bad[0]) if bad else 'empty'} (choose from {', '.join(allowed)})",
                  file=sys.stderr)
            return 2
    cfg = dataclasses.replace(Config.quick() if a.quick else Config(), variants=variants)
    if a.repeats:
        cfg = dataclasses.replace(cfg, repeats=a.repeats)
    if a.levels:
        cfg = dataclasses.replace(cfg, levels=tuple(int(x) for x in a.levels.split(",")))
    if a.new_tokens:
        cfg = dataclasses.replace(cfg, new_tokens=a.new_tokens)
    if a.stream_interval < 1:
        print(f"error: --stream-interval: must be >= 1, got {a.stream_interval}", file=sys.stderr)
        return 2
    cfg = dataclasses.replace(cfg, stream_interval=a.stream_interval, material=a.material)
    try:
        if set(pieces) - {"rss"}:
            tool("llama-server")
        report = measure(cfg, pieces, a.invocation, out)
    except LlamaCppError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print("\n".join(publish(report, None, a.docs, block, render)))
    return 0


def load_material(cfg: Config) -> Material:
    if cfg.material == "qwen3-0.6b":
        mat = qwen3_material(cfg.work, cfg.threads, cfg.variants, cfg.serve_len)
    else:
        mat = llama_material(cfg.work, cfg.threads, cfg.variants)
    have = mat.manifest()["variants"]
    missing = [v for v in cfg.variants if v not in have]
    if missing:
        raise LlamaCppError(f"--variants: the package has no {', '.join(missing)} (the gate refused it, or the "
                            "export stage does not build it); it has " + ", ".join(have))
    return mat


def measure(cfg: Config, pieces: tuple[str, ...], invocation: str, out: Path) -> dict[str, Any]:
    """The pieces, the result written after each (a later failure keeps what was measured)."""
    mat = load_material(cfg)
    ggufs = gguf_files(mat, cfg) if set(pieces) - {"rss"} else {}
    report: dict[str, Any] = {
        "command": invocation, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": describe(ROOT), "material": {"name": mat.name, "describe": mat.describe, "ungated": mat.ungated,
                                             "pre_tokenizer": mat.pre_tokenizer},
        "variants": list(cfg.variants), "prompt_tokens": cfg.prompt_tokens, "new_tokens": cfg.new_tokens, "sides": {}}
    for piece in pieces:     # in the order given: the one that matters most first on a short budget
        if piece == "convert":
            report["convert"] = convert_piece(cfg, mat, ggufs)
        elif piece == "raw":
            report["raw"] = raw_piece(cfg, mat, ggufs)
            report["sides"]["llamacpp_bench"] = {"threads": cfg.threads,
                                                 "binding": "not pinned (its defaults: cpu_mask 0x0, poll 50)",
                                                 "unset": list(OWN),
                                                 "args": ["llama-bench", "-t", str(cfg.threads), "-p", "0", "-n",
                                                          str(cfg.new_tokens), "-r", "1"]}
            report["sides"]["ortserve_graph"] = {"threads": cfg.threads, "intra_op_spinning": "on (one global pool)",
                                                 "binding": "not pinned (onnxruntime's default)"}
        elif piece == "served":
            report["served"] = served_piece(cfg, mat, ggufs, report["sides"])
        elif piece == "ttft":
            report["ttft"] = ttft_piece(cfg, mat, ggufs)
        else:
            report["rss"] = rss_piece(mat, cfg.threads, cfg.variants[-1])
        write_json(out, report)
    return report


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "llamacpp"), pieces=PIECES, options=options, run=cli)
