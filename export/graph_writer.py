"""The node writer every hand-written graph uses (export/decoder_graph.py, export/seq2seq_graph.py): names nodes in
the order they are written and collects initializers."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

MS = "com.microsoft"   # onnxruntime's contrib-op domain


class GraphWriter:
    """Tiny helper that names nodes and collects initializers."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, arr: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(arr), name))
        return name

    def op(self, op_type: str, inputs: list[str], n_out: int = 1, domain: str = "", name: str | None = None,
           outputs: list[str] | None = None, **attrs) -> list[str]:
        self._n += 1
        base = name or f"{op_type}_{self._n}"
        outs = outputs or [f"{base}_out{i}" for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=base, domain=domain, **attrs))
        return outs

    def one(self, op_type: str, inputs: list[str], **kw) -> str:
        return self.op(op_type, inputs, **kw)[0]
