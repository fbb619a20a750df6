"""The ortserve suite: `python -m bench suite --out bench/results [--only encoder,decoder,server,peer] [--quick]`.

Runs the pieces one after the other (each writes `<out>/<piece>.json`), then regenerates the Markdown report and
the plots from every result file in `<out>`. `python -m bench report --out DIR` only regenerates the report.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .config import PIECES
from .harness import Benchmark

ROOT = Path(__file__).resolve().parents[1]


def common_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="result JSON directory")
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "BENCHMARKS.md",
                   help="Markdown report to regenerate ('-' = none)")
    p.add_argument("--plots", type=Path, default=ROOT / "docs" / "bench", help="PNG directory")
    p.add_argument("-v", "--verbose", action="store_true")


def options(p: argparse.ArgumentParser) -> None:
    common_options(p)
    p.add_argument("--only", default=",".join(PIECES), help=f"comma list of {','.join(PIECES)}")
    p.add_argument("--quick", action="store_true", help="short runs (development; noisy)")
    p.add_argument("--classifier", type=Path, default=None,
                   help="trained classifier checkpoint (default: artifacts/checkpoints/classifier if present)")
    p.add_argument("--lm", type=Path, default=None,
                   help="trained GPT checkpoint (default: artifacts/checkpoints/lm if present)")


def parse_only(text: str) -> tuple[str, ...]:
    pieces = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in pieces if p not in PIECES]
    if unknown or not pieces:
        raise ValueError(f"--only: unknown piece {unknown[0]!r} (choose from {', '.join(PIECES)})" if unknown
                         else "--only: names no piece")
    return pieces


def _config(args: argparse.Namespace, only: tuple[str, ...] = PIECES, quick: bool = False):
    from .config import Sources, SuiteConfig

    defaults = Sources()
    sources = Sources(classifier=getattr(args, "classifier", None) or defaults.classifier,
                      lm=getattr(args, "lm", None) or defaults.lm)
    docs = None if str(args.docs) == "-" else args.docs
    return SuiteConfig.build(out=args.out, only=only, quick=quick, docs=docs, plots=args.plots, sources=sources)


def _bad_out(out: Path) -> bool:
    if out.exists() and not out.is_dir():
        print(f"error: --out: {out} is not a directory", file=sys.stderr)
        return True
    return False


def run(args: argparse.Namespace) -> int:
    try:
        only = parse_only(args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if _bad_out(args.out):
        return 2
    for flag, path in (("--classifier", args.classifier), ("--lm", args.lm)):
        if path is not None and not (path / "config.json").is_file():
            print(f"error: {flag}: {path} is not a checkpoint directory (no config.json)", file=sys.stderr)
            return 2
    from .runner import run_suite

    failed = run_suite(_config(args, only, args.quick), args.invocation)
    for piece, err in failed.items():
        print(f"{piece}: FAILED: {err}", file=sys.stderr)
    return 1 if failed else 0


def report(args: argparse.Namespace) -> int:
    if _bad_out(args.out):
        return 2
    from .runner import write_report

    if not write_report(_config(args)):
        print(f"error: --out: no result files in {args.out}", file=sys.stderr)
        return 2
    return 0


BENCHMARK = Benchmark(summary=__doc__, sides=("ortserve", "mlserver"), pieces=PIECES, options=options, run=run)
REPORT = Benchmark(summary="Regenerate the suite's report (docs/BENCHMARKS.md, docs/bench/*.png) from the result "
                           "files in --out.", sides=(), options=common_options, run=report)
