"""The one entry point of the benchmarks: `python -m bench NAME [options]`.

Each benchmark is a module of bench/ that declares itself at its end:

    BENCHMARK = Benchmark(summary="...", sides=("ortserve", "vllm"), pieces=("step", "streams"),
                          options=options, run=run)

`options(parser)` adds its own options; `run(args)` runs it and returns the exit status (None = 0). The harness
adds `args.invocation` (the command line, as the result files record it). NAMES lists them; `python -m bench`
alone prints the list.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import shlex
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("bench")

# name -> module of bench/ (python -m bench NAME); `report` regenerates the suite's report from its result files.
NAMES = ("suite", "report", "generation", "http", "llamacpp", "quantized", "seq2seq", "embeddings", "ray_proxy",
         "token_classify", "stream_ab", "engine_ab", "gpu_slots", "skip_norm", "g2p_variants", "lm_eval_check",
         "int8_formats", "batch_rows")
NAMES += ("modernbert_fusion", "classify_pipeline")
NAMES += ("structured", "loop_apply", "base_variants", "s2s_ab")
_MODULE = {"report": "suite"}
_ATTRIBUTE = {"report": "REPORT"}


@dataclass(frozen=True)
class Benchmark:
    """What a benchmark module declares: what it compares (sides: ortserve and the peers; pieces: the parts it
    can run alone) and its command line."""

    summary: str
    sides: tuple[str, ...]
    options: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int | None]
    pieces: tuple[str, ...] = ()


def load(name: str) -> Benchmark:
    name = name.replace("-", "_")
    if name not in NAMES:
        raise KeyError(name)
    module = importlib.import_module(f"bench.{_MODULE.get(name, name)}")
    return getattr(module, _ATTRIBUTE.get(name, "BENCHMARK"))


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # one line, exit 2
        print(f"error: {message}", file=sys.stderr)
        sys.exit(2)


def parser(name: str, bench: Benchmark) -> argparse.ArgumentParser:
    epilog = "; ".join(part for part in (f"sides: {', '.join(bench.sides)}" if bench.sides else "",
                                         f"pieces: {', '.join(bench.pieces)}" if bench.pieces else "") if part)
    p = _Parser(prog=f"python -m bench {name}", description=bench.summary.strip().split("\n\n")[0],
                epilog=epilog or None, formatter_class=argparse.RawDescriptionHelpFormatter)
    bench.options(p)
    return p


def usage() -> str:
    return "usage: python -m bench NAME [options]   (python -m bench NAME --help)\nbenchmarks: " + ", ".join(NAMES)


def _exit_on_sigterm(signum: int, frame: object) -> None:
    # SystemExit unwinds the finally blocks that stop the server processes and remove the work directories.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(usage(), file=sys.stderr if not argv else sys.stdout)
        return 2 if not argv else 0
    name, rest = argv[0], argv[1:]
    try:
        bench = load(name)
    except KeyError:
        print(f"error: unknown benchmark {name!r} (choose from {', '.join(NAMES)})", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    args = parser(name, bench).parse_args(rest)
    args.invocation = " ".join(["python -m bench", name, *map(shlex.quote, rest)])
    verbose = bool(getattr(args, "verbose", False))
    # Other libraries (onnxruntime's quantizer logs per tensor on the root logger) stay at WARNING.
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S")
    for ours in ("bench", "testing"):
        logging.getLogger(ours).setLevel(logging.DEBUG if verbose else logging.INFO)
    status = bench.run(args)
    return 0 if status is None else int(status)
