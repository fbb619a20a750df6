"""`python -m pipeline --workdir artifacts --repository model_repository [--server localhost:8001]`"""
from __future__ import annotations

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
