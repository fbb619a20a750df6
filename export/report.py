"""parity.json's body: the gate's figures per variant, the tool versions, the timings."""
from __future__ import annotations

from typing import Any

import onnx
import onnxruntime
import torch

from .config import OPSET


def tool_versions() -> dict[str, str | None]:
    try:
        import transformers
        tv = transformers.__version__
    except ImportError:
        tv = None
    return {"torch": torch.__version__, "onnx": onnx.__version__, "onnxruntime": onnxruntime.__version__,
            "transformers": tv}


def parity_report(passed: bool, results, builds, tok_report, export_s: float, gate_s: float) -> dict[str, Any]:
    out_variants = {}
    for v, r in results.items():
        d = r.as_json()
        b = builds.get(v)
        if b is not None and (b.fused_operators or b.notes):
            d["fused_operators"], d["notes"] = b.fused_operators, b.notes
        out_variants[v] = d
    return {"passed": passed, "tool_versions": tool_versions(), "opset": OPSET, "variants": out_variants,
            "tokenizer": tok_report.as_json(), "timings_s": {"export": round(export_s, 3), "gate": round(gate_s, 3)}}
