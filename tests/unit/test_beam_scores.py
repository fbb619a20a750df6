"""A beam step's top log-probabilities in one onnxruntime call (server/generation/beam_scores.py): the stored graph is
the one onnx.helper builds from its docstring's formula, its answers are numpy's (values, ids, ties to the lower id,
-inf rows of forced tokens), and a beam search stepped with it keeps the hypotheses it keeps with numpy's."""
from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from server.generation import beam_scores
from server.generation.beam_scores import LogSoftmaxTopK
from server.generation.beams import BeamOptions, BeamSearch, numpy_top
from server.generation.scheduler import SeqState
from tests.scheduler_plans import BeamRequest


def test_the_stored_graph_is_log_softmax_then_top_k() -> None:
    nodes = [helper.make_node("ReduceMax", ["logits"], ["max"], axes=[1], keepdims=1),
             helper.make_node("Sub", ["logits", "max"], ["shifted"]),
             helper.make_node("Exp", ["shifted"], ["exp"]),
             helper.make_node("ReduceSum", ["exp", "axis"], ["total"], keepdims=1),
             helper.make_node("Log", ["total"], ["log_total"]),
             helper.make_node("Sub", ["shifted", "log_total"], ["logprobs"]),
             helper.make_node("TopK", ["logprobs", "k"], ["values", "indices"], axis=1, largest=1, sorted=1)]
    graph = helper.make_graph(
        nodes, "log_softmax_top_k",
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["rows", "vocab"]),
         helper.make_tensor_value_info("k", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("values", TensorProto.FLOAT, ["rows", "top"]),
         helper.make_tensor_value_info("indices", TensorProto.INT64, ["rows", "top"])],
        initializer=[helper.make_tensor("axis", TensorProto.INT64, [1], [1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="ortserve")
    model.ir_version = 8
    onnx.checker.check_model(model)
    assert model.SerializeToString() == beam_scores._GRAPH


def test_values_and_ids_are_numpys_with_ties_to_the_lower_id() -> None:
    top = LogSoftmaxTopK()
    rng = np.random.default_rng(0)
    # Values 0.01 apart (the two computations round differently in the last bits: near-ties could swap), integer
    # logits (ties everywhere: equal logits give equal log-probs in both), and rows of one forced token.
    cases = [np.stack([rng.permutation(1000) for _ in range(4)]).astype(np.float32) * 0.01,
             rng.integers(-3, 3, (5, 40)).astype(np.float32),
             np.tile(np.where(np.arange(30) == 7, 0.0, -np.inf).astype(np.float32), (3, 1))]   # a forced token
    for logits in cases:
        for n in (1, 8, logits.shape[1]):
            values, ids = top(logits, n)
            want_values, want_ids = numpy_top(logits, n)
            assert ids.dtype == np.int64 and np.array_equal(ids, want_ids)
            np.testing.assert_allclose(values, want_values, atol=1e-5)


def _search(eos: int | None) -> BeamSearch:
    search = BeamSearch([BeamRequest()], BeamOptions(num_beams=4, length_penalty=1.0, early_stopping=False,
                                                  max_new_tokens=10, eos_id=eos, forced={0: 3}), 500, tokenizer=None)
    for beam in search.beams:
        beam.state = SeqState(1, slot=beam.index)
    return search


def test_a_search_stepped_with_the_graph_keeps_what_numpy_keeps() -> None:
    top = LogSoftmaxTopK()
    rng = np.random.default_rng(1)
    for trial in range(5):
        a, b = _search(eos=2), _search(eos=2)
        for step in range(10):
            rows = {i: rng.standard_normal(500).astype(np.float32) * 3 for i in range(4)}
            copies_a = a.step(rows, step + 1, top)
            copies_b = b.step(rows, step + 1, numpy_top)
            assert copies_a == copies_b and a.tokens == b.tokens and np.array_equal(a.order, b.order)
            np.testing.assert_allclose(a.scores, b.scores, atol=1e-4)
            if a.stopped or b.stopped:
                assert a.stopped and b.stopped
                break
        assert a.finished_tokens == b.finished_tokens


def test_a_penalty_whose_power_leaves_the_floats_still_ranks_every_step() -> None:
    """length ** penalty past float range: Python's power raises OverflowError (the search used to fail with it);
    here a finished score is -0.0 (the power overflows) or -inf (it underflows) and the search goes on to its end,
    also past a forced step (-inf for every other token: -inf / inf must not become NaN)."""
    rng = np.random.default_rng(2)
    for penalty in (1000.0, 1e300, 3.4e38, -1e300):
        search = BeamSearch([BeamRequest()], BeamOptions(num_beams=4, length_penalty=penalty, early_stopping="never",
                                                      max_new_tokens=10, eos_id=2, forced={0: 3, 5: 4}), 50,
                            tokenizer=None)
        for beam in search.beams:
            beam.state = SeqState(1, slot=beam.index)
        for step in range(10):
            if search.stopped:
                break
            search.step({i: rng.standard_normal(50).astype(np.float32) * 3 for i in range(4)}, step + 1, numpy_top)
        assert search.stopped
        finished = search.finished_scores[search.finished_flags]
        assert np.all((finished == 0.0) | np.isneginf(finished)), (penalty, finished)
        # An overflowing power ranks every finished one at -0.0; at -inf none beats "not a candidate" and the
        # answers are the running hypotheses (BeamSearch.finish).
        assert finished.size if penalty > 0 else finished.size == 0, (penalty, finished)
