"""A beam step's log-probabilities, top k per row, in one onnxruntime call: log_softmax(logits) then TopK.

A beam search keeps the 2k best of k x vocabulary candidates each step. In numpy that is a pass for the maximum,
one for exp, one for the sum, more for the log-probabilities and the search's scores, and a partition of the
whole block: a large part of the engine thread on a 58,101-word vocabulary beside the graph's own decode call.
onnxruntime does it on the session's threads, the graph below, in less time (bench/FINDINGS.md).

    max = ReduceMax(logits, axis 1); shifted = logits - max; logprobs = shifted - Log(ReduceSum(Exp(shifted)))
    values, indices = TopK(logprobs, k, axis 1, largest, sorted)   # equal values: the lower index first

The graph is stored serialized (472 bytes, opset 13) because the server does not depend on the onnx package;
tests/unit/test_beam_scores.py builds it with onnx.helper and checks these bytes, and checks the results against numpy.
"""
from __future__ import annotations

import base64

import numpy as np
import onnxruntime as ort

_GRAPH = base64.b64decode(
    "CAgSCG9ydHNlcnZlOsMDCjYKBmxvZ2l0cxIDbWF4IglSZWR1Y2VNYXgqCwoEYXhlc0ABoAEHKg8KCGtlZXBkaW1zGAGgAQIKGwoGbG9naXRz"
    "CgNtYXgSB3NoaWZ0ZWQiA1N1YgoTCgdzaGlmdGVkEgNleHAiA0V4cAouCgNleHAKBGF4aXMSBXRvdGFsIglSZWR1Y2VTdW0qDwoIa2VlcGRp"
    "bXMYAaABAgoXCgV0b3RhbBIJbG9nX3RvdGFsIgNMb2cKIwoHc2hpZnRlZAoJbG9nX3RvdGFsEghsb2dwcm9icyIDU3ViClAKCGxvZ3Byb2Jz"
    "CgFrEgZ2YWx1ZXMSB2luZGljZXMiBFRvcEsqCwoEYXhpcxgBoAECKg4KB2xhcmdlc3QYAaABAioNCgZzb3J0ZWQYAaABAhIRbG9nX3NvZnRt"
    "YXhfdG9wX2sqDQgBEAc6AQFCBGF4aXNaIQoGbG9naXRzEhcKFQgBEhEKBhIEcm93cwoHEgV2b2NhYloPCgFrEgoKCAgHEgQKAggBYh8KBnZh"
    "bHVlcxIVChMIARIPCgYSBHJvd3MKBRIDdG9wYiAKB2luZGljZXMSFQoTCAcSDwoGEgRyb3dzCgUSA3RvcEIECgAQDQ==")


class LogSoftmaxTopK:
    """Per row of [rows, vocab] float32 logits: the n largest log-probabilities and their token ids, best first."""

    def __init__(self, like: ort.InferenceSession | None = None) -> None:
        """like: the engine's decoder session. Its process-wide pool is shared when it has one; otherwise this
        session has as many threads of its own, which sleep between calls: spinning beside the decoder's threads
        they would take the cores its next run needs (server/sessions.py)."""
        options = ort.SessionOptions()
        if like is not None:
            theirs = like.get_session_options()
            options.use_per_session_threads = theirs.use_per_session_threads
            options.intra_op_num_threads = theirs.intra_op_num_threads
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(_GRAPH, options, providers=["CPUExecutionProvider"])

    def __call__(self, logits: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
        """(values [rows, n] float32, token ids [rows, n] int64); n at most the vocabulary."""
        values, indices = self.session.run(None, {"logits": np.ascontiguousarray(logits, dtype=np.float32),
                                                  "k": np.array([n], dtype=np.int64)})
        return values, indices
