"""`--task embed`: an encoder checkpoint -> a sentence-embedding package (graph output `embeddings`).

Pooling and normalization live inside the graph, so every consumer of the package (the server, a raw KServe
call, another runtime) gets the same vectors:

    embeddings = normalize?( pool(last_hidden_state, attention_mask) )     [batch, dimension] float32

Pooling: `mean` (over non-padding tokens) or `cls` (the first token); `auto` reads the checkpoint's
sentence-transformers files (modules.json + <pooling dir>/config.json, and a Normalize module) and falls back
to mean without normalization. The manifest records them as `embedding: {pooling, normalize, dimension}`.

The parity gate of this task: the ONNX graph against the PyTorch encoder + the same pooling on the held-out
texts, batch 1 and a padded batch of 3; max |diff| within the fp32 tolerance and cosine >= MIN_COSINE per text.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime
import torch
from tokenizers import Tokenizer
from torch import nn

from modelpkg import Manifest, TensorDecl

from . import graphs, package, variants
from .checkpoint_tokens import special_tokens
from .config import ExportConfig
from .errors import ExportError
from .heldout import BUILTIN_TEXTS
from .package_manifest import new_manifest, tensors
from .parity_noise import NOISE_FACTOR, NoiseScale, float64_twin
from .result import ExportResult
from .skeleton import Built, Gated
from .source import CheckpointInfo, inspect_checkpoint, optional_json
from .tokenizer_check import TokenizerReport, check_tokenizer, package_tokenizer

log = logging.getLogger(__name__)

POOLINGS = ("mean", "cls")
MIN_COSINE = 0.99999
# The family's classifier kind builds the encoder with `encode()`; its (freshly initialised) head never runs.
ENCODER_KINDS = {"bert": "bert-classifier", "roberta": "roberta-classifier", "albert": "albert-classifier",
                 "distilbert": "distilbert-classifier", "electra": "electra-classifier"}


@dataclass(frozen=True)
class Pooling:
    mode: str
    normalize: bool
    source: str  # where the choice came from (flag, sentence-transformers config, default)


def read_pooling(checkpoint: Path, pooling: str = "auto", normalize: str = "auto") -> Pooling:
    """The pooling to export: flags first, then the checkpoint's sentence-transformers config, then mean."""
    mode, norm, source = None, None, "default (mean, not normalized)"
    modules_file = checkpoint / "modules.json"
    if modules_file.is_file():
        try:
            modules = json.loads(modules_file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExportError(f"checkpoint: {modules_file} is not valid JSON ({exc})") from None
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules if isinstance(m, dict)}
        norm = "Normalize" in kinds
        pool = kinds.get("Pooling")
        if pool is not None:
            cfg_file = checkpoint / str(pool.get("path", "")) / "config.json"
            try:
                cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
            except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
                raise ExportError(f"checkpoint: pooling config {cfg_file} unreadable ({exc})") from None
            chosen = [k for k in ("mean", "cls", "max", "mean_sqrt_len", "weightedmean", "lasttoken")
                      if cfg.get(f"pooling_mode_{k}_tokens") or (k == "cls" and cfg.get("pooling_mode_cls_token"))]
            if chosen != ["mean"] and chosen != ["cls"]:
                raise ExportError(f"checkpoint: sentence-transformers pooling {chosen} is not supported "
                                  f"(mean or cls; or pass --pooling)")
            mode = chosen[0]
        source = "sentence-transformers config"
    if pooling != "auto":
        if pooling not in POOLINGS:
            raise ExportError(f"--pooling: must be auto, {' or '.join(POOLINGS)}, got {pooling!r}")
        mode, source = pooling, "--pooling"
    if normalize != "auto":
        if normalize not in ("on", "off"):
            raise ExportError(f"--normalize: must be auto, on or off, got {normalize!r}")
        norm = normalize == "on"
    return Pooling(mode or "mean", bool(norm), source)


