"""`--task embed`: an encoder checkpoint -> a sentence-embedding package (graph output `embeddings`).

Everything after the encoder lives inside the graph, so every consumer of the package (the server, a raw KServe
call, another runtime) gets the same vectors:

    embeddings = [Dense | Normalize]*( pool(last_hidden_state, attention_mask) )     [batch, dimension] float32

`auto` reads the checkpoint's sentence-transformers modules (export/st_modules.py: modules.json in order, the
Pooling config in its v2-5 or v6 layout, Dense weights and activation, Normalize, the prompts) and falls back to
mean pooling without normalization for a plain encoder; --pooling mean|cls and --normalize on|off override
pooling and normalization. The manifest records them as `embedding: {pooling, normalize, dimension, modules,
prompts, default_prompt_name, ...}` (docs/model-package.md). The gate is export/embed_gate.py.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer
from torch import nn

from modelpkg import Manifest, TensorDecl

from . import graphs, int8, package, variants
from .checkpoint_tokens import special_tokens
from .config import ExportConfig, Tolerances
from .embed_gate import MIN_COSINE, run_embed_gate, sentence_transformers_reference, torch_reference
from .errors import ExportError
from .heldout import BUILTIN_TEXTS
from .package_manifest import new_manifest, tensors
from .result import ExportResult
from .skeleton import Built, Gated
from .source import CheckpointInfo, inspect_checkpoint, optional_json
from .st_head import StHead
from .st_modules import StModules, read_st_modules
from .tokenizer_check import TokenizerReport, check_tokenizer, package_tokenizer

log = logging.getLogger(__name__)

POOLINGS = ("mean", "cls")
VARIANTS = ("fp32", "optimized", "int8")
# The family's classifier kind builds the encoder with `encode()`; its (freshly initialised) head never runs.
ENCODER_KINDS = {"bert": "bert-classifier", "roberta": "roberta-classifier", "albert": "albert-classifier",
                 "distilbert": "distilbert-classifier", "electra": "electra-classifier",
                 "xlm-roberta": "xlm-roberta-classifier", "deberta-v2": "deberta-v2-classifier"}
ENCODER_KINDS["modernbert"] = "modernbert-classifier"
ENCODER_KINDS["mpnet"] = "mpnet-classifier"


@dataclass(frozen=True)
class Pooling:
    modules: StModules
    source: str                  # where the choice came from (flag, sentence-transformers config, default)
    sentence_transformers: bool  # the checkpoint's sentence-transformers modules decide the graph unchanged

    @property
    def mode(self) -> str:
        """The pooling modes, `+`-joined when several are concatenated."""
        return "+".join(self.modules.pooling_modes)

    @property
    def normalize(self) -> bool:
        return self.modules.normalize


def read_pooling(checkpoint: Path, hidden_size: int, pooling: str = "auto", normalize: str = "auto") -> Pooling:
    """What follows the encoder: flags first, then the checkpoint's sentence-transformers modules, then mean."""
    found = read_st_modules(checkpoint, hidden_size)
    modules = found or StModules(("mean",))
    source = "sentence-transformers config" if found else "default (mean, not normalized)"
    if pooling != "auto":
        if pooling not in POOLINGS:
            raise ExportError(f"--pooling: must be auto, {' or '.join(POOLINGS)}, got {pooling!r}")
        modules, source = replace(modules, pooling_modes=(pooling,)), "--pooling"
    if normalize != "auto":
        if normalize not in ("on", "off"):
            raise ExportError(f"--normalize: must be auto, on or off, got {normalize!r}")
        steps = tuple(s for s in modules.steps if s != "normalize")
        modules = replace(modules, steps=steps + (("normalize",) if normalize == "on" else ()))
    overridden = pooling != "auto" or (normalize != "auto" and modules != found)
    if found is not None and overridden:
        log.info("--pooling/--normalize override the checkpoint's sentence-transformers modules")
    return Pooling(modules, source, found is not None and not overridden)


class EmbeddingAdapter(nn.Module):
    """encode() -> pooling -> Dense / Normalize, as sentence-transformers computes them (export/st_head.py)."""

    def __init__(self, model: nn.Module, pooling: Pooling, token_types: bool) -> None:
        super().__init__()
        self.model, self.token_types = model, token_types
        self.head = StHead(pooling.modules.pooling_modes, pooling.modules.steps)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor | None = None) -> torch.Tensor:
        if self.token_types:
            hidden = self.model.encode(input_ids, attention_mask, token_type_ids)
        else:
            hidden = self.model.encode(input_ids, attention_mask)
        return self.head(hidden, attention_mask)


