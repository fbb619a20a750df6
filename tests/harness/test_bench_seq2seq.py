"""The pure parts of bench/seq2seq.py: the closed-loop clients, the arrival-batching loop the peers are served
through, the peer's request dispatch, and the Markdown block (bench/s2s_loop.py, s2s_peer.py, s2s_report.py).

The engine here is a small real function (it spells each source backwards, one token per step, with a fixed cost
per step), so the loop's batching, ordering and timing can be checked exactly; the engines themselves
(CTranslate2, transformers, ortserve) are exercised by the benchmark run."""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from bench.results import write_block
from bench.s2s_loop import ArrivalBatcher, Record, run_clients, run_clients_async, summarize
from bench.s2s_peer import KEEPING_PAD, STANDARD, answer, conversion
from bench.s2s_report import BLOCK, render
from bench.harness import main as bench_main

STEP_S = 0.004


class Speller:
    """Engine: each source (a word) comes back reversed, one letter per step; a step costs STEP_S for the batch."""

    workers = 1

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.lock = threading.Lock()
        self.running = 0
        self.most_at_once = 0
        self.started = threading.Event()

    def __call__(self, sources, on_step):
        with self.lock:
            self.calls.append(list(sources))
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.started.set()
        try:
            return self._spell(sources, on_step)
        finally:
            with self.lock:
                self.running -= 1

    def _spell(self, sources, on_step):
        outs = [list(reversed(s)) for s in sources]
        for step in range(max(len(o) for o in outs)):
            time.sleep(STEP_S)
            for row, o in enumerate(outs):
                if step < len(o):
                    on_step(row)
        return outs

    # the peer's engine protocol (bench/s2s_peer.py): batch(...) and engine(max_new, min_new)
    def batch(self, sources, beam, max_new, min_new, max_batch_size):
        return [list(reversed(s))[:max_new] for s in sources]

    def engine(self, max_new, min_new):
        return self


WORDS = [w for w in "the quick brown fox jumps over lazy dogs while seven wizards quietly hex bad jugs".split()]


def test_every_request_gets_its_own_answer_and_batches_hold_what_arrived():
    engine = Speller()
    with ArrivalBatcher(engine, max_batch=4) as server:
        wall, records = run_clients(6, WORDS, server.call)
    assert [r.index for r in records] == list(range(len(WORDS)))
    assert ["".join(r.output) for r in records] == [w[::-1] for w in WORDS]
    assert sum(server.batches) == len(WORDS) and max(server.batches) <= 4
    # 6 clients released together: the first call takes who arrived first, the rest wait for the next round, so
    # some round runs more than one request; and the engine saw exactly the batches the loop recorded.
    assert max(server.batches) > 1
    assert [len(c) for c in engine.calls] == server.batches
    assert wall >= max(r.done for r in records) - min(r.sent for r in records) - 1e-9


def test_clients_send_their_share_in_order_one_at_a_time():
    with ArrivalBatcher(Speller(), max_batch=8) as server:
        _, records = run_clients(3, WORDS, server.call)
    for c in range(3):
        mine = [r for r in records if r.client == c]
        assert [r.index for r in mine] == list(range(c, len(WORDS), 3))
        for before, after in zip(mine, mine[1:]):
            assert after.sent >= before.done      # closed loop: the next request only after the answer
    for r in records:
        assert r.first is not None and r.sent <= r.first <= r.done
        assert r.ttft == pytest.approx(r.first - r.sent)


def test_coroutine_clients_send_the_same_arrivals_as_threads():
    """run_clients_async (ortserve's asyncio client in the benchmark) gives each client the requests run_clients
    gives it, one at a time, and marks first tokens the same way."""
    async def spell(word, on_token):
        await asyncio.sleep(STEP_S)
        on_token()
        await asyncio.sleep(STEP_S * (len(word) - 1))
        return list(reversed(word))
    wall, records = asyncio.run(run_clients_async(3, WORDS, spell))
    with ArrivalBatcher(Speller(), max_batch=8) as server:
        _, threaded = run_clients(3, WORDS, server.call)
    assert [(r.client, r.index, r.output) for r in records] == [(r.client, r.index, r.output) for r in threaded]
    for c in range(3):
        mine = sorted((r for r in records if r.client == c), key=lambda r: r.sent)
        assert [r.index for r in mine] == list(range(c, len(WORDS), 3))
        for before, after in zip(mine, mine[1:]):
            assert after.sent >= before.done
    for r in records:
        assert r.first is not None and r.sent <= r.first <= r.done
        assert r.first - r.sent >= STEP_S and r.done - r.first >= STEP_S * (len(WORDS[r.index]) - 1) - 1e-3
    assert wall >= max(r.done for r in records) - min(r.sent for r in records) - 1e-9
    with pytest.raises(ValueError, match="n_clients"):
        asyncio.run(run_clients_async(0, WORDS, spell))


