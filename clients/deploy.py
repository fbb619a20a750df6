"""Moved: the export-and-deploy pipeline is its own package, `python -m pipeline` (same flags).

`python -m clients.deploy` only says so, in one line, and exits 2: the client library never imports the
pipeline (the pipeline is the one that imports the client library, for its channel and configuration).
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

MOVED = "python -m clients.deploy has moved: run `python -m pipeline` with the same flags"


def main(argv: Sequence[str] | None = None) -> int:
    print(f"error: {MOVED}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