class EmbedSpec(graphs.GraphSpec):
    def dynamic_axes(self) -> dict[str, dict[int, str]]:
        return {t.name: {i: a for i, a in enumerate(t.shape) if a in ("batch", "sequence")}
                for t in (*self.inputs, *self.outputs)}


def embed_spec(token_types: bool) -> EmbedSpec:
    inputs = tuple(t for t in graphs.ENCODER_INPUTS if token_types or t.name != "token_type_ids")
    return EmbedSpec(inputs, (graphs.TensorSpec("embeddings", "float32", ("batch", "dimension")),))


def max_length_of(info: CheckpointInfo) -> int:
    """The positions of the encoder, or sentence-transformers' max_seq_length when the checkpoint sets one
    (texts beyond it are refused or, with truncate, cut: the length the model was trained to embed). Without
    sentence_bert_config.json's key (version 6 no longer writes it) a sentence-transformers model's length is its
    tokenizer's model_max_length, as the library reads it."""
    limit = info.max_positions
    st = optional_json(info.path / "sentence_bert_config.json")
    if isinstance(st.get("max_seq_length"), int) and 0 < st["max_seq_length"] < limit:
        limit = st["max_seq_length"]
    elif (info.path / "modules.json").is_file():
        mml = optional_json(info.path / "tokenizer_config.json").get("model_max_length")
        if isinstance(mml, int) and 0 < mml < limit:
            limit = mml
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


def gate_package(adapter: EmbeddingAdapter, pooling: Pooling, info: CheckpointInfo, graph: Path, tok: Tokenizer,
                 pad_id: int, tolerances: Tolerances, threads: int, quantized: bool = False,
                 atol: float | None = None):
    """The gate against sentence-transformers when its modules decide the graph, else against our adapter;
    `quantized`: the int8 variant's rule (export/embed_gate.py); `atol`: the elementwise limit of the others."""
    modules = pooling.modules
    reference, name = None, "sentence-transformers"
    if pooling.sentence_transformers:
        reference = sentence_transformers_reference(info.path)
    if reference is None:
        reference, name = torch_reference(adapter, tok, pad_id, info.token_types, modules.prompts,
                                          modules.default_prompt_name), "torch"
    return run_embed_gate(reference, graph, tok, pad_id, info.token_types, atol or tolerances.fp32_atol, threads,
                          modules.prompts, modules.default_prompt_name, name,
                          tolerances.int8_min_cosine if quantized else MIN_COSINE, quantized)


def variant_atol(variant: str, tolerances: Tolerances) -> float:
    """The elementwise limit against the reference: the optimized graph's fused kernels sum in other orders."""
    return tolerances.optimized_atol if variant == "optimized" else tolerances.fp32_atol


def serving_tokenizer(path: Path, max_length: int) -> Tokenizer:
    """The packaged tokenizer as the server's truncating instance uses it (sentence-transformers cuts texts at
    the same length)."""
    tok = Tokenizer.from_file(str(path))
    tok.no_padding()
    tok.enable_truncation(max_length, strategy="longest_first")
    return tok


