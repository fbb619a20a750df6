"""Structured outputs: decode throughput with a json_schema constraint against none, and a schema's compile time.

    python -m bench structured [--quick] [--model gpt2|llama] [--streams 1,8,32] [--rounds 3] [--new-tokens 128]
        [--out bench/results/structured.json]

One server (bench.generation's settings: every core, 32 slots, spinning) on bench.generation's 124M-shaped decoder
(`--model`; `--quick`: a 2-layer random GPT of the same tokenizer, to check that the benchmark runs). Two sides,
interleaved per round and stream count (their order alternates each round):
  - none: unconstrained, greedy, ignore_eos;
  - json_schema: the same prompts, greedy, constrained to LONG_SCHEMA, whose one string must be longer than the
    tokens asked for, so every stream generates exactly --new-tokens tokens, as the unconstrained side does.
tokens/s = all streams' tokens / wall time from the first request to the last token (bench.generation.run_streams).
Compile: SCHEMA_20 (20 properties of mixed types) compiled cold on the model's tokenizer in this process (each
repetition a distinct schema, so nothing comes from the cache), the tokenizer's conversion for llguidance apart, and
a cached lookup; and what the constraint adds to a step of 8 greedy rows' choice (masks, choice, advance: the
sampler's added work, measured in this process).
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from pathlib import Path
from typing import Any

from bench.harness import Benchmark

from .generation import Config, StreamRecord, export_decoder, material, prompts, run_streams, start_ortserve
from .machine import describe
from .material import random_gpt
from .results import write_json

log = logging.getLogger("bench.structured")
ROOT = Path(__file__).resolve().parent.parent
QUICK_SHAPE = {"n_layer": 2, "n_embd": 64, "n_head": 2}
SIDES = ("none", "json_schema")
# No token of a byte-level BPE is this many characters long: a string of new_tokens x this cannot close in time.
LONGEST_TOKEN_CHARS = 64


def long_schema(new_tokens: int) -> dict[str, Any]:
    return {"type": "object", "properties": {"text": {"type": "string", "minLength": LONGEST_TOKEN_CHARS * new_tokens}},
            "required": ["text"], "additionalProperties": False}


def schema_20(salt: int = 0) -> dict[str, Any]:
    """20 properties: strings (bounded, enums, patterns), integers and numbers with ranges, booleans, arrays, a nested
    object."""
    kinds = [{"type": "string", "maxLength": 32}, {"enum": ["red", "green", "blue"]}, {"type": "integer", "minimum": 0,
             "maximum": 1000}, {"type": "number"}, {"type": "boolean"}, {"type": "array", "items": {"type": "string"},
             "maxItems": 5}, {"type": "string", "pattern": "^[A-Z]{2}[0-9]{4}$"},
             {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}]
    props = {f"field_{i:02d}": kinds[i % len(kinds)] for i in range(20)}
    return {"title": f"record-{salt}", "type": "object", "properties": props, "required": list(props)[:12],
            "additionalProperties": False}


class ConstrainedStreams:
    """gRPC GenerateStream, greedy, with or without a json_schema constraint (bench.generation.OrtserveStreams')."""

    def __init__(self, address: str, model: str, schema: dict[str, Any] | None) -> None:
        import grpc

        from protos import ortserve_pb2 as pb
        from protos import ortserve_pb2_grpc as rpc

        self.pb, self.model = pb, model
        self.constraint = None if schema is None else pb.OutputConstraint(json_schema=json.dumps(schema))
        self.channel = grpc.insecure_channel(address)
        self.stub = rpc.TaskServiceStub(self.channel)

    def stream(self, ids: list[int], new_tokens: int, tok: Any) -> StreamRecord:
        pb = self.pb
        params = pb.GenerationParameters(max_new_tokens=new_tokens, temperature=0.0,
                                         ignore_eos=self.constraint is None)
        req = pb.GenerateRequest(model=self.model, prompt=tok.decode(ids), parameters=params,
                                 constraint=self.constraint)
        rec = StreamRecord(time.perf_counter())
        for chunk in self.stub.GenerateStream(req, timeout=600):
            now = time.perf_counter()
            rec.stamps.extend([now] * len(chunk.tokens))
            rec.tokens += len(chunk.tokens)
        return rec

    def close(self) -> None:
        self.channel.close()


def quick_material(cfg: Config) -> tuple[Path, list[int]]:
    """(repository, prompt token pool) of the --quick model: a 2-layer random GPT, fp32 only."""
    from tokenizers import Tokenizer

    from .material import bpe_tokenizer_dir, passages

    ckpt = random_gpt(cfg.work, "gpt2-structured-quick", overrides_from=QUICK_SHAPE).path
    repo = cfg.work / "repository-structured-quick"
    if not (repo / "gpt" / "1" / "parity.json").is_file():
        export_decoder(ckpt, repo, "gpt", "inplace", ("fp32",), cfg.threads)
    tok = Tokenizer.from_file(str(bpe_tokenizer_dir(cfg.work) / "tokenizer.json"))
    return repo, [i for text in passages(100, 40, seed=1) for i in tok.encode(text).ids]


def compile_times(package: Path, repeats: int) -> dict[str, float]:
    """Seconds: the tokenizer's conversion for llguidance, a cold SCHEMA_20 compilation (median), a cached one."""
    from tokenizers import Tokenizer

    from server.structured import constraint_of
    from server.structured.matcher import Grammars

    manifest = json.loads((package / "model.json").read_text())
    tok = Tokenizer.from_file(str(package / "tokenizer.json"))
    grammars = Grammars(tok, int(manifest.get("vocab_size") or tok.get_vocab_size()),
                        tok.token_to_id("<|endoftext|>"))
    t0 = time.perf_counter()
    grammars.row(constraint_of("regex", "a", "warm"))
    tokenizer_s = time.perf_counter() - t0
    cold = []
    for i in range(repeats):
        constraint = constraint_of("json_schema", schema_20(i), "bench")
        t0 = time.perf_counter()
        grammars.compile(constraint)
        cold.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    grammars.row(constraint)
    cached_s = time.perf_counter() - t0
    return {"tokenizer_s": tokenizer_s, "schema_20_cold_s": statistics.median(cold), "schema_20_cached_s": cached_s,
            "mask_step_ms": mask_ms(grammars, tok)}


def mask_ms(grammars: Any, tok: Any, rows: int = 8, steps: int = 120) -> float:
    """Milliseconds per step that LONG_SCHEMA adds to choosing the next tokens of `rows` greedy rows
    (sampling.choose_rows: the masks, the choice, the matchers' advance), over the same rows unconstrained. The
    logits are random but for the end of text, the likeliest (refused: the string cannot close yet), and then the
    next token of an English passage, as a model writing text inside the string would rank them."""
    import numpy as np

    from server.generation import GenerationParams
    from server.generation.sampling import Sampler, choose_rows
    from server.structured import constraint_of

    from .material import passages

    constraint = constraint_of("json_schema", long_schema(steps), "bench")
    text = [t for t in tok.encode(" ".join(passages(20, 40, seed=2))).ids if t != grammars.eos_id][:steps]
    # A few steps' logits, taken in turn: in cache, as a step's fresh logits are.
    logits = np.random.default_rng(0).normal(size=(16, rows, grammars.vocab_size)).astype(np.float32)
    logits[:, :, grammars.eos_id] = 10.0
    took: dict[bool, list[float]] = {}
    for side in (None, constraint, None, constraint):
        samplers = [Sampler(GenerationParams.validate(temperature=0.0, constraint=side), grammars.vocab_size, [1],
                            grammars.eos_id, constraint=None if side is None else grammars.row(side))
                    for _ in range(rows)]
        t0 = time.perf_counter()
        for i, token in enumerate(text):
            block = logits[i % len(logits)]
            kept = block[:, token].copy()
            block[:, token] = 9.0
            choose_rows(samplers, block)
            block[:, token] = kept
        took.setdefault(side is None, []).append(time.perf_counter() - t0)
    return 1e3 * (min(took[False]) - min(took[True])) / len(text)


def measure(repo: Path, cfg: Config, pool: list[int], streams: list[int], rounds: int, new_tokens: int
            ) -> dict[str, dict[str, list[float]]]:
    """cells[str(streams)][side] = tokens/s of each round."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(repo / "gpt" / "1" / "tokenizer.json"))
    cells: dict[str, dict[str, list[float]]] = {str(n): {s: [] for s in SIDES} for n in streams}
    with start_ortserve(repo, cfg) as server:
        clients = {"none": ConstrainedStreams(server.address, "gpt", None),
                   "json_schema": ConstrainedStreams(server.address, "gpt", long_schema(new_tokens))}
        try:
            for side in SIDES:      # warm both paths (and compile the schema) before measuring
                run_streams(clients[side], prompts(pool, 2, cfg.prompt_tokens, 0), 8, tok)
            for r in range(rounds):
                for n in streams:
                    for side in (SIDES if r % 2 == 0 else SIDES[::-1]):
                        wall, recs = run_streams(clients[side], prompts(pool, n, cfg.prompt_tokens, 100 * r + n),
                                                 new_tokens, tok)
                        tokens = sum(x.tokens for x in recs)
                        if side == "json_schema" and tokens != n * new_tokens:
                            raise RuntimeError(f"constrained streams ended early: {tokens} of {n * new_tokens} tokens")
                        cells[str(n)][side].append(tokens / wall)
                        log.info("round %d, %d streams, %s: %.1f tok/s", r + 1, n, side, tokens / wall)
        finally:
            for client in clients.values():
                client.close()
    return cells


def render(result: dict[str, Any]) -> list[str]:
    lines = ["| streams | none tok/s | json_schema tok/s | ratio |", "|---|---|---|---|"]
    for n, sides in result["cells"].items():
        none, constrained = (statistics.median(sides[s]) for s in SIDES)
        lines.append(f"| {n} | {none:.1f} | {constrained:.1f} | {constrained / none:.2f} |")
    c = result["compile"]
    lines.append(f"\nCompile, 20-property schema: cold {1e3 * c['schema_20_cold_s']:.1f} ms, cached "
                 f"{1e3 * c['schema_20_cached_s']:.2f} ms; tokenizer for llguidance {1e3 * c['tokenizer_s']:.1f} ms; "
                 f"grammar masks {c['mask_step_ms']:.3f} ms per step of 8 greedy rows (choose_rows, over unconstrained)")
    return lines


def options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--quick", action="store_true", help="a 2-layer model, 1 and 8 streams, 1 round, 16 tokens")
    ap.add_argument("--model", choices=("gpt2", "llama"), default="gpt2", help="bench.generation's 124M decoder")
    ap.add_argument("--repository", type=Path, default=None,
                    help="serve this repository's `gpt` instead (e.g. the main job's model_repository: the default decoder)")
    ap.add_argument("--streams", default=None, help="comma list (default 1,8,32)")
    ap.add_argument("--rounds", type=int, default=None, help="default 3")
    ap.add_argument("--new-tokens", type=int, default=None, help="default 128")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "structured.json")


def cli(a: argparse.Namespace) -> int | None:
    cfg = Config(model=a.model)
    streams = [int(x) for x in (a.streams or ("1,8" if a.quick else "1,8,32")).split(",")]
    rounds = a.rounds or (1 if a.quick else 3)
    new_tokens = a.new_tokens or (16 if a.quick else 128)
    repo, pool = quick_material(cfg) if a.quick else material(cfg)[1:]
    if a.repository is not None:    # its `gpt`, with bench.generation's prompts
        repo = a.repository
    result = {"command": getattr(a, "invocation", "python -m bench structured"), "machine": describe(ROOT),
              "config": {"model": str(a.repository or ("quick" if a.quick else a.model)), "streams": streams, "rounds": rounds,
                         "new_tokens": new_tokens, "threads": cfg.threads},
              "compile": compile_times(repo / "gpt" / "1", 3 if a.quick else 10),
              "cells": measure(repo, cfg, pool, streams, rounds, new_tokens)}
    write_json(a.out, result)
    print("\n".join(render(result)))
    return 0


BENCHMARK = Benchmark(summary=__doc__, sides=SIDES, options=options, run=cli)
