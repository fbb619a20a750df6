"""The encoder step's split of admitted sources into calls by length (server/generation/encoder_step.py): the cost
model's choice of calls, and the cross buffers written by split calls equal those of one padded call (a random
Marian package exported by the exporter, real onnxruntime sessions)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from modelpkg import Manifest
from server.generation.cross_runner import CrossSlotRunner
from server.generation.encoder_step import EncoderCost, EncodeRow
from server.generation.seq2seq_spec import seq2seq_specs
from server.generation.slot_runner import DecodeRow


def test_rows_go_in_the_calls_that_cost_least_longest_first() -> None:
    lengths = [5, 20, 19, 6, 18]                      # sorted longest first: indices 1, 2, 4, 3, 0
    # Calls cost nothing: no row is padded (each alone, or with rows of its own length).
    assert EncoderCost(call=0.0, token=1.0).groups(lengths) == [[1], [2], [4], [3], [0]]
    # A call costs more than any padding saved: one call.
    assert EncoderCost(call=100.0, token=1.0).groups(lengths) == [[1, 2, 4, 3, 0]]
    # In between: 10 + 3 x 20 + 10 + 2 x 6 = 92 beats one call (10 + 5 x 20 = 110) and three (100).
    assert EncoderCost(call=10.0, token=1.0).groups(lengths) == [[1, 2, 4], [3, 0]]
    assert EncoderCost(call=1.0, token=1.0).groups([7]) == [[0]]


@pytest.fixture(scope="module")
def parts(tmp_path_factory: pytest.TempPathFactory) -> tuple:
    pytest.importorskip("torch")
    from testing.seq2seq_checkpoints import export_repository

    package: Path = export_repository(tmp_path_factory.mktemp("encoder-step"), ("marian",))["marian"]
    manifest = Manifest.from_json((package / "model.json").read_text())
    block = manifest.encoder_decoder
    assert block is not None
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    cpu = ["CPUExecutionProvider"]      # (the CUDA path of the buffers: test_device_cache.py, test_server_gpu.py)
    decoder = ort.InferenceSession(str(package / block.decoder_file("fp32")), options, providers=cpu)
    encoder = ort.InferenceSession(str(package / block.encoder_file("fp32")), options, providers=cpu)
    spec, source = seq2seq_specs(manifest, decoder, encoder)
    return decoder, spec, source, encoder, package


@pytest.fixture(scope="module")
def runner(parts: tuple) -> CrossSlotRunner:
    decoder, spec, source, encoder, _ = parts
    return CrossSlotRunner(decoder, spec, source, 10, encoder, cross_length=source.max_length)


def _cross(runner: CrossSlotRunner, slots: list[int]) -> dict[str, np.ndarray]:
    return {name: runner.cross.host_copy(name)[slots] for name in runner.source.cross_names}


def test_sources_split_into_calls_write_what_one_padded_call_writes(runner: CrossSlotRunner) -> None:
    rng = np.random.default_rng(0)
    top = runner.source.vocab_size - 1
    sources = [list(rng.integers(4, top, n)) for n in (3, 17, 5, 16, 4)]
    runner.encoder.cost = None                       # one call, padded to 17, into slots 0-4
    runner.encode([EncodeRow(s, (slot,)) for slot, s in enumerate(sources)])
    whole = _cross(runner, [0, 1, 2, 3, 4])
    runner.encoder.cost = EncoderCost(call=0.0, token=1.0)     # each length its own call, into slots 5-9
    assert len(runner.encoder.cost.groups([len(s) for s in sources])) == len(sources)
    runner.encode([EncodeRow(s, (5 + slot,)) for slot, s in enumerate(sources)])
    split = _cross(runner, [5, 6, 7, 8, 9])
    for name, value in whole.items():
        for slot, s in enumerate(sources):           # a row's own positions; past them the mask hides the rest
            np.testing.assert_allclose(split[name][slot, :, :len(s)], value[slot, :, :len(s)], atol=1e-5)
    assert runner.source_lengths.tolist() == [len(s) for s in sources] * 2


def test_calibration_times_a_call_and_a_padded_token(runner: CrossSlotRunner) -> None:
    cost = runner.encoder.calibrate(rows=2, short=2, long=8, repeats=2)
    assert cost is not None and cost.call >= 0 and cost.token >= 0 and cost.call + cost.token > 0
    assert runner.encoder.cost is cost
    longest = runner.source.max_length     # asked for more than a source may hold: timed within it
    assert runner.encoder.calibrate(rows=1, short=longest, long=longest + 50, repeats=1) is not None


def test_cross_buffers_grow_with_the_longest_source_and_keep_what_the_slots_hold(parts: tuple) -> None:
    decoder, spec, source, encoder, _ = parts
    assert source.max_length >= 20
    rng = np.random.default_rng(1)
    top = source.vocab_size - 1
    short = [list(rng.integers(4, top, n)) for n in (3, 4)]
    long = list(rng.integers(4, top, 13))
    small = CrossSlotRunner(decoder, spec, source, 4, encoder, cross_length=4)
    full = CrossSlotRunner(decoder, spec, source, 4, encoder, cross_length=source.max_length)
    start = [DecodeRow(0, source.start_id, 0), DecodeRow(1, source.start_id, 0)]
    for r in (small, full):
        r.encode([EncodeRow(s, (slot,)) for slot, s in enumerate(short)])
    assert small.cross_length == 4 and full.cross_length == source.max_length
    before = small.decode(start, {}).copy()
    np.testing.assert_allclose(before, full.decode(start, {}), atol=1e-5)   # 4 positions read, not all of them
    for r in (small, full):
        r.encode([EncodeRow(long, (2,))])
    assert small.cross_length == 16                  # the next power of two
    rows = [*start, DecodeRow(2, source.start_id, 0)]
    after = small.decode(rows, {})
    np.testing.assert_allclose(after[:2], before, atol=1e-5)                 # slots 0 and 1 kept their sources
    np.testing.assert_allclose(after, full.decode(rows, {}), atol=1e-5)
    small.reset_cross()
    assert small.cross_length == 4


def test_the_engine_shrinks_long_cross_buffers_back_when_it_goes_idle(parts: tuple, monkeypatch) -> None:
    """A long source grows the cross buffers (past SHRINK_CROSS x their first 16 positions: 2x here, the test
    package's sources hold 40); once nothing runs, they go back, so the steps after a burst of long sources read no
    more positions than they need."""
    import asyncio

    import server.generation.cross_runner as cross_module
    from modelpkg import TOKENIZER_FILE
    from server.generation import GenerationConfig, GenerationEngine, GenerationParams
    from server.text.tokenizer import load_tokenizer

    decoder, spec, source, encoder, package = parts
    manifest = Manifest.from_json((package / "model.json").read_text())
    engine = GenerationEngine(decoder, manifest, load_tokenizer(package / TOKENIZER_FILE), GenerationConfig(),
                              None, "marian", encoder_session=encoder)
    runner = engine._runner
    longest = source.max_length
    monkeypatch.setattr(cross_module, "SHRINK_CROSS", 2)
    assert longest > 2 * 16

    async def body() -> tuple[int, int]:
        await engine.start()
        try:
            params = GenerationParams.validate(max_new_tokens=8, ignore_eos=True)
            grown = 0
            async for _ in engine.stream(list(range(4, 4 + longest)), params):
                grown = max(grown, runner.cross_length)        # while it decodes
            for _ in range(100):            # the loop goes idle right after the last chunk
                if runner.cross_length != grown:
                    break
                await asyncio.sleep(0.01)
            return grown, runner.cross_length
        finally:
            await engine.stop()
    grown, after = asyncio.run(body())
    assert grown == longest and after == 16
