"""Weight-quantized in-place decoders (MatMulNBits): accuracy against fp32 and the in-process step time.

    python -m bench quantized --lm gpt2=artifacts/checkpoints/lm --lm llama=artifacts/checkpoints/lm-llama \
        --out bench/results/quantized.json --docs docs/BENCHMARKS.md
    python -m bench quantized --lm gpt2=artifacts/checkpoints/lm --grid   # the choice of block / accuracy / head
    python -m bench quantized --render-only --out bench/results/quantized.json --docs docs/BENCHMARKS.md

Per checkpoint and candidate (bits, block size, accuracy level, algorithm, LM head quantized or not):
  accuracy   the gate's own figures (export/parity_inplace.py, the same code the exporter judges with):
             teacher-forced perplexity ratio and mean KL against PyTorch fp32 on the gate's held-out sentences,
             greedy agreement (identical leading ids of 32-token greedy continuations, 24 prompts); plus the
             perplexity of the corpus' held-out test plays (64-token blocks, one prefill each) for fp32 and it
  speed      one decode step (one new token per row at past 128) at batch 1 and 8, in-process, IOBinding with
             the cache bound in place, spinning threads (--spinning), candidates interleaved round by
             round so load drifts hit them alike; median over rounds
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from bench.harness import Benchmark
from bench.results import DOCS, publish, read_json

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("bench.quantized")


@dataclass(frozen=True)
class Candidate:
    name: str
    bits: int                 # 32 = the fp32 graph
    kv8: bool = False
    block_size: int = 32
    accuracy_level: int = 4
    algorithm: str = "rtn"
    lm_head_bits: int | None = 8
    symmetric: bool = True

    def as_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def default_candidates() -> list[Candidate]:
    """The variants as the exporter makes them (export/config.py WEIGHT_QUANT), and fp32 / kv8."""
    from export.config import WEIGHT_QUANT
    from export.weights import WEIGHT_VARIANTS

    out = [Candidate("fp32", 32), Candidate("kv8", 32, kv8=True)]
    for name, (bits, kv8) in WEIGHT_VARIANTS.items():
        q = WEIGHT_QUANT[bits]
        out.append(Candidate(name, bits, kv8, q.block_size, q.accuracy_level, q.algorithm, q.lm_head_bits))
    return out


def grid_candidates() -> list[Candidate]:
    """The choices measured before fixing WEIGHT_QUANT: block size, accuracy level, LM head, RTN vs HQQ."""
    out = [Candidate("fp32", 32)]
    for bits in (8, 4):
        for block in (32, 64, 128):
            for level in ((0, 4) if block == 32 else (4,)):   # fp32 compute (0) measured 8-17x slower
                for head in sorted({bits, 8, None}, key=lambda h: -(h or 32)):   # head fp32 / 8 bits / as the layers
                    out.append(Candidate(f"w{bits} b{block} acc{level} head{head or 32}", bits, block_size=block,
                                         accuracy_level=level, lm_head_bits=head))
    for block in (32, 64):
        for head in (4, None):
            out.append(Candidate(f"w4 hqq b{block} acc4 head{head or 32}", 4, block_size=block, algorithm="hqq",
                                 lm_head_bits=head))
    out.append(Candidate("w4 asym b32 acc4 head8", 4, symmetric=False, lm_head_bits=8))
    return out


# ----------------------------------------------------------------------------- graphs


def build_graph(cand: Candidate, weights, kv_scales):
    from export import decoder_graph
    from export.config import WeightQuantConfig
    from export.weights import quantize_graph

    graph = decoder_graph.build_decoder_graph(weights, kv_scales=kv_scales if cand.kv8 else None)
    if cand.bits == 32:
        return graph
    cfg = WeightQuantConfig(block_size=cand.block_size, accuracy_level=cand.accuracy_level, symmetric=cand.symmetric,
                            algorithm=cand.algorithm, lm_head_bits=cand.lm_head_bits)
    return quantize_graph(graph, cand.bits, cfg)[0]


# ----------------------------------------------------------------------------- accuracy


def heldout_blocks(tokenizer, eos: int | None, blocks: int, length: int = 64) -> list[list[int]]:
    """The corpus' test plays (the LM trainer's held-out split) as `blocks` windows of length + 1 ids."""
    from training.data import pretraining_texts

    stream: list[int] = []
    for doc in pretraining_texts()["test"]:
        stream += tokenizer.encode(doc).ids + ([eos] if eos is not None else [])
        if len(stream) > blocks * length + 1:
            break
    return [stream[i:i + length + 1] for i in range(0, blocks * length, length)]


def block_perplexity(sess, weights, blocks: list[list[int]]) -> float:
    """exp(mean NLL) of each block's next tokens, one prefill per block through the graph."""
    from export.parity_inplace import SlotDriver

    nll, n = 0.0, 0
    for ids in blocks:
        d = SlotDriver(sess, weights.num_layers, weights.num_kv_heads, weights.head_dim, weights.max_length, 1)
        logits = d.first_prompt(0, [ids[:-1]], 0)[0].astype(np.float64)
        logits -= logits.max(axis=1, keepdims=True)
        logp = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        nll -= float(logp[np.arange(len(ids) - 1), ids[1:]].sum())
        n += len(ids) - 1
    return float(np.exp(nll / n))


