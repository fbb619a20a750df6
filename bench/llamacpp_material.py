"""What bench/llamacpp.py runs on (`--material`): the checkpoint, its package in a scratch repository, the prompt pool,
the tokenizer, llama.cpp's name for its pre-tokenizer and how ortserve is told to size its slots.

    llama-124m   the Llama ~124M shape of bench/generation.py, trained briefly (bench/generation.py `trained_llama`)
    qwen3-0.6b   Qwen3-0.6B's shape, random weights, Qwen's vocabulary (bench/qwen3_material.py), exported with a
                 4,096-token cap; a weight-quantized variant the gate refuses on these random weights is published
                 ungated in the scratch repository (`publish_ungated`), and every report says so
"""
from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelpkg import MANIFEST_FILE, PARITY_FILE, file_hashes

from . import qwen3_material as q3
from .config import ROOT

log = logging.getLogger(__name__)
MATERIALS = ("llama-124m", "qwen3-0.6b")
UNGATED = ("built by the export stage's own builder (export/weights.py build_variant) and published in the "
           "benchmark's scratch repository without passing the parity gate, which refused it on random weights "
           "(near-flat logits: greedy continuations drift on near-ties); for speed and memory only, never to deploy")
UNGATED_NOT_RUN = ("built by the export stage's own builder (export/weights.py build_variant) and published in the "
                   "benchmark's scratch repository without the parity gate, which was not run for it (the package was "
                   "exported fp32 only: the gate refuses this variant on random weights, near-flat logits whose greedy "
                   "continuations drift on near-ties); for speed and memory only, never to deploy")


@dataclass
class Material:
    name: str                      # the --material
    ckpt: Path
    repo: Path                     # the scratch repository
    model: str                     # the model's name in it
    pool: list[int]                # token ids the prompts are drawn from
    tok: Any                       # the package's tokenizers.Tokenizer
    pre_tokenizer: str             # llama.cpp's name for the tokenizer's split (bench/gguf_convert.py)
    describe: str                  # one line for the report
    serve_args: tuple[str, ...] = ()           # ortserve's extra flags in every piece (e.g. --max-model-len)
    ungated: dict[str, str] = field(default_factory=dict)   # variant -> why it is served without the gate

    @property
    def package(self) -> Path:
        return self.repo / self.model / "1"

    def manifest(self) -> dict[str, Any]:
        return json.loads((self.package / MANIFEST_FILE).read_text())


def _pool(tok) -> list[int]:
    from .material import passages

    ids: list[int] = []
    for text in passages(400, 40, seed=1):
        ids += tok.encode(text).ids
    return ids


def llama_material(work: Path, threads: int, variants: tuple[str, ...]) -> Material:
    from tokenizers import Tokenizer

    from .generation import Config as GenConfig
    from .generation import material

    gen = dataclasses.replace(GenConfig(), model="llama", threads=threads, work=work,
                              extra_variants=tuple(v for v in variants if v != "fp32"))
    ckpt, repo, pool = material(gen)
    tok = Tokenizer.from_file(str(repo / "gpt" / "1" / "tokenizer.json"))
    return Material("llama-124m", ckpt, repo, "gpt", pool, tok, "gpt-2",
                    "the Llama ~124M shape of bench/generation.py (12 layers, 768 wide, 12 heads / 4 kv heads, SwiGLU "
                    "2048, tied head, vocab 8000, trained 150 steps on Shakespeare: bench/generation.py "
                    "`trained_llama`)")


