"""Soak run: start a server (or use a running one), load it with N clients for T seconds, judge the result.

    python scripts/soak.py --clients 64 --seconds 60                 # the tiny test models, built once
    python scripts/soak.py --repository model_repository --clients 16 --seconds 20 --json soak.json
    python scripts/soak.py --address 127.0.0.1:8001 --server-pid 1234  # a server started elsewhere

It passes (exit 0) when no request failed, the server's RSS grew by at most --max-rss-growth between
the end of the warm-up (--warmup-seconds into the run) and the end of the run, and, when this script
started the server, the server drained and exited 0 on SIGTERM. Exit 1 on a failed run, 2 on bad
arguments. Load is generated on loopback only (testing/loadgen.py).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python scripts/soak.py` puts scripts/ first, not the project
    sys.path.insert(0, str(ROOT))

from testing.launch import ServerProcess, ServerStartError  # noqa: E402
from testing.loadgen import KINDS, LoadConfig, LoadConfigError, LoadReport, format_report, run_load  # noqa: E402

log = logging.getLogger("ortserve.soak")
PROG = "soak.py"


class SoakError(RuntimeError):
    """The soak could not run (the server did not start, ...): one readable line."""


@dataclass(frozen=True)
class SoakConfig:
    load: LoadConfig
    repository: Path | None = None          # start a server on it (None with address = use a running one)
    server_pid: int | None = None           # for RSS of a server started elsewhere
    server_args: tuple[str, ...] = ()
    max_rss_growth: float = 0.10
    rss_baseline: str = "warm"              # growth measured from "warm" (after warm-up) or "start"
    json_out: Path | None = None
    startup_timeout: float = 120.0
    stop_timeout: float = 60.0


# ---------------------------------------------------------------------------- the server under test


def start_server(repository: Path, extra: Sequence[str], timeout: float) -> ServerProcess:
    """`python -m server` on a free loopback port (testing/launch.py), SERVING, or SoakError."""
    try:
        return ServerProcess(repository, ["--host", "127.0.0.1", *extra], startup_timeout=timeout)
    except ServerStartError as e:
        raise SoakError(str(e)) from None


# ---------------------------------------------------------------------------- the tiny default models


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "ortserve" / "soak"


def tiny_repository() -> Path:
    """The tests' tiny classifier / fill-mask / GPT repository, built once (needs the [train,export] extras).

    The same builders as tests/conftest.py, so the soak and the CI load test exercise the same models.
    Built in a temporary directory and renamed into place: an interrupted build leaves nothing behind.
    """
    target = cache_dir() / "tiny-repository"
    if target.is_dir():
        return target
    from tests import conftest  # tests/conftest.py: plain functions besides the pytest fixtures

    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("building the tiny test models into %s (once)", target)
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.WARNING)  # the exporter's quantizer logs every tensor at INFO on the root logger
    try:
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            with conftest.one_torch_thread():
                checkpoints = conftest._build_tiny_checkpoints(Path(work) / "checkpoints")
                conftest._build_tiny_repository(checkpoints, Path(work) / "repository")
            os.rename(Path(work) / "repository", target)
    finally:
        root.setLevel(level)
    return target


# ---------------------------------------------------------------------------- the run


@dataclass
class Verdict:
    passed: bool
    reasons: list[str]


def judge(report: LoadReport, config: SoakConfig, exit_code: int | None) -> Verdict:
    reasons = []
    if report.error_count:
        reasons.append(f"{report.error_count} failed request(s): {report.errors}")
    if report.ok == 0:
        reasons.append("no request succeeded")
    growth = report.rss_growth(config.rss_baseline)
    if growth is not None and growth > config.max_rss_growth:
        reasons.append(f"server RSS grew {growth * 100:.1f}% from {config.rss_baseline} "
                       f"(limit {config.max_rss_growth * 100:.0f}%)")
    if exit_code not in (None, 0):
        reasons.append(f"the server exited {exit_code} on SIGTERM (expected 0)")
    return Verdict(not reasons, reasons)


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=2)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def soak(config: SoakConfig) -> tuple[LoadReport, Verdict, int | None]:
    server: ServerProcess | None = None
    load = config.load
    pid = config.server_pid
    if config.repository is not None:
        server = start_server(config.repository, config.server_args, config.startup_timeout)
        load = dataclasses.replace(load, address=server.address).validate()
        pid = server.pid
        log.info("server pid %d on %s", pid, server.address)
    exit_code: int | None = None
    try:
        report = asyncio.run(run_load(load, server_pid=pid))
    finally:
        if server is not None:
            exit_code = server.stop(config.stop_timeout)
    verdict = judge(report, config, exit_code)
    if server is not None and exit_code != 0:
        log.error("server output (last lines):\n%s", server.output(200))
    return report, verdict, exit_code


# ---------------------------------------------------------------------------- command line


def _fail(message: str) -> NoReturn:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class _OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        _fail(message)


def build_parser() -> argparse.ArgumentParser:
    p = _OneLineErrors(prog=PROG, description="Bounded soak run against an ortserve server on loopback.")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--repository", type=Path,
                       help="start a server on this model repository (default: the tiny test models, built once)")
    where.add_argument("--address", help="use a running server at HOST:PORT (loopback)")
    p.add_argument("--server-pid", type=int, help="with --address: the server's pid, for its RSS")
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-requests", type=int, default=1_000_000, help="stop after this many requests in all")
    p.add_argument("--mix", default=",".join(KINDS), help=f"comma-separated kinds among {', '.join(KINDS)}")
    p.add_argument("--model", action="append", default=[], metavar="KIND=NAME",
                   help="model for a kind (default: the first SERVING model of its task); repeatable")
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--inputs-per-request", type=int, default=1)
    p.add_argument("--request-timeout", type=float, default=30.0)
    p.add_argument("--warmup-seconds", type=float, default=None,
                   help="the RSS this far into the run is reported as 'warm' (default: a sixth of --seconds)")
    p.add_argument("--max-rss-growth", type=float, default=0.10, help="fraction (default 0.10)")
    p.add_argument("--rss-baseline", choices=("start", "warm"), default="warm",
                   help="measure RSS growth from the warm sample (default: the first seconds fill onnxruntime "
                        "arenas and gRPC buffers once) or from the start of the load")
    p.add_argument("--token", default=os.environ.get("ORTSERVE_AUTH_TOKEN"),
                   help="bearer token (default: $ORTSERVE_AUTH_TOKEN)")
    p.add_argument("--server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for the started server, e.g. --server-arg=--max-sequences=32")
    p.add_argument("--json", type=Path, help="write the full report here (JSON)")
    p.add_argument("--seed", type=int, default=0)
    return p


def config_from_args(argv: Sequence[str] | None) -> SoakConfig:
    args = build_parser().parse_args(argv)
    models = {}
    for item in args.model:
        kind, sep, name = item.partition("=")
        if not sep or not name:
            raise LoadConfigError(f"--model: expected KIND=NAME, got {item!r}")
        models[kind] = name
    if args.repository is not None and not args.repository.is_dir():
        raise LoadConfigError(f"--repository: {args.repository} is not a directory")
    if args.server_pid is not None and args.address is None:
        raise LoadConfigError("--server-pid: only with --address")
    if args.server_arg and args.address is not None:
        raise LoadConfigError("--server-arg: only when this script starts the server")
    if not args.max_rss_growth >= 0:
        raise LoadConfigError(f"--max-rss-growth: must be >= 0, got {args.max_rss_growth}")
    warmup = args.seconds / 6 if args.warmup_seconds is None else args.warmup_seconds
    load = LoadConfig(address=args.address or "127.0.0.1:0", clients=args.clients, seconds=args.seconds,
                      max_requests=args.max_requests, mix=tuple(k for k in args.mix.split(",") if k),
                      models=models, request_timeout=args.request_timeout, max_new_tokens=args.max_new_tokens,
                      inputs_per_request=args.inputs_per_request, warmup_seconds=warmup, token=args.token,
                      seed=args.seed).validate()
    repository = args.repository
    if repository is None and args.address is None:
        repository = tiny_repository()
    return SoakConfig(load=load, repository=repository, server_pid=args.server_pid,
                      server_args=tuple(args.server_arg), max_rss_growth=args.max_rss_growth,
                      rss_baseline=args.rss_baseline, json_out=args.json)


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        config = config_from_args(argv)
    except LoadConfigError as exc:
        _fail(str(exc))
    try:
        report, verdict, exit_code = soak(config)
    except (SoakError, LoadConfigError) as exc:
        print(f"{PROG}: {exc}", file=sys.stderr)
        return 1
    print(format_report(report))
    if exit_code is not None:
        print(f"server exit code on SIGTERM: {exit_code}")
    print("PASS" if verdict.passed else "FAIL: " + "; ".join(verdict.reasons))
    if config.json_out is not None:
        write_json_atomic(config.json_out, {**report.to_json(), "server_exit_code": exit_code,
                                            "max_rss_growth": config.max_rss_growth,
                                            "rss_baseline": config.rss_baseline,
                                            "passed": verdict.passed, "reasons": verdict.reasons})
    return 0 if verdict.passed else 1


if __name__ == "__main__":
    sys.exit(main())
