"""`python -m bench --out bench/results [--only encoder,decoder,server,peer] [--quick]`

Runs the pieces one after the other (each writes `<out>/<piece>.json`), then regenerates the Markdown
report and the plots from every result file in `<out>`. `python -m bench report --out DIR` only
regenerates the report.
"""
from __future__ import annotations

import os

# Two intra-op threads for everyone, numpy's BLAS included: set before anything imports numpy.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
# Idle OpenMP threads sleep instead of spinning: torch's spinning threads otherwise steal the 2 cores from
# whatever runs next (onnxruntime, numpy) and, on a shared machine, from torch itself (bench/FINDINGS.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bars in the log

import argparse  # noqa: E402
import logging  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

from .config import PIECES  # noqa: E402

log = logging.getLogger("bench")

ROOT = Path(__file__).resolve().parents[1]


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="python -m bench", description="Run the ortserve benchmark suite and write the report.")
    p.add_argument("command", nargs="?", default="run", choices=("run", "report"),
                   help="run (default): measure, then report; report: regenerate the report from --out")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "results", help="result JSON directory")
    p.add_argument("--only", default=",".join(PIECES), help=f"comma list of {','.join(PIECES)}")
    p.add_argument("--quick", action="store_true", help="short runs (development; noisy)")
    p.add_argument("--docs", type=Path, default=ROOT / "docs" / "BENCHMARKS.md",
                   help="Markdown report to regenerate ('-' = none)")
    p.add_argument("--plots", type=Path, default=ROOT / "docs" / "bench", help="PNG directory")
    p.add_argument("--classifier", type=Path, default=None,
                   help="trained classifier checkpoint (default: artifacts/checkpoints/classifier if present)")
    p.add_argument("--lm", type=Path, default=None,
                   help="trained GPT checkpoint (default: artifacts/checkpoints/lm if present)")
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def parse_only(text: str) -> tuple[str, ...]:
    pieces = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in pieces if p not in PIECES]
    if unknown or not pieces:
        raise ValueError(f"--only: unknown piece {unknown[0]!r} (choose from {', '.join(PIECES)})" if unknown
                         else "--only: names no piece")
    return pieces


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds the finally blocks that stop the server processes and remove the work directory.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = build_parser().parse_args(argv)
    # Other libraries (onnxruntime's quantizer logs per tensor on the root logger) stay at WARNING.
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("bench").setLevel(logging.DEBUG if args.verbose else logging.INFO)
    try:
        only = parse_only(args.only)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.out.exists() and not args.out.is_dir():
        print(f"error: --out: {args.out} is not a directory", file=sys.stderr)
        return 2
    from .config import Sources, SuiteConfig
    from .runner import run_suite, write_report

    for flag, path in (("--classifier", args.classifier), ("--lm", args.lm)):
        if path is not None and not (path / "config.json").is_file():
            print(f"error: {flag}: {path} is not a checkpoint directory (no config.json)", file=sys.stderr)
            return 2
    defaults = Sources()
    sources = Sources(classifier=args.classifier or defaults.classifier, lm=args.lm or defaults.lm)
    docs = None if str(args.docs) == "-" else args.docs
    cfg = SuiteConfig.build(out=args.out, only=only, quick=args.quick, docs=docs, plots=args.plots, sources=sources)
    if args.command == "report":
        written = write_report(cfg)
        if not written:
            print(f"error: --out: no result files in {args.out}", file=sys.stderr)
            return 2
        return 0
    failed = run_suite(cfg, argv_for_report(argv))
    for piece, err in failed.items():
        print(f"{piece}: FAILED: {err}", file=sys.stderr)
    return 1 if failed else 0


def argv_for_report(argv: list[str] | None) -> str:
    args = sys.argv[1:] if argv is None else argv
    return " ".join(["python", "-m", "bench", *args])


if __name__ == "__main__":
    sys.exit(main())
