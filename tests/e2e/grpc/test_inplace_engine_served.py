"""The in-place-cache engine through a real server process: same ids as offline greedy on the traced (concat)
graph and on the in-place graph of the same weights, with sequences joining and leaving mid-run and long prompts prefilled in chunks."""
from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from clients import OrtserveClient
from clients.errors import OrtserveError
from testing.offline import greedy_generate, greedy_with_logprobs, prompt_logprobs
from tests.server_process import ServerProcess, staggered_streams

INPLACE, CONCAT = "gpt-inplace", "gpt-concat"
# Short and long prompts: with 4-token chunks the long ones are prefilled over several steps while the
# short ones already decode; 3 slots for 8 requests means later ones wait for a slot to be freed.
PROMPTS = ["ROMEO.", "Once more unto the breach, dear friends, once more; or close the wall up",
           "a", "to be or not to be, that is the question: whether tis nobler in the mind to suffer",
           "My lord", "The quality of mercy is not strained; it droppeth as the gentle rain from heaven",
           "Now is the winter", "O"]
NEW_TOKENS = [12, 5, 20, 9, 3, 16, 7, 11]


@pytest.fixture(scope="module")
def repository(tiny_checkpoints, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from export import ExportConfig, export_checkpoint
    from testing.concat_decoder import concat_package

    repo = tmp_path_factory.mktemp("inplace-repo")
    export_checkpoint(ExportConfig(checkpoint=tiny_checkpoints.gpt, task="generate", repository=repo, name=INPLACE))
    concat_package(tiny_checkpoints.gpt, repo, CONCAT)   # the traced graph, as export wrote it before
    return repo


ARGS = ["--max-sequences", "3", "--prefill-chunk-tokens", "4", "--metrics-port", "0"]


@pytest.fixture(scope="module")
def server(repository: Path):
    with ServerProcess(repository, ARGS) as proc:
        yield proc


@pytest.fixture
def one_step_server(repository: Path):
    """One decode step per iteration: a test that needs a stream still decoding across several client round
    trips (the tiny model's back-to-back steps finish 100 tokens before them)."""
    with ServerProcess(repository, [*ARGS, "--decode-steps", "1"]) as proc:
        yield proc


def _offline(repository: Path, name: str, prompt_ids: list[int], n: int) -> list[int]:
    pkg = repository / name / "1"
    manifest = json.loads((pkg / "model.json").read_text())
    session = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
    return greedy_generate(session, manifest, prompt_ids, n, stop_at_eos=False)


def _run_all(server: ServerProcess, model: str) -> list[list[int]]:
    return staggered_streams(server.address, model, PROMPTS, NEW_TOKENS)   # they join a running batch


def test_manifest_records_the_cache_layout(repository: Path) -> None:
    cache = json.loads((repository / INPLACE / "1" / "model.json").read_text())["cache"]
    assert cache["layout"] == "inplace" and cache["num_kv_heads"] == cache["num_heads"]
    assert (repository / INPLACE / "1" / cache["mixed_graph"]).is_file()
    assert json.loads((repository / CONCAT / "1" / "model.json").read_text())["cache"]["layout"] == "concat"


def test_inplace_engine_equals_offline_greedy_of_both_graphs(server: ServerProcess, repository: Path) -> None:
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    chunks_before = server.metric("ortserve_prefill_chunks_total", model=INPLACE)
    inplace = _run_all(server, INPLACE)
    for i, prompt in enumerate(PROMPTS):
        ids = tok.encode(prompt).ids
        # The traced graph (torch.onnx, the concat cache), run offline one sequence at a time.
        want = _offline(repository, CONCAT, ids, NEW_TOKENS[i])
        assert inplace[i] == want, f"prompt {i}: in-place engine differs from offline greedy"
        # The in-place graph run offline without a shared buffer (it then concatenates) agrees too.
        assert _offline(repository, INPLACE, ids, NEW_TOKENS[i]) == want
    chunks = server.metric("ortserve_prefill_chunks_total", model=INPLACE) - chunks_before
    assert chunks >= len(PROMPTS)   # (how many depends on arrival timing; the next test pins chunking down)
    assert server.metric("ortserve_cache_slots", model=INPLACE, state="total") == 3
    deadline = time.monotonic() + 5
    while server.metric("ortserve_cache_slots", model=INPLACE, state="used") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert server.metric("ortserve_cache_slots", model=INPLACE, state="used") == 0


def test_a_long_prompt_beside_a_decoding_stream_is_prefilled_in_chunks(server: ServerProcess,
                                                                       repository: Path) -> None:
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    # A prompt no other test sends: no free slot holds a prefix of it, so all of it is prefilled.
    long = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him."
    n = len(tok.encode(long).ids)
    assert n > 3 * 5   # more than three 4-token chunks (a tail of at most a quarter rides with the last)
    with OrtserveClient(server.address, timeout=60) as client:
        stream = client.generate_stream("O", INPLACE, max_new_tokens=120, ignore_eos=True)
        next(stream)                   # the first token is out: this sequence now decodes every iteration
        before = server.metric("ortserve_prefill_chunks_total", model=INPLACE)
        got = client.generate(long, INPLACE, max_new_tokens=4, ignore_eos=True)
        chunks = server.metric("ortserve_prefill_chunks_total", model=INPLACE) - before
        rest = sum(len(c.tokens) for c in stream)
    assert chunks >= 3, f"{n} prompt tokens went in {chunks} chunk(s)"
    assert rest == 119
    assert [t.token_id for t in got.tokens] == _offline(repository, INPLACE, tok.encode(long).ids, 4)


def _wait_slots_used(server: ServerProcess, used: int) -> None:
    deadline = time.monotonic() + 10
    while server.metric("ortserve_cache_slots", model=INPLACE, state="used") != used:
        now = server.metric("ortserve_cache_slots", model=INPLACE, state="used")
        assert time.monotonic() < deadline, f"slots did not come free: {now}"
        time.sleep(0.02)


def test_a_prompt_starting_with_what_a_free_slot_holds_reuses_it_and_answers_as_offline(
        one_step_server: ServerProcess, repository: Path) -> None:
    """Prefix caching (on by default): the prefix is copied from the free slot that holds it into the lowest
    free one, while a decoding sequence in the highest slot makes every decode call write throw-away rows into
    the free slots below it. Greedy ids still equal offline greedy of the whole prompt."""
    server = one_step_server
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    shared = ("Now is the winter of our discontent made glorious summer by this sun of York; "
              "and all the clouds that loured upon our house in the deep bosom of the ocean buried.")
    assert len(tok.encode(shared).ids) > 40
    with OrtserveClient(server.address, timeout=60) as client:
        _wait_slots_used(server, 0)
        first = client.generate_stream("O", INPLACE, max_new_tokens=100, ignore_eos=True)       # slot 0
        next(first)
        # Long enough that it still runs when `last` is admitted (else `last` would take its slot).
        holder = client.generate_stream(shared, INPLACE, max_new_tokens=40, ignore_eos=True)   # slot 1
        next(holder)
        last = client.generate_stream("My lord", INPLACE, max_new_tokens=100, ignore_eos=True)  # slot 2
        next(last)
        held = list(holder)              # slot 1 is free now, holding the shared prompt (and 39 more tokens)
        first.close()                    # cancelled: slot 0 is free too, the lowest
        _wait_slots_used(server, 1)
        time.sleep(0.05)                 # a few decode calls of `last` write throw-away rows into slots 0 and 1
        before = server.metric("ortserve_prefix_reused_tokens_total", model=INPLACE)
        prompt = shared + " So sweet was never so fatal."
        got = client.generate(prompt, INPLACE, max_new_tokens=12, ignore_eos=True, logprobs=True)
        reused = server.metric("ortserve_prefix_reused_tokens_total", model=INPLACE) - before
        rest = sum(len(c.tokens) for c in last)
    assert held and rest > 0
    ids = tok.encode(prompt).ids
    assert reused >= len(tok.encode(shared).ids) - 2, f"{reused} of {len(ids)} prompt tokens reused"
    pkg = repository / INPLACE / "1"
    want = greedy_with_logprobs(ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"]),
                                json.loads((pkg / "model.json").read_text()), ids, 12, stop_at_eos=False)
    assert [t.token_id for t in got.tokens] == [t for t, _ in want]
    # Logprobs too (a wrong key/value anywhere in the prefix shows here even when the argmax survives it).
    assert max(abs(t.logprob - lp) for t, (_, lp) in zip(got.tokens, want)) < 1e-4


def test_requests_sharing_a_prompt_prefix_sent_together_compute_it_once_and_answer_as_offline(
        server: ServerProcess, repository: Path) -> None:
    """Two requests whose prompts share a long prefix, sent at once: one prefills it, the other copies it from
    that one's slot while it runs (its decode steps write past the prefix in the same iterations). Both answer
    as an offline full prefill, logprobs included."""
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    shared = "Friends, Romans, countrymen, lend me your ears; I come to bury Caesar, not to praise him."
    prompts = [shared, shared + " So let it be with Caesar."]
    pkg = repository / INPLACE / "1"
    session = ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"])
    manifest = json.loads((pkg / "model.json").read_text())
    with OrtserveClient(server.address, timeout=60) as client, ThreadPoolExecutor(2) as pool:
        _wait_slots_used(server, 0)
        before = server.metric("ortserve_prefix_reused_tokens_total", model=INPLACE)
        got = list(pool.map(lambda p: client.generate(p, INPLACE, max_new_tokens=24, ignore_eos=True, logprobs=True),
                            prompts))
        reused = server.metric("ortserve_prefix_reused_tokens_total", model=INPLACE) - before
    assert reused >= len(tok.encode(shared).ids) - 2, f"{reused} prompt tokens reused"
    for prompt, answer in zip(prompts, got):
        want = greedy_with_logprobs(session, manifest, tok.encode(prompt).ids, 24, stop_at_eos=False)
        assert [t.token_id for t in answer.tokens] == [t for t, _ in want]
        assert max(abs(t.logprob - lp) for t, (_, lp) in zip(answer.tokens, want)) < 1e-4


def test_a_scored_prompt_prefilled_in_chunks_beside_a_stream_scores_as_offline(
        server: ServerProcess, repository: Path) -> None:
    """prompt_logprobs through the task API: with a stream decoding, the prompt goes in 4-token chunks (and its
    last token may ride a decode step); every chunk's positions are scored, and the whole equals one offline run."""
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    prompt = "Now is the winter of our discontent made glorious summer by this sun of York"
    pkg = repository / INPLACE / "1"
    want, best = prompt_logprobs(ort.InferenceSession(str(pkg / "model.onnx"), providers=["CPUExecutionProvider"]),
                                 json.loads((pkg / "model.json").read_text()), tok.encode(prompt).ids)
    with OrtserveClient(server.address, timeout=60) as client:
        running = client.generate_stream("O", INPLACE, max_new_tokens=100, ignore_eos=True)
        next(running)
        chunks = server.metric("ortserve_prefill_chunks_total", model=INPLACE)
        got = client.generate(prompt, INPLACE, max_new_tokens=2, prompt_logprobs=1)
        chunks = server.metric("ortserve_prefill_chunks_total", model=INPLACE) - chunks
        streamed = [c.prompt_tokens for c in client.generate_stream(prompt, INPLACE, max_new_tokens=2, prompt_logprobs=1)]
        running.close()
    assert chunks >= 3, f"the prompt went in {chunks} chunk(s)"
    scored = got.prompt_tokens
    assert [t.token_id for t in scored] == tok.encode(prompt).ids
    assert scored[0].logprob is None and scored[0].top_logprobs == []
    assert max(abs(t.logprob - w) for t, w in zip(scored[1:], want)) < 1e-4
    assert [t.top_logprobs[0].token_id for t in scored[1:]] == best
    assert [len(p) for p in streamed][0] == len(scored) and not any(streamed[1:])   # with the first token only
    assert max(abs(a.logprob - b.logprob) for a, b in zip(streamed[0][1:], scored[1:])) < 1e-4


def test_a_concat_package_is_not_served_and_says_how_to_re_export_it(server: ServerProcess, repository: Path) -> None:
    """Packages published before the in-place cache became the engine's only layout: NOT_SERVING, the reason
    naming the command that re-exports their checkpoint; requests to them get UNAVAILABLE, the other models serve."""
    checkpoint = json.loads((repository / CONCAT / "1" / "model.json").read_text())["source"]["checkpoint"]
    with OrtserveClient(server.address, timeout=60) as client:
        status = {m.name: m for m in client.list_models()}[CONCAT]
        assert status.state == "NOT_SERVING"
        assert f"re-export the checkpoint: python -m export {checkpoint} --task generate" in status.reason
        with pytest.raises(OrtserveError) as err:
            client.generate("a", CONCAT, max_new_tokens=2)
        assert err.value.code == grpc.StatusCode.UNAVAILABLE
        assert client.generate("a", INPLACE, max_new_tokens=2, ignore_eos=True).usage.completion_tokens == 2


def test_a_request_cut_by_its_deadline_frees_its_slot(server: ServerProcess, repository: Path) -> None:
    """Wherever the deadline lands (waiting, mid-prefill, decoding: the tiny model is fast, so this is not
    pinned; tests/unit/test_scheduler.py pins the mid-prefill case), the slot comes back and works."""
    long = " ".join(["the quality of mercy is not strained"] * 3)
    with OrtserveClient(server.address, timeout=60) as client, ThreadPoolExecutor(1) as pool:
        # A running stream makes the long prompt go in 4-token chunks; its deadline ends it part-way.
        running = pool.submit(client.generate, "O", INPLACE, max_new_tokens=120, ignore_eos=True)
        time.sleep(0.01)
        try:
            cut = client.generate(long, INPLACE, max_new_tokens=40, timeout=0.02)
        except OrtserveError as err:          # the deadline passed before the server answered
            assert err.code == grpc.StatusCode.DEADLINE_EXCEEDED
        else:                                  # or the server answered in time: cut short, or (fast) complete
            assert cut.finish_reason in ("cancelled", "length") and cut.usage.completion_tokens <= 40
        assert running.result().usage.completion_tokens == 120
        deadline = time.monotonic() + 5
        while server.metric("ortserve_cache_slots", model=INPLACE, state="used") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.metric("ortserve_cache_slots", model=INPLACE, state="used") == 0
        # Every slot is usable again: three at once, greedy as offline.
        tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
        with ThreadPoolExecutor(3) as three:
            got = list(three.map(lambda p: client.generate(p, INPLACE, max_new_tokens=6, ignore_eos=True),
                                 PROMPTS[:3]))
        for prompt, g in zip(PROMPTS[:3], got):
            assert [t.token_id for t in g.tokens] == _offline(repository, INPLACE, tok.encode(prompt).ids, 6)


def test_spinning_decoder_graphs_share_one_pool(repository: Path) -> None:
    """With spinning threads the plain and mixed graphs share the process's thread pool (so each call takes
    the graph that suits it): the server says so, and gives the same ids as offline greedy, a long prompt
    chunked beside decoding streams."""
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    args = ["--max-sequences", "3", "--prefill-chunk-tokens", "4", "--intra-op-spinning", "on"]
    with ServerProcess(repository, args) as server, OrtserveClient(server.address, timeout=60) as client:
        with ThreadPoolExecutor(3) as pool:
            got = list(pool.map(lambda i: client.generate(PROMPTS[i], INPLACE, max_new_tokens=NEW_TOKENS[i],
                                                          ignore_eos=True), (0, 3, 5)))
        log = server.output(last=400)
    assert "one shared onnxruntime thread pool" in log
    for i, g in zip((0, 3, 5), got):
        want = _offline(repository, INPLACE, tok.encode(PROMPTS[i]).ids, NEW_TOKENS[i])
        assert [t.token_id for t in g.tokens] == want


def test_spinning_graphs_with_a_pool_each_run_everything_through_the_mixed_graph(repository: Path) -> None:
    """Spinning sessions with a pool each (the server's "auto": decoders spin, encoders do not) send every
    call through the mixed graph (the idle group filled by a throw-away row in the scratch slot). Greedy ids of
    two rows, one prefilled in chunks while the other decodes, equal offline greedy."""
    from server.generation.slot_runner import DecodeRow, PrefillRow, SlotRunner
    from modelpkg import Manifest
    from server.generation.spec import DecoderSpec

    pkg = repository / INPLACE / "1"
    manifest = json.loads((pkg / "model.json").read_text())
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.add_session_config_entry("session.intra_op.allow_spinning", "1")
    plain = ort.InferenceSession(str(pkg / "model.onnx"), options, providers=["CPUExecutionProvider"])
    mixed = ort.InferenceSession(str(pkg / manifest["cache"]["mixed_graph"]), options, providers=["CPUExecutionProvider"])
    runner = SlotRunner(plain, DecoderSpec.from_package(Manifest.from_dict(manifest), plain), 2, mixed)
    assert runner.mixed_only
    tok = Tokenizer.from_file(str(pkg / "tokenizer.json"))
    a, b = tok.encode(PROMPTS[0]).ids, tok.encode(PROMPTS[1]).ids
    got_a = [int(runner.prefill([PrefillRow(0, a, 0)], first_prompt=True)[0, -1].argmax())]
    for n in range(3):            # slot 0 decodes while slot 1's prompt goes in 4-token chunks
        got_a.append(int(runner.decode([DecodeRow(0, got_a[-1], len(a) + n)], {})[0].argmax()))
    got_b = []
    for start in range(0, len(b), 4):
        logits = runner.prefill([PrefillRow(1, b[start:start + 4], start)], first_prompt=start == 0)
        got_a.append(int(runner.decode([DecodeRow(0, got_a[-1], len(a) + len(got_a) - 1)], {1: start + 4})[0].argmax()))
    got_b.append(int(logits[0, -1].argmax()))
    for _ in range(4):
        rows = [DecodeRow(0, got_a[-1], len(a) + len(got_a) - 1), DecodeRow(1, got_b[-1], len(b) + len(got_b) - 1)]
        la, lb = runner.decode(rows, {})
        got_a.append(int(la.argmax()))
        got_b.append(int(lb.argmax()))
    assert got_a == _offline(repository, INPLACE, a, len(got_a))
    assert got_b == _offline(repository, INPLACE, b, len(got_b))


def test_two_generation_instances_hold_twice_the_slots_and_answer_as_offline(repository: Path) -> None:
    """--generation-instances 2: two engines of 3 slots each. Six short prompts streamed at once are decoded at the
    same moment (the slots gauge reaches 6; with the requests sent to one engine it could never pass 3), the gauges
    count both engines, and the staggered prompts answer as offline greedy whichever engine took them."""
    tok = Tokenizer.from_file(str(repository / INPLACE / "1" / "tokenizer.json"))
    args = [*ARGS, "--generation-instances", "2", "--intra-op-threads", "1", "--decode-steps", "1"]
    short = ["O", "a", "My lord", "ROMEO.", "Now is the winter", "To be or not"]
    with ServerProcess(repository, args) as server, OrtserveClient(server.address, timeout=60) as client:
        assert server.metric("ortserve_cache_slots", model=INPLACE, state="total") == 6
        streams = [client.generate_stream(p, INPLACE, max_new_tokens=110, ignore_eos=True) for p in short]
        firsts = [next(s) for s in streams]          # each call sent, its first token out
        assert all(f.tokens for f in firsts)
        used, deadline = 0.0, time.monotonic() + 5
        while used < 6 and time.monotonic() < deadline:
            used = max(used, server.metric("ortserve_cache_slots", model=INPLACE, state="used"))
        assert used == 6
        rest = [sum(len(c.tokens) for c in s) for s in streams]
        assert [len(f.tokens) + r for f, r in zip(firsts, rest)] == [110] * 6
        got = _run_all(server, INPLACE)
        for i, prompt in enumerate(PROMPTS):
            assert got[i] == _offline(repository, INPLACE, tok.encode(prompt).ids, NEW_TOKENS[i]), f"prompt {i}"
        _wait_slots_used(server, 0)