class EmbeddingAdapter(nn.Module):
    """encode() -> pooling -> optional L2 normalization, as sentence-transformers computes them."""

    def __init__(self, model: nn.Module, pooling: Pooling, token_types: bool) -> None:
        super().__init__()
        self.model, self.mode, self.normalize, self.token_types = model, pooling.mode, pooling.normalize, token_types

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.token_types:
            hidden = self.model.encode(input_ids, attention_mask, token_type_ids)
        else:
            hidden = self.model.encode(input_ids, attention_mask)
        if self.mode == "cls":
            pooled = hidden[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
        if self.normalize:
            pooled = nn.functional.normalize(pooled, p=2.0, dim=1)
        return pooled


class EmbedSpec(graphs.GraphSpec):
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {t.name: {i: a for i, a in enumerate(t.shape) if a in ("batch", "sequence")}
                for t in (*self.inputs, *self.outputs)}


def embed_spec(token_types: bool) -> EmbedSpec:
    inputs = tuple(t for t in graphs.ENCODER_INPUTS if token_types or t.name != "token_type_ids")
    return EmbedSpec(inputs, (graphs.TensorSpec("embeddings", "float32", ("batch", "dimension")),))


def max_length_of(info: CheckpointInfo) -> int:
    """The positions of the encoder, or sentence-transformers' max_seq_length when the checkpoint sets one
    (texts beyond it are refused or, with truncate, cut: the length the model was trained to embed)."""
    limit = info.max_positions
    st = optional_json(info.path / "sentence_bert_config.json")
    if isinstance(st.get("max_seq_length"), int) and 0 < st["max_seq_length"] < limit:
        limit = st["max_seq_length"]
    return limit


def load_encoder(info: CheckpointInfo) -> nn.Module:
    from training.checkpoint import CheckpointError, load_model

    kind = ENCODER_KINDS.get(info.model_type)
    if kind is None:
        raise ExportError(f"--task embed: needs an encoder checkpoint ({', '.join(ENCODER_KINDS)}), "
                          f"got model_type {info.model_type!r}")
    checkpoint_log = logging.getLogger("training.checkpoint")
    level = checkpoint_log.level
    checkpoint_log.setLevel(logging.ERROR)  # "newly initialised: classifier.*": that head never runs here
    try:
        # A classifier checkpoint keeps its own label count, so its (unused) head's shapes match the file.
        model, _ = load_model(info.path, kind=kind, num_labels=len(info.labels) or 2)
    except CheckpointError as exc:
        raise ExportError(f"checkpoint: {exc}") from None
    except (OSError, ValueError, RuntimeError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"checkpoint: cannot load weights from {info.weights_file.name}: {first}") from None
    finally:
        checkpoint_log.setLevel(level)
    return model.eval()


@dataclass
class EmbedParity:
    """The gate's result for one variant (the shape parity.json's `variants` entries have)."""

    passed: bool
    max_abs_diff: dict[str, float]
    min_cosine: float
    failures: list[str]
    noise: NoiseScale | None = None   # the fp32 tolerance's float noise rule (export/parity_noise.py)

    def as_json(self) -> dict[str, Any]:
        out = {"passed": self.passed, "status": "passed" if self.passed else "FAILED",
               "max_abs_diff": self.max_abs_diff, "min_cosine": self.min_cosine, "failures": self.failures}
        if self.noise is not None:
            out["float_noise"] = self.noise.as_json()
        return out


def _batch(tok: Tokenizer, texts: list[str], pad_id: int, token_types: bool) -> dict[str, np.ndarray]:
    encodings = [tok.encode(t) for t in texts]
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, :len(e.ids)] = e.ids
        mask[i, :len(e.ids)] = 1
    feeds = {"input_ids": ids, "attention_mask": mask}
    if token_types:
        feeds["token_type_ids"] = np.zeros_like(ids)
    return feeds


def run_embed_gate(adapter: EmbeddingAdapter, graph: Path, tok: Tokenizer, pad_id: int, token_types: bool,
                   atol: float, threads: int, noise_factor: float = NOISE_FACTOR) -> EmbedParity:
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    texts = list(BUILTIN_TEXTS)[:12]
    diffs: dict[str, float] = {}
    failures: list[str] = []
    min_cos = 1.0
    # the atol follows PyTorch's own fp32-vs-fp64 gap on each case's inputs, `atol` its floor (parity_noise.py)
    noise, twin = NoiseScale(atol, 0.0, noise_factor), float64_twin(adapter)
    for name, batches in (("batch1", [[t] for t in texts[:4]]), ("batch3_padded", [texts[i:i + 3]
                                                                                   for i in range(0, 12, 3)])):
        worst = 0.0
        for group in batches:
            feeds = _batch(tok, group, pad_id, token_types)
            with torch.no_grad():
                ref = adapter(*(torch.from_numpy(feeds[k]) for k in feeds)).numpy()
                noise.record("embeddings", ref, twin(*(torch.from_numpy(feeds[k]) for k in feeds)))
            got = session.run(["embeddings"], feeds)[0]
            worst = max(worst, float(np.abs(got - ref).max()))
            cos = (got * ref).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(ref, axis=1))
            min_cos = min(min_cos, float(cos.min()))
        diffs[name] = worst
        limit = noise.atols().get("embeddings", atol)
        if worst > limit:
            failures.append(f"{name}: max |onnx - torch| {worst:.2e} > {limit:.1e}")
    if min_cos < MIN_COSINE:
        failures.append(f"cosine {min_cos:.7f} < {MIN_COSINE}")
    return EmbedParity(not failures, diffs, min_cos, failures, noise)


