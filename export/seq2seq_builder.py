"""`--task generate` for an encoder-decoder checkpoint (Marian, BART, T5, M2M100 / NLLB, mBART), plugged into
export/skeleton.py:
encoder.onnx + decoder.onnx (export/seq2seq_graph.py), the tokenizers, a model.json with its `encoder_decoder`
block (modelpkg.Seq2SeqSpec), checked by export/seq2seq_parity.py; with `--variants w8` / `w4` / `int8` quantized
twins of both graphs (export/seq2seq_quantized.py), judged on held-out sources, refused alone when they breach
their limits, and timed for the CPU default (export/seq2seq_speed.py)."""
from __future__ import annotations

import logging
import os
import shutil
import time
from dataclasses import replace
from pathlib import Path

import onnx
import torch
from tokenizers import Tokenizer

from modelpkg import LAYOUT_INPLACE, CacheSpec, Manifest, Seq2SeqSpec, padded_head_dim

from . import package, probes, seq2seq_graph, seq2seq_speed
from .checkpoint_tokens import special_tokens
from .config import ExportConfig
from .errors import ExportError
from .heldout import BUILTIN_TEXTS, seq2seq_sources
from .languages import language_tokens, source_language
from .package_manifest import new_manifest, tensors
from .parity_results import failure_table
from .seq2seq_quantized import SEQ2SEQ_QUANTIZED, WeightVariantGate, build_variant, describe
from .result import ExportResult
from .seq2seq_parity import Seq2SeqGateInputs, run_seq2seq_gate
from .seq2seq_weights import SEQ2SEQ_FAMILIES, Seq2SeqWeights, seq2seq_weights
from .skeleton import Built, Gated
from .source import inspect_checkpoint, load_torch_model, optional_json
from .tokenizer_check import package_tokenizer
from .variants import VariantBuild

log = logging.getLogger(__name__)

PERTURB_ENV = "ORTSERVE_EXPORT_PERTURB"   # test hook (export/model_builder.py): "fp32" = decoder, "encoder"
TARGET_TOKENIZER = "target_tokenizer.json"
MIN_LENGTH = 16


def is_seq2seq_checkpoint(path: Path) -> bool:
    """Whether config.json names an encoder-decoder family (an unreadable one is for the other builder to refuse)."""
    cfg = optional_json(Path(path) / "config.json") if (Path(path) / "config.json").is_file() else {}
    return isinstance(cfg, dict) and cfg.get("model_type") in SEQ2SEQ_FAMILIES


def _perturb(path: Path) -> None:
    from .model_builder import _perturb as perturb

    perturb(path)


def _spec(w: Seq2SeqWeights, config, graphs: dict[str, dict[str, str]], target_tokenizer: str | None,
          encoder_io, tokenizer: Tokenizer) -> Seq2SeqSpec:
    padded = padded_head_dim(w.head_dim)
    languages = language_tokens(tokenizer, w.family, w.target_vocab)
    source = source_language(tokenizer, languages)
    return Seq2SeqSpec(
        family=w.family, num_layers=len(w.decoder_layers), num_heads=w.decoder_heads, head_dim=padded,
        model_head_dim=w.head_dim if padded != w.head_dim else None, max_source_length=w.max_source_length,
        max_target_length=w.max_target_length, decoder_start_token_id=int(config.decoder_start_token_id),
        eos_token_id=int(config.eos_token_id), pad_token_id=int(config.pad_token_id),
        forced_bos_token_id=getattr(config, "forced_bos_token_id", None),
        forced_eos_token_id=getattr(config, "forced_eos_token_id", None),
        source_vocab_size=w.source_vocab, target_vocab_size=w.target_vocab, graphs=graphs,
        target_tokenizer=target_tokenizer, encoder_inputs=tensors(encoder_io.inputs),
        encoder_outputs=tensors(encoder_io.outputs), languages=languages,
        source_language=source[0] if source else None, source_language_index=source[1] if source else 0)