def test_one_client_never_batches():
    with ArrivalBatcher(Speller(), max_batch=8) as server:
        run_clients(1, WORDS[:5], server.call)
    assert server.batches == [1] * 5


def test_a_request_arriving_during_a_call_waits_for_the_next_batch():
    engine = Speller()
    with ArrivalBatcher(engine, max_batch=8) as server:
        first = threading.Thread(target=server.call, args=("abcdefghijklmnopqrstuvwxyz", lambda: None))
        first.start()
        assert engine.started.wait(10)                # the long word is being spelled (26 steps)
        late = server.call("xy", lambda: None)
        first.join()
    assert late == ["y", "x"]
    assert engine.calls == [["abcdefghijklmnopqrstuvwxyz"], ["xy"]]


def test_two_workers_run_two_batches_at_once_and_one_never_does():
    for workers, most in ((2, 2), (1, 1)):
        engine = Speller()
        with ArrivalBatcher(engine, max_batch=2, workers=workers) as server:
            _, records = run_clients(8, WORDS, server.call)
        assert ["".join(r.output) for r in records] == [w[::-1] for w in WORDS]
        assert engine.most_at_once == most and sum(server.batches) == len(WORDS)


def test_an_engine_error_reaches_every_caller():
    def broken(sources, on_step):
        raise RuntimeError("engine on fire")
    with ArrivalBatcher(broken, max_batch=4) as server:
        with pytest.raises(RuntimeError, match="engine on fire"):
            run_clients(2, WORDS[:4], server.call)


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError, match="n_clients"):
        run_clients(0, WORDS, lambda s, t: [])
    with pytest.raises(ValueError, match="max_batch"):
        ArrivalBatcher(Speller(), max_batch=0)
    with pytest.raises(ValueError, match="workers"):
        ArrivalBatcher(Speller(), workers=0)


def test_summary_counts_tokens_over_the_wall_time():
    records = [Record(0, 0, sent=1.0, done=1.5, first=1.1, output=list("abcd")),
               Record(1, 1, sent=1.0, done=2.0, first=1.3, output=list("ab")),
               Record(0, 2, sent=1.5, done=3.0, first=None, output=list("abcdef"))]
    s = summarize(2.0, records)
    assert s["tokens"] == 12 and s["requests"] == 3 and s["tokens_per_s"] == 6.0
    # TTFTs 100, 300 and (no token seen before the answer) 1500 ms
    assert s["ttft_p50_ms"] == pytest.approx(300.0) and s["ttft_p90_ms"] == pytest.approx(1260.0)


def test_peer_dispatch_runs_batch_and_clients_requests():
    engine = Speller()
    batch = answer(engine, {"op": "batch", "sources": ["abc", "hello"], "beam": 1, "max_new": 3})
    assert batch["outputs"] == [["c", "b", "a"], ["o", "l", "l"]] and batch["wall_s"] >= 0
    served = answer(engine, {"op": "clients", "sources": WORDS[:6], "clients": 3, "max_new": 9, "max_batch": 2})
    assert ["".join(r["output"]) for r in served["records"]] == [w[::-1] for w in WORDS[:6]]
    assert sum(served["batches"]) == 6 and max(served["batches"]) <= 2
    with pytest.raises(ValueError, match="op: unknown 'translate'"):
        answer(engine, {"op": "translate"})


def test_conversion_keeps_a_pad_that_is_not_last_and_leaves_opus_layouts_to_the_converter():
    # the g2p model: pad 0 with a trained row; OPUS-MT: pad = the last id, a zero row (CTranslate2's assumption)
    assert conversion({"model_type": "marian", "pad_token_id": 0, "vocab_size": 101}) == KEEPING_PAD
    assert conversion({"model_type": "marian", "pad_token_id": 58100, "vocab_size": 58101}) == STANDARD
    assert conversion({"model_type": "bart", "pad_token_id": 1, "vocab_size": 60}) == STANDARD


def _cell(ours: float, ct2: float, int8: float | None = None) -> dict:
    cell = {"ortserve": {"runs": [{"tokens_per_s": ours * 0.9}, {"tokens_per_s": ours * 1.1}], "tokens_per_s": ours},
            "ct2": {"runs": [{"tokens_per_s": ct2}], "tokens_per_s": ct2},
            "ratio_vs_ct2": ours / ct2, "identical_outputs_vs_ct2": 0.995}
    if int8:
        cell["ct2_int8"] = {"runs": [{"tokens_per_s": int8}], "tokens_per_s": int8}
    return cell


