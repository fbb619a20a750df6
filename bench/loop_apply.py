"""The event loop's CPU per iteration applying a step's outcome (server/generation/loop.py `EngineLoop._apply`), in
process, on a served package: what the per-iteration array state (slot_state.py) changes.

    python -m bench loop_apply --root <checkout> --package <model_repository>/g2p/1 [--clients 32]

Run it once per checkout (--root picks whose server/ and modelpkg/ it measures: imported from there); interleave
the runs yourself. `--clients` requests run at once, each re-sent when answered, for `--seconds`;
streamed requests (the server's streaming doors take this path) unless `--whole`. Prints one JSON line: the loop
thread's CPU (time.thread_time) inside `_apply` per iteration and per token, and the iterations and tokens seen.
An encoder-decoder package takes its sources from --texts (words), a decoder its prompts; greedy, ignore_eos,
--max-new-tokens each.
"""
from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

import onnxruntime as ort
from tokenizers import Tokenizer

from .harness import Benchmark

log = logging.getLogger("bench.loop_apply")

WORDS = ("serving", "loop", "array", "phoneme", "grapheme", "continuous", "batching", "iteration", "token",
         "detokenize", "schedule", "admission", "deadline", "penalty", "sequence", "budget")


def _session(path: Path, threads: int) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def build(package: Path, clients: int, threads: int) -> Any:
    """The package's generation engine, from the checkout's server/."""
    from modelpkg import Manifest
    from server.generation import GenerationConfig, GenerationEngine
    manifest = Manifest.from_dict(json.loads((package / "model.json").read_text()))
    tokenizer = Tokenizer.from_file(str(package / "tokenizer.json"))
    config = GenerationConfig(max_batch_size=clients)
    block = manifest.encoder_decoder
    if block is None:
        return GenerationEngine(_session(package / manifest.variants["fp32"], threads), manifest, tokenizer, config)
    graphs = block.graphs["fp32"]
    return GenerationEngine(_session(package / graphs["decoder"], threads), manifest, tokenizer, config,
                            encoder_session=_session(package / graphs["encoder"], threads))


class Meter:
    """`EngineLoop._apply` wrapped: the loop thread's CPU inside it, summed."""

    def __init__(self) -> None:
        from server.generation.loop import EngineLoop
        self.cpu, self.calls = 0.0, 0
        original = EngineLoop._apply

        def timed(loop: Any, outcome: Any) -> None:
            start = time.thread_time()
            original(loop, outcome)
            self.cpu += time.thread_time() - start
            self.calls += 1

        EngineLoop._apply = timed  # type: ignore[method-assign]


async def drive(engine: Any, texts: list[str], args: argparse.Namespace) -> int:
    from server.generation import GenerationParams
    params = GenerationParams.validate(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    end = time.monotonic() + args.seconds
    tokens = 0

    async def client(c: int) -> None:
        nonlocal tokens
        i = c
        while time.monotonic() < end:
            text = texts[i % len(texts)]
            i += args.clients
            if args.whole:
                result = await engine.generate(text, params)     # (not `tokens += await ...`: read before)
                tokens += result.usage.completion_tokens
            else:
                async for chunk in engine.stream(text, params):
                    tokens += len(chunk.tokens)

    await asyncio.gather(*(client(c) for c in range(args.clients)))
    return tokens


async def main_async(args: argparse.Namespace) -> dict:
    engine = build(args.package, args.clients, args.threads)
    texts = [" ".join(WORDS[i:i + 3]) if engine.source is None else WORDS[i] for i in range(len(WORDS))]
    await engine.start()
    try:
        args_warm = argparse.Namespace(**{**vars(args), "seconds": 1.0})
        await drive(engine, texts, args_warm)
        meter = Meter()
        tokens = await drive(engine, texts, args)
    finally:
        await engine.stop()
    return {"package": str(args.package), "clients": args.clients, "whole": args.whole, "iterations": meter.calls,
            "tokens": tokens, "apply_us_per_iteration": round(1e6 * meter.cpu / max(meter.calls, 1), 1),
            "apply_us_per_token": round(1e6 * meter.cpu / max(tokens, 1), 2)}


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--root", type=Path, required=True, help="the checkout whose engine is measured")
    parser.add_argument("--package", type=Path, required=True, help="a package version folder (model.json)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1, help="onnxruntime intra-op threads")
    parser.add_argument("--whole", action="store_true", help="unary requests (generate) instead of streams")


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(args.root.resolve()))
    importlib.invalidate_caches()
    result = asyncio.run(main_async(args))
    from server.generation import loop
    result["root"] = str(Path(loop.__file__).resolve().parents[2])
    log.info("%s", json.dumps(result))


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve",), options=options, run=run)