class Seq2SeqBuilder:
    def __init__(self, cfg: ExportConfig) -> None:
        offered = ("fp32", *SEQ2SEQ_QUANTIZED)
        if "fp32" not in cfg.variants or set(cfg.variants) - set(offered):
            raise ExportError(f"--variants: an encoder-decoder package ships {', '.join(offered)} (fp32 required; "
                              f"got {', '.join(cfg.variants)})")
        self.cfg = cfg
        self.info = inspect_checkpoint(cfg.checkpoint, cfg.task)
        self.checkpoint = self.info.path

    def load(self) -> None:
        self.model = load_torch_model(self.info, self.cfg.task)

    def build(self, staging: Path) -> Built:
        t0 = time.perf_counter()
        cfg, info, model = self.cfg, self.info, self.model
        try:
            w = seq2seq_weights(model, info.model_type, cfg.max_source_length, cfg.max_target_length)
        except ValueError as exc:
            raise ExportError(f"checkpoint: {exc}") from None
        # --max-length: the default of both lengths (the context cap, export/context_cap.py)
        source = ("--max-source-length", cfg.max_source_length) if cfg.max_source_length is not None \
            else ("--max-length", cfg.max_length)
        target = ("--max-target-length", cfg.max_target_length) if cfg.max_target_length is not None \
            else ("--max-length", cfg.max_length)
        for (name, wanted), have in ((source, w.max_source_length), (target, w.max_target_length)):
            if wanted is not None and wanted > have:
                raise ExportError(f"{name}: {wanted} is past the model's {have} positions")
        if source[1] is not None:
            w.max_source_length = source[1]
        if target[1] is not None:
            w.max_target_length = target[1]
        for (name, _), length in ((source, w.max_source_length), (target, w.max_target_length)):
            if length < MIN_LENGTH:   # the gate's ragged batch needs that much room
                raise ExportError(f"{name}: {length} tokens is below the {MIN_LENGTH} an encoder-decoder package takes")
        seq2seq_graph.write_graphs(w, staging)
        enc_io, dec_io = seq2seq_graph.graph_specs(w)
        graphs = {"fp32": {"encoder": seq2seq_graph.ENCODER_FILE, "decoder": seq2seq_graph.DECODER_FILE}}
        builds = {"fp32": VariantBuild("fp32", seq2seq_graph.DECODER_FILE,
                                       notes=[f"with {seq2seq_graph.ENCODER_FILE}"])}
        self.quantized = [v for v in cfg.variants if v in SEQ2SEQ_QUANTIZED]
        for v in self.quantized:
            try:
                builds[v], graphs[v] = build_variant(v, staging, seq2seq_graph.ENCODER_FILE, seq2seq_graph.DECODER_FILE,
                                                     cfg.weight_quant)
            except (ValueError, RuntimeError, onnx.checker.ValidationError) as exc:
                raise ExportError(f"--variants: {v}: the quantizer failed ({str(exc).splitlines()[0]})") from None
        target = os.environ.get(PERTURB_ENV)
        if target in ("fp32", "encoder"):
            _perturb(staging / (seq2seq_graph.DECODER_FILE if target == "fp32" else seq2seq_graph.ENCODER_FILE))
        elif target in graphs:   # a weight-quantized variant's decoder
            _perturb(staging / graphs[target]["decoder"])
        removed = package_tokenizer(info.path, staging, w.max_source_length)
        target_tokenizer = None
        if (info.path / TARGET_TOKENIZER).is_file():   # separate target vocabulary: decoded with its own tokenizer
            shutil.copyfile(info.path / TARGET_TOKENIZER, staging / TARGET_TOKENIZER)
            target_tokenizer = TARGET_TOKENIZER
        self.tokenizer = Tokenizer.from_file(str(staging / "tokenizer.json"))
        ids, _ = special_tokens(info, self.tokenizer)
        self.spec = _spec(w, model.config, graphs, target_tokenizer, enc_io, self.tokenizer)
        cache = CacheSpec(self.spec.num_layers, self.spec.num_heads, self.spec.head_dim, LAYOUT_INPLACE,
                          model_head_dim=self.spec.model_head_dim, has_layout=True)
        manifest = new_manifest(cfg.name, cfg.task, info, max_length=w.max_source_length, special_tokens=ids,
                                inputs=tensors(dec_io.inputs), outputs=tensors(dec_io.outputs), cache=cache,
                                variants={v: files["decoder"] for v, files in graphs.items()},
                                extra={"quantization": {v: describe(v, cfg.weight_quant) for v in self.quantized}}
                                if self.quantized else None)
        manifest = replace(manifest, vocab_size=w.source_vocab, encoder_decoder=self.spec)
        self.weights = w
        return Built(manifest, builds, removed, time.perf_counter() - t0)

    def gate_inputs(self, staging: Path) -> Seq2SeqGateInputs:
        spec, w = self.spec, self.weights
        stream = [t for text in BUILTIN_TEXTS for t in self.tokenizer.encode(text).ids]
        if not stream:
            raise ExportError("tokenizer: the held-out texts give no source tokens")
        return Seq2SeqGateInputs(
            model=self.model, family=spec.family, num_layers=spec.num_layers, num_heads=spec.num_heads,
            head_dim=w.head_dim, padded_head_dim=spec.head_dim, max_source_length=spec.max_source_length,
            max_target_length=spec.max_target_length, decoder_start=spec.decoder_start_token_id,
            eos=spec.eos_token_id, pad=spec.pad_token_id, target_vocab=spec.target_vocab_size,
            forced_bos=spec.forced_bos_token_id, forced_eos=spec.forced_eos_token_id,
            stream=[t for t in stream if t < spec.source_vocab_size], atol=self.cfg.tolerances.fp32_atol,
            rtol=self.cfg.tolerances.fp32_rtol, threads=self.cfg.threads, checkpoint=self.info.path,
            noise_factor=self.cfg.tolerances.fp32_noise_factor,
            held_out=seq2seq_sources(self.tokenizer, spec.max_source_length))

    def gate(self, built: Built, staging: Path) -> Gated:
        inp = self.gate_inputs(staging)
        passed, results, seconds = run_seq2seq_gate(inp, staging / seq2seq_graph.ENCODER_FILE,
                                                    staging / seq2seq_graph.DECODER_FILE)
        if passed and self.quantized:   # a failed fp32 refuses the whole package: no need to judge its twins
            t0 = time.perf_counter()
            before = torch.get_num_threads()
            torch.set_num_threads(max(1, inp.threads))
            try:
                judge = WeightVariantGate(inp, self.cfg.tolerances)
                for v in self.quantized:
                    results[v] = judge.check(v, staging / self.spec.encoder_file(v), staging / self.spec.decoder_file(v))
            finally:
                torch.set_num_threads(before)
            seconds += time.perf_counter() - t0
        return Gated(passed, results, seconds)

    def failure_text(self, gated: Gated, tok_report, report: dict) -> str:
        return failure_table(gated.results, report["tokenizer"])

    def finish(self, staging: Path, manifest: Manifest, report: dict, gated: Gated) -> Manifest:
        from .model_builder import drop_refused

        manifest = drop_refused(staging, manifest, report, gated.results)
        spec = manifest.encoder_decoder
        assert spec is not None
        kept = {v: files for v, files in spec.graphs.items() if v in manifest.variants}
        for v in set(spec.graphs) - set(kept):    # drop_refused removed its decoder graph; the encoder goes too
            (staging / spec.graphs[v]["encoder"]).unlink(missing_ok=True)
        manifest = replace(manifest, encoder_decoder=replace(spec, graphs=kept))
        seq2seq_speed.record(staging, manifest, report)
        probes.record(staging, manifest, self.tokenizer, report)
        return replace(manifest, default_variant=package.default_variants(dict(manifest.variants), report["variants"]))

    def published(self, result: ExportResult) -> None:
        pass


