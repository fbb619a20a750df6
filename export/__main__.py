"""`python -m export CHECKPOINT --task ... --repository DIR --name NAME` and `python -m export validate PKG`."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from .config import TASKS, ExportConfig
from .errors import ExportError, ParityFailure

log = logging.getLogger("export")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2 (argparse would print the usage block too)
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def _export_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m export", description="Export a checkpoint directory to a parity-checked ONNX "
                "model package (or: python -m export validate PACKAGE_DIR).")
    p.add_argument("checkpoint", type=Path)
    p.add_argument("--task", required=True, choices=TASKS)
    p.add_argument("--repository", required=True, type=Path)
    p.add_argument("--name", required=True)
    p.add_argument("--version", type=int, default=None, help="default: highest existing + 1")
    p.add_argument("--variants", default="fp32",
                   help="comma list of fp32,optimized,int8,fp16 (fp32 always); for an in-place decoder: kv8 (int8 KV "
                        "cache), w8 / w4 (8- / 4-bit weights, MatMulNBits), w8kv8 / w4kv8 (both); for an "
                        "encoder-decoder: w8 / w4 (both graphs)")
    p.add_argument("--eval-data", type=Path, default=None, help="labelled JSONL (text, label) for the int8 accuracy rule")
    p.add_argument("--threads", type=int, default=1, help="onnxruntime threads for the parity gate")
    p.add_argument("--pooling", default="auto", choices=("auto", "mean", "cls"),
                   help="embed: auto = the checkpoint's sentence-transformers config (else mean)")
    p.add_argument("--normalize", default="auto", choices=("auto", "on", "off"),
                   help="embed: L2-normalize the vectors; auto = as the sentence-transformers config says")
    p.add_argument("--matryoshka", action="store_true",
                   help="embed: declare the model Matryoshka-trained (its vectors' leading values make a shorter "
                        "embedding): the server then answers `dimensions` below the full size")
    p.add_argument("--max-source-length", type=int, default=None,
                   help="encoder-decoder: longest source in tokens (default: the position table; T5 512)")
    p.add_argument("--max-target-length", type=int, default=None,
                   help="encoder-decoder: self-cache length in tokens (default: the position table; T5 512)")
    p.add_argument("--max-length", type=int, default=None,
                   help="the package's context in tokens: cache length, position tables and model.json max_length "
                        "(at most the model's positions, the default); encoder-decoder: the default of both "
                        "lengths above")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _validate_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m export validate", description="Re-check a published package.")
    p.add_argument("package", type=Path)
    p.add_argument("--eval-data", type=Path, default=None, help="labelled JSONL for the int8 accuracy rule")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    validate = bool(argv) and argv[0] == "validate"
    args = (_validate_parser() if validate else _export_parser()).parse_args(argv[1:] if validate else argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        if validate:
            from .validate import validate_package

            passed, table = validate_package(args.package, threads=args.threads, eval_data=args.eval_data)
            print(table)
            print(f"{args.package}: {'parity OK' if passed else 'parity FAILED'}")
            return 0 if passed else 1
        from .pipeline import export_checkpoint


        variants = tuple(dict.fromkeys(v.strip() for v in ["fp32", *args.variants.split(",")] if v.strip()))
        cfg = ExportConfig(checkpoint=args.checkpoint, task=args.task, repository=args.repository, name=args.name,
                           version=args.version, variants=variants, eval_data=args.eval_data, threads=args.threads,
                           pooling=args.pooling, normalize=args.normalize,
                           matryoshka=args.matryoshka,
                           max_source_length=args.max_source_length, max_target_length=args.max_target_length,
                           max_length=args.max_length)
        result = export_checkpoint(cfg)
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except ParityFailure as exc:
        print(str(exc), file=sys.stderr)
        return 1
    except OSError as exc:  # disk full, a path whose parent is a file, ...: one line (staging is cleaned up)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(f"published {result.package_dir} (version {result.version})")
    for v, r in result.parity["variants"].items():
        diffs = ", ".join(f"{k} {d:.2e}" for k, d in r.get("max_abs_diff", {}).items())
        fused = f" fused {r['fused_operators']}" if r.get("fused_operators") else ""
        print(f"  {v:<10} {r['status']:<18} {diffs}{fused}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