def _served(ours: float, ct2: float, hf: float, per_token: float | None = None) -> dict:
    """A served cell; per_token: the message-per-token delivery's figure (None: a result from before it)."""
    side = lambda v, t: {"runs": [], "tokens_per_s": v, "ttft_p50_ms": t, "ttft_p90_ms": 2 * t}  # noqa: E731
    cell = {"ortserve": side(ours / 2, 20.0), "ortserve_alt": side(ours, 12.0),
            "ortserve_best": {"side": "ortserve_alt", "threads": 1}, "ct2": side(ct2 / 2, 60.0),
            "ct2_alt": side(ct2, 30.0), "ct2_best": {"side": "ct2_alt", "layout": "1x2"}, "hf": side(hf, 45.0),
            "requests": 64,
            "ratio_vs_ct2": ours / ct2, "ratio_vs_hf": ours / hf}
    if per_token is not None:
        cell.update({"ortserve_tokens": side(per_token, 15.0), "ortserve_alt_tokens": side(per_token / 2, 14.0),
                     "ortserve_tokens_best": {"side": "ortserve_tokens", "threads": 2},
                     "ratio_tokens_vs_ct2": per_token / ct2, "ratio_tokens_vs_hf": per_token / hf})
    return cell


REPORT = {
    "command": "python -m bench.seq2seq", "started": "2026-11-26T13:00:00Z", "elapsed_s": 512.3, "material_s": 41.0,
    "load_at_end": [0.9, 0.8, 0.7],
    "machine": {"nproc": 2, "cpu_model": "Test CPU", "loadavg_at_start": [0.5, 0.4, 0.3], "git_commit": "abc1234"},
    "config": {"rounds": 2},
    "sides": {"ortserve_batch": {"threads": 2, "max_sequences": 64, "path": "ortserve-batch --local"},
              "ct2_batch": {"inter_threads": 1, "intra_threads": 2, "compute_type": "float32"},
              "hf_served": {"threads": 2, "attn_implementation": "sdpa"}},
    "models": {
        "g2p": {"checkpoint": "artifacts/checkpoints/g2p", "ct2_conversion": "a loader of its own",
                "batch": {"inputs": 2000, "max_new_tokens": 32, "min_new_tokens": 0,
                          "beam1": _cell(3000.0, 2000.0, 4000.0), "beam4": _cell(900.0, 1800.0)},
                "served": {"peer_max_batch": 32, "max_new_tokens": 32, "min_new_tokens": 0,
                           "1": _served(400.0, 500.0, 100.0, 300.0), "32": _served(1500.0, 1000.0, 750.0, 600.0)}},
        "marian": {"checkpoint": "work/marian", "step": {
            "batch": 8, "positions": [16, 256], "rounds": 5, "short_ms": 20.0, "long_ms": 24.0, "growth_ms": 4.0,
            "extra_cache_bytes": 47_185_920, "read_bandwidth_gb_s": 15.0, "read_floor_ms": 3.15,
            "growth_over_floor": 1.27}}},
}


def test_report_states_command_machine_sides_figures_and_goals():
    text = "\n".join(render(REPORT))
    assert "`python -m bench.seq2seq` at 2026-11-26T13:00:00Z" in text
    assert "nproc 2, Test CPU" in text and "at start 0.50 / 0.40 / 0.30, at the end 0.90 / 0.80 / 0.70" in text
    assert "CTranslate2 float32, batch job: inter threads 1, intra threads 2, compute type float32" in text
    assert "transformers generate, served: threads 2, attn implementation sdpa" in text
    assert "| greedy | 3,000 [2,700–3,300] | 2,000 | 1.50 | met | 4,000 | 99.5% |" in text
    assert "| beam 4 | 900 [810–990] | 1,800 | 0.50 | **missed** | – | 99.5% |" in text
    assert "no 8-bit encoder-decoder variant" in text
    assert "`quantization=\"int8\"`) with a loader of its own." in text and "bash bench/setup_ct2.sh" in text
    assert "Batch job: 2000 inputs, up to 32 new tokens (eos ends)" in text      # the size: no remark
    small = {**REPORT, "models": {"marian": {"checkpoint": "m", "batch": {
        "inputs": 128, "max_new_tokens": 16, "min_new_tokens": 16, "beam1": _cell(400.0, 500.0)}}}}
    assert ("Batch job: 128 inputs (the issue asks 2,000; fewer here keep the whole run near 12 minutes, or short "
            "with --quick), exactly 16 new tokens each") in "\n".join(render(small))
    # the faster CTranslate2 layout of the row, named
    # ... and ortserve's two deliveries: the ratios compare the answer as the peers hand it over, per token beside
    assert "| 32 | 64 | 1,500 (1 thread) | 600 (2 threads) | 1,000 (1x2) | 750 | 1.50 | 2.00 | 0.60, 0.80 | " \
           "12 / 30 / 45 |" in text
    assert "| 1 | 64 | 400 (1 thread) | 300 (2 threads) | 500 (1x2) | 100 | 0.80 | 4.00 | 0.60, 3.00 | " \
           "12 / 30 / 45 |" in text
    assert "growth = 1.27 × that floor (goal ≤ 1.3×: met)" in text and "extra 47 MB" in text
    # a model without a piece renders without its table
    assert text.count("| search |") == 1 and text.count("| clients |") == 1