def measure(label: str, checkpoint: Path, candidates: list[Candidate], threads: int, rounds: int, steps: int,
            past: int, blocks: int, spinning: bool, accuracy: bool = True) -> dict[str, Any]:
    import torch
    from tokenizers import Tokenizer

    from export import decoder_graph
    from export.heldout import BUILTIN_TEXTS, kv8_texts
    from export.parity_inplace import InplaceChecks
    from export.source import inspect_checkpoint, load_torch_model
    from export.heldout import greedy_prompts
    from export.speed import Stepper, interleaved, session

    torch.set_num_threads(threads)
    info = inspect_checkpoint(checkpoint, "generate")
    model = load_torch_model(info, "generate")
    weights = decoder_graph.inplace_weights(model, info.model_type, info.max_positions)
    tok = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    eos = tok.token_to_id("<|endoftext|>")
    calibration = tok.encode(kv8_texts()[0]).ids[:info.max_positions]
    kv_scales = decoder_graph.calibrate_kv_scales(model, [calibration])
    stream = np.array(tok.encode(" ".join(BUILTIN_TEXTS)).ids, dtype=np.int64)
    checks = InplaceChecks(model, stream, weights.num_layers, weights.num_kv_heads, weights.head_dim,
                           weights.max_length, eos or 0, 1e-4, 1e-4, 0)
    held = np.array(tok.encode(kv8_texts()[1]).ids, dtype=np.int64)
    prompts = greedy_prompts(tok)
    corpus = heldout_blocks(tok, eos, blocks) if blocks else []
    rows: dict[str, dict[str, Any]] = {}
    sessions = {}
    for cand in candidates:
        t0 = time.perf_counter()
        graph = build_graph(cand, weights, kv_scales)
        sess = session(graph.SerializeToString(), threads, spinning)
        sessions[cand.name] = sess
        if not accuracy:
            rows[cand.name] = {**cand.as_json(), "bytes": graph.ByteSize()}
            continue
        agree, total, kl, ratio, worst = checks.quantized_cache(sess, held)
        same = checks.greedy_prefixes(sess, prompts, 32)
        row = {**cand.as_json(), "bytes": graph.ByteSize(), "perplexity_ratio": ratio, "kl": kl,
               "top1": agree / total, "greedy_same_mean": float(np.mean(same)), "greedy_same": same,
               "greedy_full": sum(s == 32 for s in same)}
        if corpus:
            row["corpus_perplexity"] = block_perplexity(sess, weights, corpus)
        rows[cand.name] = row
        log.info("%s %s: ppl ratio %.4f, KL %.5f, greedy %.1f/32 (%d full), %.1f s", label, cand.name, ratio, kl,
                 row["greedy_same_mean"], row["greedy_full"], time.perf_counter() - t0)
    for batch in (1, 8):
        load = os.getloadavg()
        steppers = {name: Stepper(s, weights.num_layers, weights.num_kv_heads, weights.head_dim, weights.max_length,
                                  batch, past) for name, s in sessions.items()}
        times = interleaved(steppers, rounds, steps)
        for name, samples in times.items():
            rows[name][f"step_ms_b{batch}"] = statistics.median(samples)
            rows[name][f"step_ms_b{batch}_rounds"] = samples
        rows[next(iter(rows))][f"loadavg_b{batch}"] = [load, os.getloadavg()]
        log.info("%s batch %d: %s", label, batch, ", ".join(f"{n} {statistics.median(t):.2f} ms"
                                                             for n, t in times.items()))
    return {"label": label, "checkpoint": str(checkpoint), "family": weights.family,
            "shape": {"layers": weights.num_layers, "hidden": weights.hidden, "heads": weights.num_heads,
                      "kv_heads": weights.num_kv_heads, "vocab": weights.vocab_size, "max_length": weights.max_length},
            "threads": threads, "spinning": spinning, "past": past, "rounds": rounds, "steps": steps,
            "corpus_blocks": len(corpus),
            "rows": list(rows.values())}