def qwen3_material(work: Path, threads: int, variants: tuple[str, ...], serve_len: int) -> Material:
    """The random Qwen3-0.6B-shaped checkpoint exported with its cap; wanted variants the gate refused, ungated."""
    from tokenizers import Tokenizer

    ckpt = q3.checkpoint(work)
    repo, name = work / "repository-qwen3", q3.NAME
    pkg = repo / name / "1"
    if not (pkg / PARITY_FILE).is_file():
        cmd = [sys.executable, "-m", "export", str(ckpt), "--task", "generate", "--max-length",
               str(q3.CAP), "--repository", str(repo), "--name", name, "--version", "1",
               "--threads", str(threads), "--variants", ",".join(variants)]
        log.info("exporting %s (the gate on a 0.6B model takes minutes): %s", ckpt.name, " ".join(cmd[1:]))
        done = subprocess.run(cmd, cwd=ROOT)
        if done.returncode not in (0, 1) or not (pkg / PARITY_FILE).is_file():
            raise subprocess.CalledProcessError(done.returncode, cmd)
    ungated = {}
    for v in variants:
        why = ungated_reason(pkg, v)
        if why is not None:
            ungated[v] = why
        elif v not in json.loads((pkg / MANIFEST_FILE).read_text())["variants"]:
            publish_ungated(pkg, ckpt, v)
            ungated[v] = ungated_reason(pkg, v) or ""
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    shape = q3.SHAPE
    return Material("qwen3-0.6b", ckpt, repo, name, _pool(tok), tok, q3.PRE_TOKENIZER,
                    f"Qwen3-0.6B's shape ({shape['num_hidden_layers']} layers, {shape['hidden_size']} wide, "
                    f"{shape['num_attention_heads']} heads / {shape['num_key_value_heads']} kv heads of "
                    f"{shape['head_dim']}, q/k RMSNorm, SwiGLU {shape['intermediate_size']}, tied head, vocab "
                    f"{shape['vocab_size']:,}) with RANDOM weights (transformers' init, seed 0) and Qwen's own BPE "
                    "vocabulary (bench/qwen3_material.py); package exported with --max-length "
                    f"{q3.CAP}",
                    serve_args=("--max-model-len", str(serve_len)), ungated=ungated)


def ungated_reason(pkg: Path, variant: str) -> str | None:
    """Why `variant` of the scratch package serves without the gate (None: it passed the gate, or is absent)."""
    entry = json.loads((pkg / PARITY_FILE).read_text()).get("variants", {}).get(variant, {})
    return entry.get("ungated")


def publish_ungated(pkg: Path, ckpt: Path, variant: str) -> None:
    """Build `variant` beside the package's fp32 graph with the export stage's builder, list it in model.json and
    record it in parity.json as served, its gate's refusal kept beside the statement (files re-hashed)."""
    import torch

    from export import weights
    from export.config import WEIGHT_QUANT
    from export.decoder_weights import inplace_weights
    from export.source import inspect_checkpoint, load_torch_model

    if weights.WEIGHT_VARIANTS[variant][1]:
        raise ValueError(f"{variant}: an int8-cache variant needs the export's calibration; only w8 / w4 are built here")
    manifest = json.loads((pkg / MANIFEST_FILE).read_text())
    parity = json.loads((pkg / PARITY_FILE).read_text())
    gate = parity.get("variants", {}).get(variant, {})
    log.warning("%s: %s not in the package (gate: %s); building it outside the gate", pkg, variant,
                gate.get("status", "not run"))
    with torch.no_grad():
        info = inspect_checkpoint(ckpt, "generate")
        model = load_torch_model(info, "generate")
        w = inplace_weights(model, info.model_type, int(manifest["max_length"]))
    build = weights.build_variant(variant, w, pkg, dict(WEIGHT_QUANT), None, 0)
    del model, w
    manifest["variants"][variant] = build.file
    manifest["cache"].setdefault("mixed_graphs", {})[variant] = weights.variant_files(variant)[1]
    manifest.setdefault("quantization", {})[variant] = weights.describe(variant, dict(WEIGHT_QUANT))
    parity.setdefault("variants", {})[variant] = {
        **gate, "passed": True, "status": "passed", "gate_status": gate.get("status", "not run"),
        "ungated": UNGATED if gate else UNGATED_NOT_RUN, "notes": build.notes}
    (pkg / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2) + "\n")
    parity["files"] = file_hashes(pkg)
    (pkg / PARITY_FILE).write_text(json.dumps(parity, indent=2) + "\n")