class EmbedBuilder:
    """The embedding task: encode() -> pooling -> Dense / Normalize as one fp32 graph (and, asked for, its optimized
    and int8 variants), checked by the gate."""

    def __init__(self, cfg: ExportConfig) -> None:
        if not set(cfg.variants) <= set(VARIANTS):
            raise ExportError("--variants: an embedding package ships fp32 and optionally optimized and int8, got "
                              + ",".join(cfg.variants))
        package.validate_name(cfg.name)
        self.cfg = cfg
        self.info = inspect_checkpoint(cfg.checkpoint, "embed")
        variants.refuse_unfused(self.info.model_type, cfg.variants)
        self.checkpoint = self.info.path
        self.pooling = read_pooling(self.info.path, self.info.hidden_size, cfg.pooling, cfg.normalize)

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
        modules = self.pooling.modules
        dimension = modules.dimension(int(info.hidden_size))
        builds = {"fp32": variants.VariantBuild("fp32", fp32.name)}
        if "optimized" in self.cfg.variants:
            builds["optimized"] = variants.build_optimized(fp32, staging / variants.FILES["optimized"], info.model_type,
                                                           info.num_layers, info.num_heads, info.hidden_size)
        if "int8" in self.cfg.variants:
            calibration = int8.calibration_feeds(serving_tokenizer(staging / "tokenizer.json", max_length), max_length)
            builds["int8"] = variants.build_int8(fp32, staging / variants.FILES["int8"], calibration)
        manifest = new_manifest(
            self.cfg.name, "embed", info, max_length=max_length, special_tokens=ids, inputs=tensors(spec.inputs),
            outputs=(TensorDecl("embeddings", "float32", ("batch", dimension)),),
            variants={v: b.file for v, b in builds.items()}, default_variant={"cpu": "fp32", "cuda": "fp32"},
            extra={"embedding": {"pooling": self.pooling.mode, "normalize": self.pooling.normalize,
                                 "dimension": dimension, "pooling_source": self.pooling.source,
                                 "matryoshka": bool(self.cfg.matryoshka),
                                 "modules": list(modules.module_types) if self.pooling.sentence_transformers else [],
                                 "prompts": dict(modules.prompts), "default_prompt_name": modules.default_prompt_name}})
        return Built(manifest, builds, removed, export_s)

    def gate(self, built: Built, staging: Path) -> Gated:
        t1 = time.perf_counter()
        tok = serving_tokenizer(staging / "tokenizer.json", built.manifest.max_length)
        results = {v: gate_package(self.adapter, self.pooling, self.info, staging / file, tok,
                                   built.manifest.special_token("pad") or 0, self.cfg.tolerances, self.cfg.threads,
                                   quantized=v == "int8", atol=variant_atol(v, self.cfg.tolerances))
                   for v, file in built.manifest.variants.items()}
        # A refused int8 leaves the package alone (finish); fp32 and optimized must pass.
        return Gated(all(r.passed for v, r in results.items() if v != "int8"), results, time.perf_counter() - t1)

    def failure_text(self, gated: Gated, tok_report: TokenizerReport, report: dict[str, Any]) -> str:
        failures = list(gated.results["fp32"].failures)
        if "optimized" in gated.results:
            failures += [f"optimized: {f}" for f in gated.results["optimized"].failures]
        return "  " + "\n  ".join(failures + tok_report.failures)

    def finish(self, staging: Path, manifest: Manifest, report: dict[str, Any], gated: Gated) -> Manifest:
        """Drop a refused int8 (its figures stay in parity.json); the CPU default is package.default_variants' rule,
        the encoders' one (int8 > optimized > fp32 among those that passed); CUDA: optimized > fp32."""
        kept = dict(manifest.variants)
        for v, result in gated.results.items():
            if v == "int8" and not result.passed:
                log.warning("%s: refused %s (%s); publishing without it", manifest.name, v, "; ".join(result.failures))
                (staging / kept.pop(v)).unlink(missing_ok=True)
                report["variants"][v]["status"] = "refused: " + "; ".join(result.failures)
        return replace(manifest, variants=kept, default_variant=package.default_variants(kept, report["variants"]))

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
    if recorded.get("modules"):   # the checkpoint's sentence-transformers modules, as they are
        pooling = read_pooling(info.path, info.hidden_size)
    else:
        flag = str(recorded.get("pooling", "mean")) if recorded.get("pooling_source") == "--pooling" else "auto"
        pooling = read_pooling(info.path, info.hidden_size, flag, "on" if recorded.get("normalize") else "off")
    adapter = EmbeddingAdapter(load_encoder(info), pooling, info.token_types).eval()
    tok_report = check_tokenizer(info.path, pkg, list(BUILTIN_TEXTS), None, manifest["max_length"], [])
    tolerances = ExportConfig(checkpoint=info.path, task="embed", repository=pkg.parent.parent, name="x").tolerances
    tok = serving_tokenizer(pkg / "tokenizer.json", manifest["max_length"])
    lines, passed = [], True
    for variant, file in manifest["variants"].items():
        pad = manifest.get("special_tokens", {}).get("pad") or 0
        result = gate_package(adapter, pooling, info, pkg / file, tok, pad, tolerances, threads,
                              quantized=variant == "int8", atol=variant_atol(variant, tolerances))
        limit = tolerances.int8_min_cosine if variant == "int8" else MIN_COSINE
        lines += [f"{variant:<10} {name:<14} max |diff| {diff:.2e}" for name, diff in result.max_abs_diff.items()]
        lines.append(f"{variant:<10} min cosine {result.min_cosine:.7f} (>= {limit}, against {result.reference})")
        lines += [f"FAILED     {variant}: {f}" for f in result.failures]
        passed &= result.passed
    lines += [f"FAILED     {f}" for f in tok_report.failures]
    lines += [f"package    {p}" for p in problems]
    return passed and tok_report.passed and not problems, "\n".join(lines)
