"""The marks of the tests that need onnxruntime's CUDA provider: they skip, with the reason, on the CPU wheel."""
from __future__ import annotations

import onnxruntime as ort
import pytest

CUDA = "CUDAExecutionProvider"
NEEDS_CUDA = [
    pytest.mark.gpu,
    pytest.mark.skipif(CUDA not in ort.get_available_providers(),
                       reason="this onnxruntime has no CUDAExecutionProvider (CPU build); needs onnxruntime-gpu "
                              "and an NVIDIA GPU"),
]
