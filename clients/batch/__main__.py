"""`python -m clients.batch`: the `ortserve-batch` command line (clients/batch/cli.py)."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
