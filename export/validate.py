"""`python -m export validate PACKAGE_DIR`: re-check a published package against its source checkpoint."""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from modelpkg import LAYOUT_CONCAT

from . import package
from .config import ExportConfig
from .errors import ExportError
from .heldout import BUILTIN_TEXTS, default_genre_split, read_eval_data
from .parity import GateInputs, failure_table, refused, run_gate
from .source import inspect_checkpoint, load_torch_model
from .tokenizer_check import check_tokenizer

log = logging.getLogger(__name__)


def read_package(pkg: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    pkg = Path(pkg)
    out = []
    for name in (package.MANIFEST, package.PARITY):
        f = pkg / name
        try:
            out.append(json.loads(f.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ExportError(f"package: {f} is missing (not a model package)") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ExportError(f"package: {f} is not valid JSON ({exc})") from None
    return out[0], out[1]


def hash_mismatches(pkg: Path, parity: dict[str, Any]) -> list[str]:
    recorded = parity.get("files") or {}
    actual = package.file_hashes(pkg)
    bad = [f"{n}: sha256 differs" for n, h in recorded.items() if actual.get(n) != h]
    bad += [f"{n}: not listed in parity.json" for n in actual if n not in recorded]
    return bad


def validate_package(pkg: Path, threads: int = 1, eval_data: Path | None = None) -> tuple[bool, str]:
    """Re-run hashes, tokenizer check and parity gate; returns (passed, human-readable table)."""
    pkg = Path(pkg)
    manifest, parity = read_package(pkg)
    problems = hash_mismatches(pkg, parity)
    src = Path(manifest.get("source", {}).get("checkpoint", ""))
    task = manifest.get("task")
    if task == "embed":  # its own gate (export/embed.py)
        from .embed import validate_embedding

        return validate_embedding(pkg, manifest, problems, threads)
    if manifest.get("encoder_decoder"):   # its own gate (export/seq2seq_parity.py)
        from .seq2seq_builder import validate_seq2seq

        return validate_seq2seq(pkg, manifest, problems, threads)
    if task == "generate" and (manifest.get("cache") or {}).get("layout", LAYOUT_CONCAT) == LAYOUT_CONCAT:
        raise ExportError(f"package: cache.layout 'concat' (the traced decoder graph) is no longer exported, checked "
                          f"or served; re-export the checkpoint: python -m export {src} --task generate")
    cfg = ExportConfig(checkpoint=src, task=task, repository=pkg.parent.parent, name=manifest.get("name", ""),
                       variants=tuple(manifest.get("variants", {})), threads=threads)
    info = inspect_checkpoint(src, task)
    model = load_torch_model(info, task)
    if info.weights_sha256 != manifest["source"].get("checkpoint_sha256"):
        problems.append("source checkpoint weights changed since export (sha256 differs)")
    labelled = None
    if task == "classify":
        labelled = read_eval_data(eval_data, info.labels) if eval_data else default_genre_split(info.labels)
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    tok_report = check_tokenizer(info.path, pkg, list(BUILTIN_TEXTS), manifest.get("mask_token"),
                                 manifest["max_length"], [])
    inp = GateInputs(model=model, task=task, tokenizer=tok, special_tokens=manifest["special_tokens"],
                     max_length=manifest["max_length"], num_layers=info.num_layers, num_heads=info.num_heads,
                     head_dim=info.head_dim, texts=list(BUILTIN_TEXTS), labelled=labelled,
                     tolerances=cfg.tolerances, grid=cfg.grid, threads=threads,
                     num_kv_heads=(manifest.get("cache") or {}).get("num_kv_heads"),
                     token_types="token_type_ids" in [t.get("name") for t in manifest.get("inputs", [])])
    files = {v: pkg / f for v, f in manifest["variants"].items()}
    passed, results, _ = run_gate(inp, files)
    table = failure_table(results, tok_report.as_json())
    if problems:
        table += "\n" + "\n".join(f"package    {p}" for p in problems)
    # A published weight-quantized variant that now breaches its limits fails validation (the export would have
    # refused it).
    return passed and not refused(results) and tok_report.passed and not problems, table