def validate_seq2seq(pkg: Path, manifest: dict, problems: list[str], threads: int) -> tuple[bool, str]:
    """`python -m export validate` of an encoder-decoder package: tokenizer check and the gate again, against
    the source checkpoint."""
    from .tokenizer_check import check_tokenizer

    m = Manifest.from_dict(manifest)
    spec = m.encoder_decoder
    cfg = ExportConfig(checkpoint=Path(m.source.get("checkpoint", "")), task="generate", repository=pkg.parent.parent,
                       name=m.name, threads=threads, max_source_length=spec.max_source_length,
                       max_target_length=spec.max_target_length)
    builder = Seq2SeqBuilder(cfg)
    if builder.info.weights_sha256 != m.source.get("checkpoint_sha256"):
        problems.append("source checkpoint weights changed since export (sha256 differs)")
    builder.load()
    builder.tokenizer = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    builder.spec = spec
    builder.weights = seq2seq_weights(builder.model, spec.family, spec.max_source_length, spec.max_target_length)
    tok_report = check_tokenizer(builder.info.path, pkg, list(BUILTIN_TEXTS), None, m.max_length, [])
    inp = builder.gate_inputs(pkg)
    passed, results, _ = run_seq2seq_gate(inp, pkg / spec.encoder_file("fp32"), pkg / spec.decoder_file("fp32"))
    quantized = [v for v in spec.graphs if v in SEQ2SEQ_QUANTIZED]
    if quantized:   # the published weight-quantized variants must still pass their own limits
        judge = WeightVariantGate(inp, cfg.tolerances)
        for v in quantized:
            results[v] = judge.check(v, pkg / spec.encoder_file(v), pkg / spec.decoder_file(v))
            passed &= results[v].passed is True
    table = failure_table(results, tok_report.as_json())
    if problems:
        table += "\n" + "\n".join(f"package    {p}" for p in problems)
    return passed and tok_report.passed and not problems, table
