"""The in-place engine with its cache on the session's device vs in host memory: step times, an onnxruntime
profile, and streams through the engine (docs/GPU.md holds what a run on a lent GPU showed).

    python -m bench gpu_slots --provider CUDAExecutionProvider --out result.json

A GPT-2-124M-shaped decoder with random weights (12 layers, 768 wide, 12 heads, vocab 8000; random weights are
fine for speed and for comparing two cache placements bit for bit) is written with export/decoder_graph.py,
in fp16 for CUDA (its attention kernel takes fp16 only) or fp32 for the CPU provider. Both cache placements
run the same sessions: "device" = server/generation/device_cache.py's buffers on the session's device, "host"
= the same code told to keep them in host memory (what the engine did before), which makes onnxruntime copy
every bound cache slice to the device and back on each call.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import logging
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer, models, pre_tokenizers

from modelpkg import FORMAT, Manifest
from export.decoder_graph import MIXED_FILE, DecoderWeights, LayerWeights, build_decoder_graph
from server.generation.device_cache import Device
from server.generation.engine import GenerationEngine
from server.generation.params import GenerationConfig, GenerationParams
from server.generation.slot_runner import DecodeRow, PrefillRow, SlotRunner
from server.generation.spec import DecoderSpec
from bench.harness import Benchmark
from bench.results import write_json

log = logging.getLogger("bench.gpu_slots")
CUDA = "CUDAExecutionProvider"


def random_gpt2(layers: int = 12, hidden: int = 768, heads: int = 12, vocab: int = 8000, max_length: int = 1024,
                seed: int = 0) -> DecoderWeights:
    rng = np.random.default_rng(seed)

    def w(*shape: int, scale: float = 0.02) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    ones, zeros = (lambda n: np.ones(n, np.float32)), (lambda n: np.zeros(n, np.float32))
    blocks = [LayerWeights(norm1_w=ones(hidden), norm1_b=zeros(hidden), qkv_w=w(hidden, 3 * hidden),
                           qkv_b=zeros(3 * hidden), out_w=w(hidden, hidden), out_b=zeros(hidden), norm2_w=ones(hidden),
                           norm2_b=zeros(hidden), up_w=w(hidden, 4 * hidden), up_b=zeros(4 * hidden),
                           down_w=w(4 * hidden, hidden), down_b=zeros(hidden)) for _ in range(layers)]
    return DecoderWeights(family="gpt2", num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads, hidden=hidden,
                          vocab_size=vocab, max_length=max_length, norm_eps=1e-5, embed=w(vocab, hidden), lm_head=None,
                          final_norm_w=ones(hidden), final_norm_b=zeros(hidden), layers=blocks,
                          positions=w(max_length, hidden))


def write_package(weights: DecoderWeights, out: Path, fp16: bool) -> Manifest:
    """model.onnx + its mixed twin (fp16 when asked, logits fp32) and the manifest fields the engine reads."""
    from export.variants import build_inplace_fp16

    for mixed, name in ((False, "model.onnx"), (True, MIXED_FILE)):
        path = out / name
        onnx.save(build_decoder_graph(weights, mixed=mixed), str(path))
        if fp16:
            keep = ["logits", "chunk.logits"] if mixed else ["logits"]
            build_inplace_fp16(path, path, keep_fp32=keep)
    io = [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]}]
    return Manifest.from_dict({
        "format": FORMAT, "name": "model", "task": "generate", "max_length": weights.max_length,
        "vocab_size": weights.vocab_size, "special_tokens": {"eos": None, "bos": None, "pad": 0}, "inputs": io,
        "outputs": [{"name": "logits", "dtype": "float32", "shape": ["batch", "sequence", "vocab"]}],
        "variants": {"fp16" if fp16 else "fp32": "model.onnx"},
        "cache": {"num_layers": weights.num_layers, "num_heads": weights.num_heads, "head_dim": weights.head_dim,
                  "num_kv_heads": weights.num_kv_heads, "layout": "inplace"}})


def word_tokenizer(vocab: int) -> Tokenizer:
    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(vocab)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return tok


def sessions(out: Path, provider: str, profile: bool = False) -> tuple[ort.InferenceSession, ort.InferenceSession]:
    opts = ort.SessionOptions()
    opts.enable_profiling = profile
    providers = [provider, "CPUExecutionProvider"] if provider != "CPUExecutionProvider" else [provider]
    return (ort.InferenceSession(str(out / "model.onnx"), opts, providers=providers),
            ort.InferenceSession(str(out / MIXED_FILE), opts, providers=providers))


def step_times(plain, mixed, spec, slots: int, batch: int, context: int, device: Device | None, steps: int = 30
               ) -> tuple[float, np.ndarray]:
    """Median ms of a decode step of `batch` rows at `context` cached tokens; and the last step's logits."""
    runner = SlotRunner(plain, spec, slots, mixed, device=device)
    runner.prefill([PrefillRow(s, [1 + s] * context, 0) for s in range(batch)], first_prompt=True)
    times, logits = [], None
    for i in range(steps):
        rows = [DecodeRow(s, 5 + s, context + i) for s in range(batch)]
        t0 = time.perf_counter()
        logits = runner.decode(rows, {})
        times.append(time.perf_counter() - t0)
    return float(np.median(times[5:]) * 1e3), logits