# ----------------------------------------------------------------------------- profile


def random_base(family: str, out: Path, tokenizer: Path = ROOT / "artifacts" / "tokenizers" / "bpe") -> Path:
    """A random 124M-shaped checkpoint (12 layers, 768 wide, vocab 8000; Llama: 4 kv heads, tied head), the shape
    the issue compares with llama.cpp: the time split of a step does not depend on the weights' values. It
    carries the BPE tokenizer `python -m training tokenizer --kind bpe` writes (vocab 8000)."""
    import torch

    from training.checkpoint import save_model

    torch.manual_seed(0)
    if family == "llama":
        from training.llama import LlamaConfig, LlamaForCausalLM

        model = LlamaForCausalLM(LlamaConfig.preset("base", vocab_size=8000, tie_word_embeddings=True))
    else:
        from training.gpt import GPT2LMHeadModel, GPTConfig

        model = GPT2LMHeadModel(GPTConfig.preset("base", vocab_size=8000))
    files = {p.name: p for p in tokenizer.iterdir() if p.is_file() and p.name.startswith(("tokenizer", "special"))}
    return save_model(model.eval(), out, tokenizer_files=files)


def profile(label: str, checkpoint: Path, candidates: list[Candidate], threads: int, steps: int, past: int,
            spinning: bool, work: Path) -> dict[str, Any]:
    """onnxruntime's own profile of `steps` batch-1 decode steps per candidate: node time per op type, the LM
    head apart (the MatMul / MatMulNBits / Gemm over the vocabulary)."""
    from collections import defaultdict

    from export import decoder_graph
    from export.source import inspect_checkpoint, load_torch_model
    from export.speed import Stepper, session

    info = inspect_checkpoint(checkpoint, "generate")
    weights = decoder_graph.inplace_weights(load_torch_model(info, "generate"), info.model_type, info.max_positions)
    out = {}
    for cand in candidates:
        graph = build_graph(cand, weights, None)
        prefix = str(work / cand.name.replace(" ", "_"))
        sess = session(graph.SerializeToString(), threads, spinning, profile=prefix)
        stepper = Stepper(sess, weights.num_layers, weights.num_kv_heads, weights.head_dim, weights.max_length, 1,
                          min(past, weights.max_length - 1))
        for _ in range(steps + 5):
            stepper.step()
        events = json.loads(Path(sess.end_profiling()).read_text())
        runs = sorted((float(e["ts"]), float(e["dur"])) for e in events
                      if e.get("cat") == "Session" and e.get("name") == "model_run")[5:]
        per: dict[str, float] = defaultdict(float)
        for e in events:
            if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
                continue
            ts = float(e["ts"])
            if not any(a <= ts <= a + d for a, d in runs):
                continue
            node = e["name"][:-len("_kernel_time")]
            op = e.get("args", {}).get("op_name", "?")
            # the graph's only Gemm is the fp32 LM head; a quantized head is the MatMulNBits named lm_head*
            per[f"{op} (LM head)" if op == "Gemm" or node.startswith("lm_head") else op] += float(e["dur"])
        run_ms = sum(d for _, d in runs) / len(runs) / 1e3
        kernels = sum(per.values()) / len(runs) / 1e3
        out[cand.name] = {"run_ms": run_ms, "kernel_ms": kernels,
                          "ops": {op: us / len(runs) / 1e3 for op, us in sorted(per.items(), key=lambda kv: -kv[1])}}
        log.info("%s %s: step %.3f ms (kernels %.3f): %s", label, cand.name, run_ms, kernels,
                 ", ".join(f"{op} {ms:.3f}" for op, ms in list(out[cand.name]["ops"].items())[:8]))
    return {"label": label, "checkpoint": str(checkpoint), "threads": threads, "past": past, "steps": steps,
            "spinning": spinning, "profiles": out}


