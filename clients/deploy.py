"""Moved: the export-and-deploy pipeline is the `pipeline` package (`python -m pipeline`).

`python -m clients.deploy ...` still works and runs it with the same flags.
"""
from __future__ import annotations

import sys

from pipeline import Pipeline, PipelineConfig, PipelineError
from pipeline.cli import main as _main, parse_args

__all__ = ["Pipeline", "PipelineConfig", "PipelineError", "main", "parse_args"]


def main(argv: list[str] | None = None) -> int:
    return _main(argv, prog="python -m clients.deploy")


if __name__ == "__main__":
    sys.exit(main())