def profile_decode(out: Path, provider: str, spec, slots: int, device: Device | None) -> dict:
    """onnxruntime profile of 10 decode steps at batch 8: every event whose name says Memcpy, per step. On CUDA,
    also what the driver itself copied (CUPTI through torch's profiler, when torch is there): onnxruntime's
    profile has no event for the copies of IOBinding-bound host memory, which is where a host cache's traffic is."""
    plain, mixed = sessions(out, provider, profile=True)
    copies = cupti_copies(lambda: step_times(plain, mixed, spec, slots, 8, 64, device, steps=10), provider)
    files = [plain.end_profiling(), mixed.end_profiling()]
    events = []
    for f in files:
        events += json.loads(Path(f).read_text())
        Path(f).unlink()
    runs = sum(1 for e in events if e.get("name") == "model_run")
    memcpy = Counter(e["name"] for e in events if "memcpy" in e.get("name", "").lower())
    providers = Counter(e.get("args", {}).get("provider") for e in events if e.get("cat") == "Node")
    return {"model_runs": runs, "memcpy_events": dict(memcpy), "node_events_by_provider": dict(providers),
            "driver_copies": copies}


def cupti_copies(fn, provider: str) -> dict | str:
    """{copy kind: [count, bytes]} of every CUDA memcpy while fn runs (prefill + 10 steps)."""
    if provider != CUDA:
        return "n/a on the CPU provider"
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except ImportError as exc:
        return f"not measured: {exc}"
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
    trace = Path(tempfile.mkdtemp()) / "trace.json"
    prof.export_chrome_trace(str(trace))
    found: dict[str, list[int]] = {}
    for e in json.loads(trace.read_text()).get("traceEvents", []):
        if e.get("cat") == "gpu_memcpy":
            entry = found.setdefault(e.get("name", "?"), [0, 0])
            entry[0] += 1
            entry[1] += int(e.get("args", {}).get("bytes", 0))
    return found


async def streams(engine: GenerationEngine, n: int, prompt_len: int, new_tokens: int) -> dict:
    params = GenerationParams.validate(max_new_tokens=new_tokens, ignore_eos=True)
    rng = np.random.default_rng(n)
    prompts = [[int(t) for t in rng.integers(1, engine.spec.vocab_size, prompt_len)] for _ in range(n)]
    t0 = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    wall = time.perf_counter() - t0
    tokens = sum(len(r.tokens) for r in results)
    return {"streams": n, "tokens": tokens, "seconds": round(wall, 3), "tokens_per_s": round(tokens / wall, 1)}


async def engine_streams(plain, mixed, manifest: Manifest, tok: Tokenizer, device: Device | None, levels: list[int],
                         new_tokens: int) -> list[dict]:
    config = GenerationConfig(max_batch_size=max(levels), max_waiting=256)
    runner = None
    if device is not None:   # the same engine, its cache kept in host memory
        spec = DecoderSpec.from_package(manifest, plain)
        runner = SlotRunner(plain, spec, config.max_batch_size, mixed, device=device)
    engine = GenerationEngine(plain, manifest, tok, config, mixed_session=mixed, runner=runner)
    engine.warmup()
    await engine.start()
    try:
        await streams(engine, 2, 32, 8)   # warm
        return [await streams(engine, n, 32, new_tokens) for n in levels]
    finally:
        await engine.stop()


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--provider", default=CUDA if CUDA in ort.get_available_providers() else "CPUExecutionProvider")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--levels", default="1,8,32")
    p.add_argument("--new-tokens", type=int, default=128)
    p.add_argument("--out", type=Path, required=True)


def cli(args: argparse.Namespace) -> int | None:
    fp16 = args.provider == CUDA
    levels = [int(x) for x in args.levels.split(",")]
    weights = random_gpt2(layers=args.layers)
    result: dict = {"provider": args.provider, "onnxruntime": ort.__version__, "dtype": "fp16" if fp16 else "fp32",
                    "shape": f"gpt2 {args.layers} layers, 768 wide, 12 heads, vocab 8000, 1024 positions"}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        manifest = write_package(weights, out, fp16)
        plain, mixed = sessions(out, args.provider)
        spec = DecoderSpec.from_package(manifest, plain)
        result["cache_dtype"] = np.dtype(spec.past_dtype).name
        host = Device("cpu")
        # Same sessions, the two placements. Not bit-identical on CUDA: with the cache in host memory onnxruntime
        # binds a device copy of the input and a separate output buffer, so the attention op cannot share
        # past/present and takes its other (copying) path; the largest logit difference is recorded.
        steps = {}
        for batch, context in ((1, 64), (8, 64), (32, 64), (8, 900), (32, 900)):
            dev_ms, dev_logits = step_times(plain, mixed, spec, 32, batch, context, None)
            host_ms, host_logits = step_times(plain, mixed, spec, 32, batch, context, host)
            steps[f"b{batch}-ctx{context}"] = {"device_ms": round(dev_ms, 3), "host_ms": round(host_ms, 3),
                                               "max_abs_logit_diff": float(np.abs(dev_logits - host_logits).max())}
            log.info("step b%d ctx%d: device %.2f ms, host %.2f ms", batch, context, dev_ms, host_ms)
        result["decode_step_32_slots"] = steps
        result["profile_device"] = profile_decode(out, args.provider, spec, 32, None)
        result["profile_host"] = profile_decode(out, args.provider, spec, 32, host)
        tok = word_tokenizer(weights.vocab_size)
        result["streams_device"] = asyncio.run(engine_streams(plain, mixed, manifest, tok, None, levels, args.new_tokens))
        result["streams_host"] = asyncio.run(engine_streams(plain, mixed, manifest, tok, host, levels, args.new_tokens))
    write_json(args.out, result)
    print(json.dumps(result, indent=2))


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve",), pieces=(), options=options, run=cli)