# ----------------------------------------------------------------------------- report


def render(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    lines = ["## Weight-quantized decoders (bench/quantized.py)", "",
             f"`{report['command']}`", "",
             f"{m.get('cpu_model', '?')} ({m.get('nproc', '?')} cores), onnxruntime "
             f"{m.get('versions', {}).get('onnxruntime')}, {report['when']}, git {m.get('git_commit') or '?'}; "
             "`uptime` before: "
             f"{report['uptime_before']}; after: {report['uptime_after']}.", "",
             "Accuracy: teacher-forced perplexity ratio and mean KL (nats) against PyTorch fp32 on the gate's "
             "held-out sentences; greedy: identical leading ids of 32-token greedy continuations (mean over 24 "
             "prompts, and how many of the 24 are identical throughout); corpus perplexity: the held-out test "
             "plays in 64-token blocks. Step: one decode step at past "
             f"{report['results'][0]['past'] if report['results'] else '?'}, in-process, IOBinding, "
             f"{report['results'][0]['threads'] if report['results'] else '?'} threads, spinning "
             f"{'on' if report['results'] and report['results'][0].get('spinning') else 'off'}, median of "
             "interleaved rounds. A `-random` checkpoint (random weights, the 124M shape the issue compares with "
             "llama.cpp) has step times only. Timings from a shared machine: compare rows within one table.", ""]
    for res in report["results"]:
        s = res["shape"]
        lines += [f"**{res['label']}** ({res['family']}, {s['layers']} layers, width {s['hidden']}, "
                  f"{s['heads']}/{s['kv_heads']} heads, vocab {s['vocab']}"
                  f"{'' if res['label'].endswith('-random') else '; `' + res['checkpoint'] + '`'})", "",
                  "| variant | bits | block | acc. level | algorithm | LM head | graph MB | ppl ratio | KL | "
                  "greedy same /32 | full /24 | corpus ppl | step b1 ms | step b8 ms | b1 vs fp32 | b8 vs fp32 |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        base = res["rows"][0]
        for r in res["rows"]:
            q = r["bits"] != 32
            lines.append(
                f"| {r['name']} | {r['bits']}{' +kv8' if r['kv8'] else ''} | {r['block_size'] if q else '-'} | "
                f"{r['accuracy_level'] if q else '-'} | "
                f"{(r['algorithm'] + ('' if r.get('symmetric', True) else ' asym')) if q else '-'} | "
                f"{('int' + str(r['lm_head_bits'])) if q and r['lm_head_bits'] else 'fp32'} | {r['bytes'] / 1e6:.1f} | "
                f"{_num(r, 'perplexity_ratio', 4)} | {_num(r, 'kl', 5)} | {_num(r, 'greedy_same_mean', 1)} | "
                f"{r.get('greedy_full', '-')} | {_num(r, 'corpus_perplexity', 2)} | {r['step_ms_b1']:.3f} | "
                f"{r['step_ms_b8']:.3f} | "
                f"{base['step_ms_b1'] / r['step_ms_b1']:.2f}x | {base['step_ms_b8'] / r['step_ms_b8']:.2f}x |")
        lines.append("")
    return lines


def render_profile(report: dict[str, Any]) -> list[str]:
    m = report["machine"]
    lines = ["## Where a quantized decode step goes (bench/quantized.py --profile)", "",
             f"`{report['command']}`", "",
             f"{m.get('cpu_model', '?')} ({m.get('nproc', '?')} cores), onnxruntime "
             f"{m.get('versions', {}).get('onnxruntime')}, {report['when']}, git {m.get('git_commit') or '?'}; "
             f"`uptime` before: {report['uptime_before']}; after: {report['uptime_after']}.", "",
             "onnxruntime's own profile (SessionOptions.enable_profiling) of batch-1 decode steps at past "
             f"{report['results'][0]['past'] if report['results'] else '?'}: node time per op type, ms per step "
             "(the profiler's per-node cost inflates every figure; read the shares). \"outside kernels\": the step's "
             "run time not spent in any node (session overhead, scheduling).", ""]
    for res in report["results"]:
        for name, p in res["profiles"].items():
            lines += [f"**{res['label']}, {name}** ({res['threads']} threads, spinning "
                      f"{'on' if res['spinning'] else 'off'}, {res['steps']} steps): step {p['run_ms']:.3f} ms", "",
                      "| op | ms / step | share of step |", "|---|---|---|"]
            for op, ms in list(p["ops"].items())[:10]:
                lines.append(f"| {op} | {ms:.3f} | {ms / p['run_ms']:.0%} |")
            rest = sum(list(p["ops"].values())[10:])
            lines.append(f"| other ops | {rest:.3f} | {rest / p['run_ms']:.0%} |")
            outside = p["run_ms"] - p["kernel_ms"]
            lines += [f"| outside kernels | {outside:.3f} | {outside / p['run_ms']:.0%} |", ""]
    return lines


def _num(row: dict[str, Any], key: str, digits: int) -> str:
    return f"{row[key]:.{digits}f}" if key in row else "-"


def _uptime() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--lm", action="append", default=[], metavar="LABEL=CHECKPOINT")
    ap.add_argument("--grid", action="store_true", help="measure the choice grid instead of the exported variants")
    ap.add_argument("--only", default="", help="comma list of candidate names (default: all)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--past", type=int, default=128)
    ap.add_argument("--spinning", choices=("on", "off"), default="on",
                    help="onnxruntime intra-op threads spin between steps (the server: --intra-op-spinning)")
    ap.add_argument("--corpus-blocks", type=int, default=64, help="held-out 64-token blocks (0: none)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "quantized.json")
    ap.add_argument("--docs", type=Path, default=None, help="write the section into this report")
    ap.add_argument("--render-only", action="store_true")
    ap.add_argument("--block", default=None,
                    help="name of the docs block (default: quantized; with --grid quantized-grid; with --profile "
                         "quantized-profile)")
    ap.add_argument("--timing-only", action="store_true", help="step times only (no accuracy figures)")
    ap.add_argument("--profile", action="store_true",
                    help="onnxruntime's profile of batch-1 steps per candidate instead (op-type split)")
    ap.add_argument("--random-base", action="append", default=[], choices=("gpt2", "llama"),
                    help="also a random 124M-shaped checkpoint of this family (labelled <family>-124M-random)")


def cli(a: argparse.Namespace) -> int | None:
    logging.getLogger("export").setLevel(logging.WARNING)

    block = a.block or ("quantized-profile" if a.profile else "quantized-grid" if a.grid else "quantized")
    if a.render_only:
        publish(read_json(a.out), None, a.docs or DOCS, block, render_profile if a.profile else render)
        return 0
    if not a.lm and not a.random_base:
        print("error: --lm: give at least one LABEL=CHECKPOINT (or --random-base)", file=sys.stderr)
        return 2
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="bench-quantized-"))
    a.lm += [f"{family}-124M-random={random_base(family, work / family)}" for family in a.random_base]
    from bench.machine import describe

    cands = grid_candidates() if a.grid else default_candidates()
    if a.only:
        keep = {n.strip() for n in a.only.split(",")}
        cands = [c for c in cands if c.name in keep or c.name == "fp32"]
    report = {"command": a.invocation,
              "machine": describe(ROOT), "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "uptime_before": _uptime(), "results": []}
    for spec in a.lm:
        label, _, path = spec.partition("=")
        if a.profile:
            report["results"].append(profile(label, Path(path), cands, a.threads, a.steps, a.past,
                                             a.spinning == "on", work))
            continue
        report["results"].append(measure(label, Path(path), cands, a.threads, a.rounds, a.steps, a.past,
                                         a.corpus_blocks, a.spinning == "on",
                                         # random weights: their accuracy figures would say nothing
                                         not a.timing_only and not label.endswith("-random")))
    report["uptime_after"] = _uptime()
    print("\n".join(publish(report, a.out, a.docs or None, block, render_profile if a.profile else render,
                            indent=1)))
    return 0


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve",), pieces=(), options=options, run=cli)
