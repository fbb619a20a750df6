"""A beam step's log-probabilities, top k per row, in one onnxruntime call: log_softmax(logits) then TopK.

A beam search keeps the 2k best of k x vocabulary candidates each step. In numpy that is a pass for the maximum,
one for exp, one for the sum, more for the log-probabilities and the search's scores, and a partition of the
whole block: a large part of the engine thread on a 58,101-word vocabulary beside the graph's own decode call.
onnxruntime does it on the session's threads, the graph below, in less time (bench/FINDINGS.md).

    max = ReduceMax(logits, axis 1); shifted = logits - max; logprobs = shifted - Log(ReduceSum(Exp(shifted)))
    values, indices = TopK(logprobs, k, axis 1, largest, sorted)   # equal values: the lower index first

The graph is stored serialized (472 bytes, opset 13) because the server does not depend on the onnx package;
tests/unit/test_beam_scores.py builds it with onnx.helper and checks these bytes, and checks the results against numpy.
`score_rows` runs it (or numpy's `numpy_top`) over a step's beam rows, as few calls as the rows' size allows.
"""
from __future__ import annotations

import base64
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime as ort

if TYPE_CHECKING:
    from .strategies import StepRow, TopLogprobs

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


# Floats of logits per call of the beam scores' graph (beam_scores.py): a block this size stays in a core's cache
# where a larger one does not (bench/FINDINGS.md has the sizes tried: 4 rows of a 58,101-word vocabulary), and a
# small vocabulary's rows all go in one call instead of one per few rows.
SCORE_FLOATS = 1 << 18

def score_rows(rows: list[StepRow], top: TopLogprobs, vocab: int, keep: int) -> tuple[np.ndarray, np.ndarray]:
    """The rows' `keep` best log-probabilities and ids ([rows, keep] each, in the rows' order), in calls of about
    SCORE_FLOATS logits, each a slice of one block where the rows are consecutive in it (bench/FINDINGS.md)."""
    values = np.empty((len(rows), keep), np.float32)
    ids = np.empty((len(rows), keep), np.int64)
    per_call = max(1, SCORE_FLOATS // vocab)
    blocks: dict[int, tuple[np.ndarray, list[int]]] = {}
    for i, row in enumerate(rows):
        blocks.setdefault(id(row.block), (row.block, []))[1].append(i)
    for block, where in blocks.values():
        positions = np.asarray(where)
        index = np.fromiter((rows[i].index for i in where), np.int64, len(where))
        by_index = np.argsort(index, kind="stable")
        positions, index = positions[by_index], index[by_index]
        for lo in range(0, len(index), per_call):
            part, at = index[lo:lo + per_call], positions[lo:lo + per_call]
            if part[-1] - part[0] == len(part) - 1:          # consecutive rows: a view, no copy
                values[at], ids[at] = top(block[part[0]:part[-1] + 1, :vocab], keep)
            else:
                values[at], ids[at] = top(block[part, :vocab], keep)
    return values, ids


def numpy_top(logits: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the n largest log-softmax values and their ids, best first, ties to the lower id (beam_scores'
    graph does the same in one onnxruntime call)."""
    x = logits.astype(np.float32)
    shifted = x - x.max(axis=1, keepdims=True)
    logp = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    ids = np.argsort(-logp, axis=1, kind="stable")[:, :n]
    return np.take_along_axis(logp, ids, axis=1), ids
