"""ortserve's generation engine used as a library, in-process (no door, no client): the counterpart of
bench/genai_run.py, with the same arguments and answer.

    python -m bench.engine_run PACKAGE_DIR PROMPTS_JSON NEW_TOKENS THREADS [VARIANT]  ->  one JSON line {"tokens_per_s": ...}

The sessions are made as the server makes them with `--intra-op-spinning on` (one shared spinning pool of THREADS
intra-op threads; the variant's graph and its mixed twin), the engine has the server's default configuration, and
the prompts go in as token ids. Like genai_run.py: one warm-up generation of the same length (the first pass through
a process's positions runs ~10% slower, in the engine and in a bare loop of onnxruntime calls alike), then one timed
from the prompt going in to the last token (ignore_eos, NEW_TOKENS tokens per prompt, greedy).
"""
from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from modelpkg import TOKENIZER_FILE
from server.generation import GenerationConfig, GenerationEngine, GenerationParams
from server.repository.package import read_package
from server.sessions import SessionConfig, create_session
from server.text.tokenizer import load_tokenizer


async def timed(engine: GenerationEngine, prompts: list[list[int]], new_tokens: int) -> float:
    params = GenerationParams.validate(max_new_tokens=new_tokens, ignore_eos=True)
    started = time.perf_counter()
    results = await asyncio.gather(*(engine.generate(p, params) for p in prompts))
    wall = time.perf_counter() - started
    return sum(r.usage.completion_tokens for r in results) / wall


async def main() -> None:
    pkg_dir, prompts = Path(sys.argv[1]), json.loads(sys.argv[2])
    new_tokens, threads = int(sys.argv[3]), int(sys.argv[4])
    variant = sys.argv[5] if len(sys.argv) > 5 else "fp32"
    package = read_package(pkg_dir, pkg_dir.parent.name, int(pkg_dir.name))
    if variant not in package.manifest.variants:
        sys.exit(f"error: variant: the package has no {variant!r} (it has {', '.join(package.manifest.variants)})")
    config = SessionConfig(providers=("CPUExecutionProvider",), intra_op_threads=threads, inter_op_threads=1,
                           variant=variant, spinning="on")
    session = create_session(package, variant, config)
    mixed_file = package.manifest.cache.mixed_graph(variant) if package.manifest.cache is not None else None
    mixed = create_session(package, variant, config, file=mixed_file) if mixed_file else None
    engine = GenerationEngine(session, package.manifest, load_tokenizer(package.file(TOKENIZER_FILE)),
                              GenerationConfig(), None, package.manifest.name, mixed_session=mixed)
    await engine.start()
    try:
        await timed(engine, prompts, new_tokens)   # warm-up, as long as the timed run (genai_run.py's too)
        tokens_per_s = await timed(engine, prompts, new_tokens)
    finally:
        await engine.stop()
    print(json.dumps({"tokens_per_s": tokens_per_s, "variant": variant, "prompts": len(prompts)}))


if __name__ == "__main__":
    asyncio.run(main())
