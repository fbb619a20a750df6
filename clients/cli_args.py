"""Argument parsing shared by the CLI and the batch script: default models, connection options and value checks."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from .config import Backoff, TLSConfig

DEFAULT_ADDRESS = "localhost:8001"
ADDRESS_ENV = "ORTSERVE_ADDRESS"
TOKEN_ENV = "ORTSERVE_TOKEN"
# The model each task's command uses without --model: the names `python -m pipeline` publishes (its default).
DEFAULT_MODELS = {"classify": "genre", "fill-mask": "fill-mask", "generate": "gpt", "embed": "minilm",
                  "token-classify": "punctuate"}


class OneLineParser(argparse.ArgumentParser):
    """argparse that reports a usage error as one line (and exit code 2), not usage + error."""

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"{self.prog}: error: {message} (see --help)\n")
        raise SystemExit(2)


def _int_at_least(lowest: int, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= {lowest}, got {text!r}") from None
    if value < lowest:
        raise argparse.ArgumentTypeError(f"expected an integer >= {lowest}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(1, text)


def non_negative_int(text: str) -> int:
    return _int_at_least(0, text)


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def positive_float(text: str) -> float:
    value = non_negative_float(text)
    if value == 0:
        raise argparse.ArgumentTypeError("expected a number > 0, got 0")
    return value


def add_connection_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("connection")
    group.add_argument("--address", action="append", metavar="HOST:PORT",
                       help=f"server address; repeat (or separate by commas) for several replicas, which are "
                            f"load-balanced round robin (default: ${ADDRESS_ENV} or {DEFAULT_ADDRESS})")
    group.add_argument("--timeout", type=positive_float, default=None, metavar="SECONDS",
                       help="deadline of each call, retries included (default: none)")
    group.add_argument("--retries", type=non_negative_int, default=3,
                       help="retries of a call answered UNAVAILABLE (default: 3)")
    group.add_argument("--backoff", type=non_negative_float, default=0.1, metavar="SECONDS",
                       help="first wait before a retry; doubles each time, capped at 2 s (default: 0.1)")
    add_security_args(group)


def add_security_args(group: "argparse._ArgumentGroup") -> None:
    """--token and the TLS options (shared by the client CLI, the batch script and the deploy pipeline)."""
    group.add_argument("--token", default=None,
                       help=f"bearer token sent as 'authorization: Bearer ...' (default: ${TOKEN_ENV})")
    group.add_argument("--tls-root-cert", type=Path, default=None, metavar="PEM",
                       help="use TLS, trusting this root certificate")
    group.add_argument("--tls", action="store_true", help="use TLS with the system's root certificates")
    group.add_argument("--tls-server-name", default=None, metavar="NAME",
                       help="name to check the server certificate against")


def addresses(args: argparse.Namespace) -> list[str]:
    given = args.address or [os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS]
    return [a.strip() for item in given for a in item.split(",") if a.strip()]


def security(args: argparse.Namespace) -> tuple[TLSConfig | None, str | None]:
    """(TLS settings, or None for plaintext; bearer token or None) from add_security_args' options."""
    tls = None
    if args.tls or args.tls_root_cert is not None or args.tls_server_name is not None:
        tls = TLSConfig(root_cert=args.tls_root_cert, server_name=args.tls_server_name)
    return tls, args.token or os.environ.get(TOKEN_ENV) or None


def client_kwargs(args: argparse.Namespace) -> dict:
    """Keyword arguments of OrtserveClient / AsyncOrtserveClient from the connection options."""
    tls, token = security(args)
    return dict(timeout=args.timeout, retries=args.retries, backoff=Backoff(initial=args.backoff), tls=tls,
                token=token)