def test_a_served_result_from_before_the_two_deliveries_shows_its_figures_as_per_token():
    report = {**REPORT, "models": {"g2p": {"checkpoint": "c", "served": {
        "peer_max_batch": 32, "max_new_tokens": 32, "min_new_tokens": 0, "32": _served(1500.0, 1000.0, 750.0)}}}}
    text = "\n".join(render(report))
    assert "| 32 | 64 | — | 1,500 (1 thread) | 1,000 (1x2) | 750 | — | — | 1.50, 2.00 | 12 / 30 / 45 |" in text


def test_the_int8_table_lists_each_8bit_variant_against_ctranslate2_int8():
    cell = _cell(3000.0, 2000.0, 4000.0)
    cell["ortserve_w8"] = {"runs": [{"tokens_per_s": 5000.0}, {"tokens_per_s": 5400.0}], "tokens_per_s": 5200.0}
    cell["ortserve_int8"] = {"runs": [{"tokens_per_s": 6000.0}, {"tokens_per_s": 6400.0}], "tokens_per_s": 6200.0}
    cell.update(ratio_w8_vs_ct2_int8=5200.0 / 4000.0, identical_outputs_w8_vs_fp32=0.987,
                ratio_int8_vs_ct2_int8=6200.0 / 4000.0, identical_outputs_int8_vs_fp32=0.995,
                identical_outputs_ct2_int8_vs_float32=0.97)
    report = {**REPORT, "sides": {**REPORT["sides"], "ortserve_w8_batch": {"variant": "w8", "threads": 2},
                                  "ortserve_int8_batch": {"variant": "int8", "threads": 2}},
              "models": {"g2p": {"checkpoint": "c", "batch": {"inputs": 2000, "max_new_tokens": 32,
                                                              "min_new_tokens": 0, "beam1": cell}}}}
    text = "\n".join(render(report))
    assert "ortserve w8, batch job: variant w8, threads 2" in text
    assert "ortserve int8, batch job: variant int8, threads 2" in text
    # int8 first, then w8, each with its own ratio and agreement
    int8_row = "| greedy | int8 | 6,200 [6,000–6,400] | 4,000 | 1.55 | met | 99.5% / 97.0% |"
    w8_row = "| greedy | w8 | 5,200 [5,000–5,400] | 4,000 | 1.30 | met | 98.7% / 97.0% |"
    assert int8_row in text and w8_row in text and text.index(int8_row) < text.index(w8_row)
    assert "no 8-bit encoder-decoder variant" not in text and "ortserve's int8 (per-channel" in text
    assert text.count("| search |") == 2


def test_a_batch_job_without_8bit_variants_says_so():
    report = {**REPORT, "models": {"g2p": {"checkpoint": "c", "batch": {
        "inputs": 2000, "max_new_tokens": 32, "min_new_tokens": 0, "beam1": _cell(3000.0, 2000.0, 4000.0)}}}}
    text = "\n".join(render(report))
    assert "ortserve ships no 8-bit encoder-decoder variant here" in text and text.count("| search |") == 1


def test_block_is_written_between_its_markers_and_replaced_alone(tmp_path):
    doc = tmp_path / "BENCHMARKS.md"
    doc.write_text("# Benchmarks\n\nintro\n\n<!-- http:begin -->\nkeep me\n<!-- http:end -->\n")
    write_block(doc, BLOCK, render(REPORT))
    first = doc.read_text()
    assert "<!-- seq2seq:begin -->" in first and "<!-- seq2seq:end -->" in first and "keep me" in first
    changed = {**REPORT, "command": "python -m bench.seq2seq --quick"}
    write_block(doc, BLOCK, render(changed))
    second = doc.read_text()
    assert second.count("<!-- seq2seq:begin -->") == 1 and "--quick`" in second and "keep me" in second


def test_cli_refuses_unknown_names_in_one_line(capsys):
    assert bench_main(["seq2seq", "--models", "t5"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --models: unknown 't5' (choose from g2p, marian)"]
    assert bench_main(["seq2seq", "--ct2-threads", "two"]) == 2
    assert "--ct2-threads: expected INTERxINTRA" in capsys.readouterr().err