class EmbedBuilder:
    """The embedding task: encode() -> pooling -> normalization as one fp32 graph, checked by run_embed_gate."""

    def __init__(self, cfg: ExportConfig) -> None:
        if tuple(cfg.variants) != ("fp32",):
            raise ExportError("--variants: an embedding package ships fp32 only")
        package.validate_name(cfg.name)
        self.cfg = cfg
        self.info = inspect_checkpoint(cfg.checkpoint, "embed")
        self.checkpoint = self.info.path
        self.pooling = read_pooling(self.info.path, cfg.pooling, cfg.normalize)

    def load(self) -> None:
        self.adapter = EmbeddingAdapter(load_encoder(self.info), self.pooling, self.info.token_types).eval()

    def build(self, staging: Path) -> Built:
        info = self.info
        t0 = time.perf_counter()
        spec = embed_spec(info.token_types)
        fp32 = staging / variants.FILES["fp32"]
        example = graphs.encoder_example(int(info.config["vocab_size"]))
        with torch.no_grad():
            graphs._export(self.adapter, example if info.token_types else example[:2], spec, fp32)
        export_s = time.perf_counter() - t0
        max_length = max_length_of(info)
        removed = package_tokenizer(info.path, staging, max_length)
        ids, _ = special_tokens(info, Tokenizer.from_file(str(staging / "tokenizer.json")))
        dimension = int(info.hidden_size)
        manifest = new_manifest(
            self.cfg.name, "embed", info, max_length=max_length, special_tokens=ids, inputs=tensors(spec.inputs),
            outputs=(TensorDecl("embeddings", "float32", ("batch", dimension)),), variants={"fp32": fp32.name},
            default_variant={"cpu": "fp32", "cuda": "fp32"},
            extra={"embedding": {"pooling": self.pooling.mode, "normalize": self.pooling.normalize,
                                 "dimension": dimension, "pooling_source": self.pooling.source,
                                 "matryoshka": bool(self.cfg.matryoshka)}})
        return Built(manifest, {"fp32": variants.VariantBuild("fp32", fp32.name)}, removed, export_s)

    def gate(self, built: Built, staging: Path) -> Gated:
        serving_tok = Tokenizer.from_file(str(staging / "tokenizer.json"))
        serving_tok.no_padding()
        serving_tok.no_truncation()
        t1 = time.perf_counter()
        result = run_embed_gate(self.adapter, staging / built.manifest.variants["fp32"], serving_tok,
                                built.manifest.special_token("pad") or 0, self.info.token_types,
                                self.cfg.tolerances.fp32_atol, self.cfg.threads,
                                self.cfg.tolerances.fp32_noise_factor)
        return Gated(result.passed, {"fp32": result}, time.perf_counter() - t1)

    def failure_text(self, gated: Gated, tok_report: TokenizerReport, report: dict[str, Any]) -> str:
        return "  " + "\n  ".join(gated.results["fp32"].failures + tok_report.failures)

    def finish(self, staging: Path, manifest: Manifest, report: dict[str, Any], gated: Gated) -> Manifest:
        return manifest

    def published(self, result: ExportResult) -> None:
        log.info("embedding package %s: pooling %s (%s), normalize %s", result.package_dir, self.pooling.mode,
                 self.pooling.source, self.pooling.normalize)


def validate_embedding(pkg: Path, manifest: dict[str, Any], problems: list[str], threads: int = 1
                       ) -> tuple[bool, str]:
    """`python -m export validate` for an embedding package: the gate again, from the recorded checkpoint."""
    info = inspect_checkpoint(Path(manifest.get("source", {}).get("checkpoint", "")), "embed")
    if info.weights_sha256 != manifest["source"].get("checkpoint_sha256"):
        problems.append("source checkpoint weights changed since export (sha256 differs)")
    recorded = manifest.get("embedding") or {}
    pooling = Pooling(str(recorded.get("pooling", "mean")), bool(recorded.get("normalize")), "model.json")
    adapter = EmbeddingAdapter(load_encoder(info), pooling, info.token_types).eval()
    tok_report = check_tokenizer(info.path, pkg, list(BUILTIN_TEXTS), None, manifest["max_length"], [])
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    token_types = "token_type_ids" in [t.get("name") for t in manifest.get("inputs", [])]
    result = run_embed_gate(adapter, pkg / manifest["variants"]["fp32"], tok,
                            manifest.get("special_tokens", {}).get("pad") or 0, token_types,
                            ExportConfig(checkpoint=info.path, task="embed", repository=pkg.parent.parent,
                                         name="x").tolerances.fp32_atol, threads)
    lines = [f"fp32       {name:<14} max |diff| {diff:.2e}" for name, diff in result.max_abs_diff.items()]
    lines.append(f"fp32       min cosine {result.min_cosine:.7f} (>= {MIN_COSINE})")
    lines += [f"FAILED     {f}" for f in result.failures + tok_report.failures]
    lines += [f"package    {p}" for p in problems]
    return result.passed and tok_report.passed and not problems, "\n".join(lines)
