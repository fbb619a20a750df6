"""`python -m bench NAME [options]`: every benchmark through one entry point (bench/harness.py, bench/README.md)."""
from __future__ import annotations

import os

# Two intra-op threads for everyone, numpy's BLAS included: set before anything imports numpy.
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "2")
# Idle OpenMP threads sleep instead of spinning: torch's spinning threads otherwise steal the 2 cores from
# whatever runs next (onnxruntime, numpy) and, on a shared machine, from torch itself (bench/FINDINGS.md).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")  # transformers' weight-loading bars in the log

import sys  # noqa: E402

from .harness import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
