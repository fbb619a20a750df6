"""A seq2seq peer of bench/seq2seq.py, run in the peer's own environment: CTranslate2 (bench/.venv-ct2) or
transformers' generate (the project's .venv). Standard library + the engine only.

    python -m bench.s2s_peer convert CHECKPOINT OUT [--quantization int8]     # CTranslate2 model from an HF checkpoint
    python -m bench.s2s_peer serve --engine ct2|hf --model DIR [--inter-threads N] [--intra-threads N] [--threads N]

`serve` reads one JSON request per line on stdin and answers one JSON line on stdout, so the benchmark keeps the
peer loaded while the sides take turns:
  {"op": "batch", "sources": [...], "beam": 1, "max_new": 32, "min_new": 0, "max_batch_size": 64}
      one batch job: the engine's own batching over every source (CTranslate2: translate_batch splits by
      max_batch_size after sorting by length; transformers: the same split done here) -> {"wall_s", "outputs"}
  {"op": "clients", "sources": [...], "clients": 8, "max_new": 32, "min_new": 0, "max_batch": 32}
      served: closed-loop client threads in this process calling an ArrivalBatcher (bench/s2s_loop.py) over the
      engine (CTranslate2: one loop per inter_threads replica), greedy
      -> {"wall_s", "records": [{"client", "index", "sent", "first", "done", "output"}], "batches"}
  {"op": "quit"}
Sources are token strings for CTranslate2 (what translate_batch takes, the eos included) and token ids for
transformers; outputs likewise (without the eos).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable

from bench.s2s_loop import ArrivalBatcher, run_clients


# ----------------------------------------------------------------------------- conversion (CTranslate2)


def convert(checkpoint: Path, out: Path, quantization: str | None) -> str:
    """`ct2-transformers-converter --model CHECKPOINT --output_dir OUT [--quantization Q]` through its Python API,
    written to a temporary folder, then renamed. Returns which loader converted it.

    CTranslate2's Marian loader assumes OPUS-MT's vocabulary (pad the LAST token, its embedding row zero): it drops
    the last row and starts the decoder from a zero vector. A Marian checkpoint whose pad is elsewhere (the g2p
    model: pad 0, a trained row) is converted with the same loader minus those two steps: the decoder then starts
    from decoder_start_token_id's embedding, as transformers' generate does."""
    import shutil

    import ctranslate2
    from ctranslate2.converters import transformers as ct2t

    loader = conversion(json.loads((checkpoint / "config.json").read_text()))
    if loader != STANDARD:
        ct2t._MODEL_LOADERS["MarianConfig"] = _marian_keeping_pad()
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    ctranslate2.converters.TransformersConverter(str(checkpoint)).convert(str(tmp), quantization=quantization,
                                                                           force=True)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return loader


STANDARD = "ct2-transformers-converter's own loader"
KEEPING_PAD = ("its Marian loader without the OPUS-MT pad handling (pad is not the last token): the decoder starts "
               "from the start token's embedding, as transformers does")


def conversion(config: dict[str, Any]) -> str:
    """How convert() converts a checkpoint of this config.json."""
    if config.get("model_type") == "marian" and config.get("pad_token_id") != config.get("vocab_size", 0) - 1:
        return KEEPING_PAD
    return STANDARD


def _marian_keeping_pad():
    """An instance of the loader described in convert() (defined here: it subclasses ctranslate2's)."""
    from ctranslate2.converters import transformers as ct2t

    class MarianKeepingPad(ct2t.MarianMTLoader):
        def get_model_spec(self, model):
            model.config.normalize_before = False
            model.config.normalize_embedding = False
            return ct2t.BartLoader.get_model_spec(self, model)      # without _remove_pad_weights

        def set_decoder(self, spec, decoder):
            ct2t.BartLoader.set_decoder(self, spec, decoder)        # without start_from_zero_embedding

        def get_vocabulary(self, model, tokenizer):
            return ct2t.BartLoader.get_vocabulary(self, model, tokenizer)

        def set_config(self, config, model, tokenizer):
            config.eos_token = tokenizer.eos_token
            config.unk_token = tokenizer.unk_token
            config.decoder_start_token = tokenizer.convert_ids_to_tokens(model.config.decoder_start_token_id)

    return MarianKeepingPad()


# ----------------------------------------------------------------------------- engines


class Ct2Engine:
    def __init__(self, model: Path, inter_threads: int, intra_threads: int) -> None:
        import ctranslate2

        self.translator = ctranslate2.Translator(str(model), device="cpu", inter_threads=inter_threads,
                                                 intra_threads=intra_threads)
        self.workers = inter_threads    # served: one arrival loop per replica, so that every replica is used
        self.threads = {"inter_threads": inter_threads, "intra_threads": intra_threads,
                        "compute_type": self.translator.compute_type, "version": ctranslate2.__version__}

    def _options(self, beam: int, max_new: int, min_new: int) -> dict[str, Any]:
        return {"beam_size": beam, "max_decoding_length": max_new, "min_decoding_length": max(min_new, 1),
                "max_input_length": 0}

    def batch(self, sources: list[list[str]], beam: int, max_new: int, min_new: int,
              max_batch_size: int) -> list[list[str]]:
        results = self.translator.translate_batch(sources, max_batch_size=max_batch_size, batch_type="examples",
                                                  **self._options(beam, max_new, min_new))
        return [r.hypotheses[0] for r in results]

    def engine(self, max_new: int, min_new: int) -> Callable[[list, Callable[[int], None]], list]:
        def run(sources: list[list[str]], on_step: Callable[[int], None]) -> list:
            def callback(step: Any) -> bool:
                on_step(step.batch_id)
                return False
            results = self.translator.translate_batch(sources, callback=callback, **self._options(1, max_new, min_new))
            return [r.hypotheses[0] for r in results]
        return run


class HfEngine:
    def __init__(self, model: Path, threads: int) -> None:
        import torch
        import transformers

        torch.set_num_threads(threads)
        transformers.logging.set_verbosity_error()
        self.torch = torch
        self.model = transformers.AutoModelForSeq2SeqLM.from_pretrained(str(model)).eval()
        cfg = self.model.config
        self.pad, self.eos = cfg.pad_token_id, cfg.eos_token_id
        self.workers = 1
        self.threads = {"threads": torch.get_num_threads(), "interop_threads": torch.get_num_interop_threads(),
                        "attn_implementation": cfg._attn_implementation, "torch": torch.__version__,
                        "transformers": transformers.__version__}

    def _generate(self, sources: list[list[int]], beam: int, max_new: int, min_new: int,
                  on_step: Callable[[int], None] | None) -> list[list[int]]:
        torch = self.torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        width = max(len(s) for s in sources)
        ids = torch.full((len(sources), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(sources), width), dtype=torch.long)
        for i, s in enumerate(sources):
            ids[i, :len(s)] = torch.tensor(s)
            mask[i, :len(s)] = 1
        criteria = None
        if on_step is not None:
            class Stamp(StoppingCriteria):
                """Called once per step after the new tokens are chosen: every row got one."""
                def __call__(self, input_ids, scores, **kwargs):
                    for row in range(input_ids.shape[0]):
                        on_step(row)
                    return torch.zeros(input_ids.shape[0], dtype=torch.bool)
            criteria = StoppingCriteriaList([Stamp()])
        with torch.inference_mode():
            out = self.model.generate(input_ids=ids, attention_mask=mask, num_beams=beam, do_sample=False,
                                      max_new_tokens=max_new, min_new_tokens=min_new, stopping_criteria=criteria,
                                      early_stopping=False, length_penalty=1.0)
        outputs = []
        for row in out[:, 1:].tolist():              # without the decoder start token
            if self.eos in row:
                row = row[:row.index(self.eos)]
            outputs.append(row)
        return outputs

    def batch(self, sources: list[list[int]], beam: int, max_new: int, min_new: int,
              max_batch_size: int) -> list[list[int]]:
        order = sorted(range(len(sources)), key=lambda i: len(sources[i]))   # as CTranslate2 splits: by length
        outputs: list[list[int]] = [[] for _ in sources]
        for start in range(0, len(order), max_batch_size):
            rows = order[start:start + max_batch_size]
            for i, out in zip(rows, self._generate([sources[i] for i in rows], beam, max_new, min_new, None)):
                outputs[i] = out
        return outputs

    def engine(self, max_new: int, min_new: int) -> Callable[[list, Callable[[int], None]], list]:
        return lambda sources, on_step: self._generate(sources, 1, max_new, min_new, on_step)


# ----------------------------------------------------------------------------- the request loop


def answer(engine: Any, request: dict[str, Any]) -> dict[str, Any]:
    op = request["op"]
    if op == "batch":
        t0 = time.perf_counter()
        outputs = engine.batch(request["sources"], request["beam"], request["max_new"], request.get("min_new", 0),
                               request.get("max_batch_size", 64))
        return {"wall_s": time.perf_counter() - t0, "outputs": outputs}
    if op == "clients":
        with ArrivalBatcher(engine.engine(request["max_new"], request.get("min_new", 0)),
                            request.get("max_batch", 32), engine.workers) as server:
            wall, records = run_clients(request["clients"], request["sources"], server.call)
        return {"wall_s": wall, "batches": server.batches,
                "records": [{"client": r.client, "index": r.index, "sent": r.sent, "first": r.first, "done": r.done,
                             "output": r.output} for r in records]}
    raise ValueError(f"op: unknown {op!r}")


def serve(engine: Any) -> None:
    out = sys.stdout
    sys.stdout = sys.stderr          # library prints must not reach the protocol stream
    out.write(json.dumps({"ready": True, "threads": engine.threads}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("op") == "quit":
            return
        try:
            reply = answer(engine, request)
        except Exception as e:      # noqa: BLE001 - reported to the benchmark, which fails naming it
            reply = {"error": f"{type(e).__name__}: {e}"}
        out.write(json.dumps(reply) + "\n")
        out.flush()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.s2s_peer", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("convert")
    c.add_argument("checkpoint", type=Path)
    c.add_argument("out", type=Path)
    c.add_argument("--quantization", default=None, help="e.g. int8 (default: the checkpoint's float32)")
    s = sub.add_parser("serve")
    s.add_argument("--engine", choices=("ct2", "hf"), required=True)
    s.add_argument("--model", type=Path, required=True)
    s.add_argument("--inter-threads", type=int, default=1)
    s.add_argument("--intra-threads", type=int, default=0)
    s.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    a = ap.parse_args(argv)
    if a.command == "convert":
        print(json.dumps({"out": str(a.out), "loader": convert(a.checkpoint, a.out, a.quantization)}))
        return 0
    engine = Ct2Engine(a.model, a.inter_threads, a.intra_threads) if a.engine == "ct2" else HfEngine(a.model, a.threads)
    serve(engine)
    return 0


if __name__ == "__main__":
    sys.exit(main())
