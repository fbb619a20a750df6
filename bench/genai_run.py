"""Runs in bench/.venv-genai: onnxruntime-genai generating from our in-place model.onnx, in-process.

    python genai_run.py PACKAGE_DIR PROMPTS_JSON NEW_TOKENS THREADS [VARIANT]  ->  one JSON line {"tokens_per_s": ...}

The package's files are linked into a temporary folder beside a genai_config.json written from model.json that
names the VARIANT's graph (default fp32; e.g. w4, a weight-quantized graph, runs as it is: genai loads whatever
operators onnxruntime has) (model type "decoder": genai's default I/O names are the package's; the cache buffer is
shared between past and present, as the in-place graph is made for). All files are linked so that a graph's
external data, named relative to it, is found.
"""
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime_genai as og


def config(manifest: dict, max_length: int, threads: int, filename: str = "model.onnx") -> dict:
    c = manifest["cache"]
    special = manifest["special_tokens"]
    eos = special.get("eos") if special.get("eos") is not None else 0
    return {
        "model": {
            "bos_token_id": special.get("bos") if special.get("bos") is not None else eos,
            "eos_token_id": eos, "pad_token_id": eos, "context_length": manifest["max_length"],
            "vocab_size": manifest["vocab_size"], "type": "decoder",
            "decoder": {"filename": filename, "head_size": c["head_dim"],
                        "hidden_size": c["head_dim"] * c["num_heads"], "num_attention_heads": c["num_heads"],
                        "num_key_value_heads": c.get("num_kv_heads", c["num_heads"]),
                        "num_hidden_layers": c["num_layers"],
                        "session_options": {"intra_op_num_threads": threads, "inter_op_num_threads": 1,
                                            "provider_options": []}},
        },
        # min_length = max_length: never stop on eos (the peers ignore eos too).
        "search": {"max_length": max_length, "min_length": max_length, "do_sample": False, "num_beams": 1,
                   "past_present_share_buffer": True, "num_return_sequences": 1},
    }


def main() -> None:
    pkg, prompts, new_tokens, threads = Path(sys.argv[1]).resolve(), json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    variant = sys.argv[5] if len(sys.argv) > 5 else "fp32"
    manifest = json.loads((pkg / "model.json").read_text())
    graph = manifest["variants"].get(variant)
    if graph is None:
        sys.exit(f"error: variant: the package has no {variant!r} (it has {', '.join(manifest['variants'])})")
    ids = np.array(prompts, dtype=np.int32)
    with tempfile.TemporaryDirectory() as d:
        for f in pkg.iterdir():
            if f.name != "genai_config.json":
                (Path(d) / f.name).symlink_to(f)
        (Path(d) / "genai_config.json").write_text(json.dumps(config(manifest, ids.shape[1] + new_tokens, threads,
                                                                    graph)))
        model = og.Model(d)
        for timed in (False, True):          # the first run warms the session up
            params = og.GeneratorParams(model)
            params.set_search_options(batch_size=len(prompts), max_length=ids.shape[1] + new_tokens)
            gen = og.Generator(model, params)
            t = time.perf_counter()
            gen.append_tokens(ids)
            produced = 0
            while not gen.is_done():
                gen.generate_next_token()
                produced += len(prompts)
            wall = time.perf_counter() - t
    print(json.dumps({"tokens_per_s": produced / wall, "tokens": produced, "wall_s": wall, "variant": variant,
                      "graph": graph}))


if __name__ == "__main__":
    main()
