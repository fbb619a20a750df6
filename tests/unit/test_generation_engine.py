"""Generation engine on real onnxruntime sessions: the shared tiny-gpt package, plus a bigram graph.

The bigram graph is a real ONNX decoder with the package's signature whose next token depends only on
the last input token (logits = table[input_id]). Its table scripts exact outputs (multi-byte
characters, eos, stop sequences), which a random-weight model cannot be made to produce.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from typing import Any, AsyncIterator, Coroutine

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from prometheus_client import CollectorRegistry
from tokenizers import Tokenizer, pre_tokenizers

from server.runtime import eventloop
from server.generation import (GenerationConfig, GenerationEngine, GenerationParams, OverloadedError,
                               StreamChunk)
from modelpkg import Manifest
from server.runtime.metrics import Metrics
from testing.offline import greedy_generate

PROMPTS = [
    "To be, or not to be",
    "Romeo",
    "What light through yonder window breaks? It is the east, and Juliet is the sun.",
    "a",
    "Now is the winter of our discontent",
]


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(asyncio.wait_for(coro, timeout=60))


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1   # the test machine's cores are shared
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


class Package:
    def __init__(self, session: ort.InferenceSession, manifest: dict, tokenizer: Tokenizer) -> None:
        self.session, self.manifest, self.tokenizer = session, manifest, tokenizer

    def ids(self, text: str) -> list[int]:
        # The engine encodes prompts the same way (the tokenizer's own post-processor included).
        return self.tokenizer.encode(text).ids

    @contextlib.asynccontextmanager
    async def engine(self, metrics: Metrics | None = None, manifest: dict | None = None,
                     **config: int) -> AsyncIterator[GenerationEngine]:
        engine = GenerationEngine(self.session, Manifest.from_dict(manifest or self.manifest), self.tokenizer,
                                  GenerationConfig(**config), metrics, "test")
        await engine.start()
        try:
            yield engine
        finally:
            await engine.stop()


@pytest.fixture(scope="session")
def tiny_gpt(tiny_repository: Path) -> Package:
    """The shared package as exported."""
    d = tiny_repository / "tiny-gpt" / "1"
    manifest = json.loads((d / "model.json").read_text())
    return Package(_session(d / manifest["variants"]["fp32"]), manifest,
                   Tokenizer.from_file(str(d / "tokenizer.json")))


@pytest.fixture(scope="session")
def gpt(tiny_gpt: Package, tiny_repository: Path) -> Package:
    """The shared package's graph with every weight matrix scaled by 10.

    At its init scale (std 0.02) the random model's greedy output just repeats the last prompt token,
    so comparing batched with offline ids would prove little. Scaled, positions and context change
    the choice at every step (and random bytes make partial UTF-8 characters).
    """
    d = tiny_repository / "tiny-gpt" / "1"
    model = onnx.load(str(d / tiny_gpt.manifest["variants"]["fp32"]))
    for init in model.graph.initializer:
        array = numpy_helper.to_array(init)
        if array.dtype == np.float32 and array.ndim >= 2:
            init.CopyFrom(numpy_helper.from_array(array * 10.0, init.name))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return Package(session, tiny_gpt.manifest, tiny_gpt.tokenizer)

# ---------------------------------------------------------------- the scripted (bigram) decoder


def byte_ids(tokenizer: Tokenizer, text: str) -> list[int]:
    """One token per UTF-8 byte (the byte-level alphabet)."""
    mapped = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False).pre_tokenize_str(text)[0][0]
    ids = [tokenizer.token_to_id(ch) for ch in mapped]
    assert None not in ids
    return ids


def _bigram_graph(table: np.ndarray) -> onnx.ModelProto:
    """An in-place decoder signature with 1 layer, 1 head, head_dim 1: logits = table[input_ids]; the cache is
    passed through untouched (present = past, the buffer the engine binds to both)."""
    vocab = table.shape[0]
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    inputs = [helper.make_tensor_value_info("input_ids", i64, ["batch", "sequence"]),
              helper.make_tensor_value_info("attention_mask", i64, ["batch", "total"]),
              helper.make_tensor_value_info("past_key_values.0.key", f32, ["batch", 1, "max_sequence", 1]),
              helper.make_tensor_value_info("past_key_values.0.value", f32, ["batch", 1, "max_sequence", 1])]
    outputs = [helper.make_tensor_value_info("logits", f32, ["batch", "sequence", vocab]),
               helper.make_tensor_value_info("present.0.key", f32, ["batch", 1, "max_sequence", 1]),
               helper.make_tensor_value_info("present.0.value", f32, ["batch", 1, "max_sequence", 1])]
    nodes = [
        helper.make_node("Gather", ["table", "input_ids"], ["logits"], axis=0),
        helper.make_node("Identity", ["past_key_values.0.key"], ["present.0.key"]),
        helper.make_node("Identity", ["past_key_values.0.value"], ["present.0.value"]),
    ]
    inits = [numpy_helper.from_array(table.astype(np.float32), "table")]
    graph = helper.make_graph(nodes, "bigram", inputs, outputs, inits)
    # IR 10 is what every onnxruntime >= 1.17 reads (a newer onnx would default to an IR some runtimes refuse).
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=10)


class Script:
    """Chains of tokens: after `trigger` the graph emits `text` byte by byte, then `after`."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab = tokenizer.get_vocab_size()
        self.x = tokenizer.token_to_id("x")
        self.eos = tokenizer.token_to_id("<|endoftext|>")
        self.table = np.zeros((self.vocab, self.vocab), dtype=np.float32)
        self.table[:, self.x] = 10.0          # by default everything continues with "x"

    def chain(self, trigger: str, text: str, end: int) -> None:
        ids = byte_ids(self.tokenizer, trigger)[-1:] + byte_ids(self.tokenizer, text) + [end]
        assert len(set(ids[:-1])) == len(ids) - 1, "a bigram chain cannot repeat a token"
        for a, b in zip(ids, ids[1:]):
            self.table[a] = 0.0
            self.table[a, b] = 10.0


@pytest.fixture(scope="session")
def bigram(gpt: Package, tmp_path_factory: pytest.TempPathFactory) -> Package:
    script = Script(gpt.tokenizer)
    script.chain("Z", "é漢🙂", end=script.eos)          # multi-byte characters, then eos
    script.chain("Q", "Wy", end=script.x)               # "Wy" then x forever
    path = tmp_path_factory.mktemp("bigram") / "model.onnx"
    onnx.save(_bigram_graph(script.table), str(path))
    manifest = dict(gpt.manifest, cache={"num_layers": 1, "num_heads": 1, "head_dim": 1, "layout": "inplace"},
                    max_length=64, vocab_size=script.vocab)
    return Package(_session(path), manifest, gpt.tokenizer)


async def collect(engine: GenerationEngine, prompt: str, params: GenerationParams) -> list[StreamChunk]:
    return [chunk async for chunk in engine.stream(prompt, params)]

# ---------------------------------------------------------------- greedy == offline


def test_continuous_batching_equals_offline_greedy(gpt: Package) -> None:
    n = 24
    expected = [greedy_generate(gpt.session, gpt.manifest, gpt.ids(p), n, stop_at_eos=False) for p in PROMPTS]
    seen_active: list[int] = []

    async def body() -> list[list[int]]:
        async with gpt.engine(max_batch_size=4) as engine:   # 5 prompts: one must wait for a free slot
            params = GenerationParams.validate(max_new_tokens=n, ignore_eos=True)

            async def one(prompt: str, delay: float) -> list[int]:
                await asyncio.sleep(delay)    # join while the others are mid-generation
                ids = []
                async for chunk in engine.stream(prompt, params):
                    ids += [t.token_id for t in chunk.tokens]
                    seen_active.append(engine.active_sequences)
                return ids

            return await asyncio.gather(*(one(p, 0.004 * i) for i, p in enumerate(PROMPTS)))

    got = run(body())
    for prompt, a, b in zip(PROMPTS, got, expected):
        assert a == b, prompt
    assert max(seen_active) > 1   # they really were batched
    assert min(len(set(ids)) for ids in expected) > 3   # the reference is not a constant token


def test_the_package_as_exported_matches_offline_greedy(tiny_gpt: Package) -> None:
    params = GenerationParams.validate(max_new_tokens=8, ignore_eos=True)

    async def body() -> list[Any]:
        async with tiny_gpt.engine() as engine:
            return await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS[:3]))

    for prompt, result in zip(PROMPTS, run(body())):
        assert [t.token_id for t in result.tokens] == greedy_generate(
            tiny_gpt.session, tiny_gpt.manifest, tiny_gpt.ids(prompt), 8, stop_at_eos=False)


def test_greedy_text_is_the_decoded_ids(gpt: Package) -> None:
    async def body() -> None:
        async with gpt.engine() as engine:
            result = await engine.generate(PROMPTS[0], GenerationParams.validate(max_new_tokens=16, ignore_eos=True))
            ids = [t.token_id for t in result.tokens]
            assert result.text == gpt.tokenizer.decode(ids)
            assert result.finish_reason == "length" and result.usage.completion_tokens == 16
            assert result.usage.prompt_tokens == len(gpt.ids(PROMPTS[0]))
            assert 0 < result.time_to_first_token_ms <= result.total_time_ms
            # One token comes from the prefill alone; the sequence never joins the decode batch.
            single = await engine.generate(PROMPTS[0], GenerationParams.validate(max_new_tokens=1))
            assert [t.token_id for t in single.tokens] == ids[:1] and single.finish_reason == "length"
            assert engine.active_sequences == 0

    run(body())

# ---------------------------------------------------------------- sampling through the engine


def test_seed_gives_the_same_text_whatever_the_neighbours(gpt: Package) -> None:
    params = GenerationParams.validate(max_new_tokens=20, temperature=1.5, top_p=0.95, seed=1234, ignore_eos=True)

    async def body() -> tuple[str, str, str, str]:
        async with gpt.engine() as engine:
            alone = (await engine.generate(PROMPTS[0], params)).text
            noise = GenerationParams.validate(max_new_tokens=20, temperature=1.3, ignore_eos=True)
            crowded = await asyncio.gather(engine.generate(PROMPTS[0], params),
                                           *(engine.generate(p, noise) for p in PROMPTS[1:]))
            other_seed = await engine.generate(PROMPTS[0], GenerationParams.validate(
                max_new_tokens=20, temperature=1.5, top_p=0.95, seed=99, ignore_eos=True))
            greedy = await engine.generate(PROMPTS[0], GenerationParams.validate(max_new_tokens=20, ignore_eos=True))
            return alone, crowded[0].text, other_seed.text, greedy.text

    alone, crowded, other, greedy = run(body())
    assert alone == crowded
    assert other != alone and greedy != alone    # sampling really sampled


def test_top_k_1_and_tiny_top_p_equal_greedy(gpt: Package) -> None:
    async def body() -> None:
        async with gpt.engine() as engine:
            expected = greedy_generate(gpt.session, gpt.manifest, gpt.ids(PROMPTS[1]), 16, stop_at_eos=False)
            for extra in ({"top_k": 1}, {"top_p": 1e-6}):
                params = GenerationParams.validate(max_new_tokens=16, temperature=1.5, seed=5, ignore_eos=True, **extra)
                result = await engine.generate(PROMPTS[1], params)
                assert [t.token_id for t in result.tokens] == expected, extra

    run(body())


def test_logprobs_match_the_graph_and_top_n_is_sorted(gpt: Package) -> None:
    prompt_ids = gpt.ids(PROMPTS[2])
    names = [f"past_key_values.{i}.{k}" for i in range(gpt.manifest["cache"]["num_layers"]) for k in ("key", "value")]
    c = gpt.manifest["cache"]
    feeds = {"input_ids": np.asarray([prompt_ids]), "attention_mask": np.ones((1, len(prompt_ids)), dtype=np.int64),
             "position_ids": np.arange(len(prompt_ids))[None, :],
             **{n: np.zeros((1, c["num_heads"], 0, c["head_dim"]), dtype=np.float32) for n in names}}
    first = gpt.session.run(["logits"], feeds)[0][0, -1].astype(np.float64)
    expected_first = first - first.max() - np.log(np.exp(first - first.max()).sum())

    async def body() -> None:
        async with gpt.engine() as engine:
            params = GenerationParams.validate(max_new_tokens=8, logprobs=True, top_logprobs=5, ignore_eos=True)
            result = await engine.generate(PROMPTS[2], params)
            assert result.tokens[0].logprob == pytest.approx(expected_first[result.tokens[0].token_id], abs=1e-4)
            for token in result.tokens:
                assert token.logprob is not None and token.logprob <= 0
                values = [alt.logprob for alt in token.top_logprobs]
                assert len(values) == 5 and values == sorted(values, reverse=True) and values[0] <= 0
                # Greedy: the chosen token is the best alternative.
                assert token.top_logprobs[0].token_id == token.token_id
                assert token.top_logprobs[0].logprob == pytest.approx(token.logprob)
            plain = await engine.generate(PROMPTS[2], GenerationParams.validate(max_new_tokens=2))
            assert all(t.logprob is None and not t.top_logprobs for t in plain.tokens)

    run(body())

# ---------------------------------------------------------------- text: multi-byte, eos, stops


def test_stream_never_splits_multibyte_characters_and_ends_on_eos(bigram: Package) -> None:
    async def body() -> list[StreamChunk]:
        async with bigram.engine(decode_steps=1) as engine:    # a chunk per step: one token each
            return await collect(engine, "Z", GenerationParams.validate(max_new_tokens=30))

    chunks = run(body())
    texts = [c.text for c in chunks]
    assert "".join(texts) == "é漢🙂"
    assert [t for t in texts if t] == ["é", "漢", "🙂"]        # each character whole, in one chunk
    assert chunks[-1].final and chunks[-1].finish_reason == "eos"
    assert chunks[-1].usage.completion_tokens == 10             # 9 bytes + eos
    assert not any(c.final for c in chunks[:-1])


def test_a_consumer_that_fell_behind_gets_the_waiting_chunks_as_one(bigram: Package) -> None:
    """Chunks queued while nobody read come out merged (one message on a door instead of one per token), and
    reassemble to what a consumer reading as they come gets."""
    params = GenerationParams.validate(max_new_tokens=12, ignore_eos=True)

    async def body() -> tuple[list[StreamChunk], StreamChunk, list[StreamChunk]]:
        async with bigram.engine(decode_steps=1) as engine:    # a chunk per step: one token each
            kept_up = await collect(engine, "Z", params)
            stream = engine.stream("Z", params)
            first = await stream.__anext__()
            while engine.active_sequences:      # the other 11 tokens are generated while nobody reads
                await asyncio.sleep(0.001)
            return kept_up, first, [c async for c in stream]

    kept_up, first, rest = run(body())
    assert len(kept_up) == 12 and all(len(c.tokens) == 1 for c in kept_up)   # read as they come: one per token
    assert len(rest) == 1 and rest[0].final and rest[0].finish_reason == "length"
    assert [t.token_id for c in (first, *rest) for t in c.tokens] == [t.token_id for c in kept_up for t in c.tokens]
    assert first.text + rest[0].text == "".join(c.text for c in kept_up) == "é漢🙂<|endoftext|>xx"   # ignore_eos
    assert rest[0].usage == kept_up[-1].usage


def test_an_error_queued_behind_chunks_is_raised_after_them(gpt: Package) -> None:
    from server.generation.results import GeneratedToken
    from server.generation.sequence import Sequence

    async def body() -> None:
        seq = Sequence.create(gpt.ids("a"), GenerationParams.validate(), gpt.tokenizer, 100, None)
        seq.queue.put_nowait(StreamChunk(text="x", tokens=[GeneratedToken(5)]))
        seq.queue.put_nowait(StreamChunk(text="y", tokens=[GeneratedToken(6)]))
        seq.queue.put_nowait(RuntimeError("decode step failed"))
        merged = await seq.next_chunk()
        assert (merged.text, [t.token_id for t in merged.tokens], merged.final) == ("xy", [5, 6], False)
        with pytest.raises(RuntimeError, match="decode step failed"):
            await seq.next_chunk()

    run(body())


def test_a_stream_interval_sends_the_first_token_alone_then_n_per_chunk(bigram: Package) -> None:
    params = GenerationParams.validate(max_new_tokens=10, ignore_eos=True)

    async def body() -> tuple[list[StreamChunk], list[StreamChunk]]:
        async with bigram.engine(decode_steps=1) as engine:    # a chunk per step: one token each
            each = await collect(engine, "Z", params)
        async with bigram.engine(stream_interval=4, decode_steps=1) as engine:
            return each, await collect(engine, "Z", params)

    each, grouped = run(body())
    assert [len(c.tokens) for c in grouped] == [1, 4, 4, 1] and [c.final for c in grouped] == [False] * 3 + [True]
    assert [t.token_id for c in grouped for t in c.tokens] == [t.token_id for c in each for t in c.tokens]
    assert "".join(c.text for c in grouped) == "".join(c.text for c in each) == "é漢🙂<|endoftext|>"
    assert grouped[-1].usage == each[-1].usage and grouped[-1].finish_reason == each[-1].finish_reason


def test_a_request_raises_the_servers_stream_interval_and_never_lowers_it(bigram: Package) -> None:
    def asking(interval: int | None) -> GenerationParams:
        return GenerationParams.validate(max_new_tokens=10, ignore_eos=True, stream_interval=interval)

    async def body() -> dict[str, list[int]]:
        async with bigram.engine(decode_steps=1) as engine:          # the server's interval: 1
            each, three = await collect(engine, "Z", asking(None)), await collect(engine, "Z", asking(3))
            rest = await collect(engine, "Z", asking(10))             # the first token, then the rest whole
        async with bigram.engine(stream_interval=4, decode_steps=1) as engine:
            two = await collect(engine, "Z", asking(2))
        texts = {"".join(c.text for c in chunks) for chunks in (each, three, rest, two)}
        assert texts == {"é漢🙂<|endoftext|>"}
        return {name: [len(c.tokens) for c in chunks]
                for name, chunks in (("each", each), ("three", three), ("rest", rest), ("two", two))}

    sizes = run(body())
    assert sizes == {"each": [1] * 10, "three": [1, 3, 3, 3], "rest": [1, 9], "two": [1, 4, 4, 1]}


# ---------------------------------------------------------------- several decode steps per iteration


def test_several_decode_steps_per_iteration_give_the_same_tokens_logprobs_and_endings(gpt: Package) -> None:
    """decode_steps n: the worker thread feeds each row's token straight back up to n times. Rows leave the run
    on their own max_new_tokens (not multiples of n) or eos; min_tokens, penalties and seeded sampling draw
    exactly as one step per iteration does."""
    jobs = [(PROMPTS[0], dict(max_new_tokens=13, logprobs=True, top_logprobs=3, ignore_eos=True)),
            (PROMPTS[1], dict(max_new_tokens=29, temperature=1.2, top_p=0.9, seed=7, frequency_penalty=0.5,
                              ignore_eos=True)),
            (PROMPTS[2], dict(max_new_tokens=5, repetition_penalty=1.3, ignore_eos=True)),
            (PROMPTS[4], dict(max_new_tokens=40, min_tokens=20, temperature=0.8, seed=3))]

    async def body(steps: int) -> list[Any]:
        async with gpt.engine(decode_steps=steps) as engine:
            return await asyncio.gather(*(engine.generate(p, GenerationParams.validate(**kw)) for p, kw in jobs))

    one, many = run(body(1)), run(body(8))
    assert [r.usage.completion_tokens for r in many][:3] == [13, 29, 5]
    assert many[3].usage.completion_tokens >= 20
    assert_same_answers(one, many)


def assert_same_answers(one: list[Any], other: list[Any]) -> None:
    """Answers of one step an iteration (`one`) and of another engine config: the same tokens, texts, endings and
    usage, and the first answer's logprobs (it asked for them) to 1e-5 with the same top candidates."""
    for a, b in zip(one, other, strict=True):
        assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]
        assert (a.text, a.finish_reason, a.usage) == (b.text, b.finish_reason, b.usage)
    for x, y in zip(one[0].tokens, other[0].tokens):
        assert x.logprob is not None and y.logprob is not None and abs(x.logprob - y.logprob) < 1e-5
        assert [t.token_id for t in x.top_logprobs] == [t.token_id for t in y.top_logprobs]


def test_a_run_of_decode_steps_reaches_a_stream_as_one_chunk_of_at_most_n_tokens(bigram: Package) -> None:
    """At most decode_steps a run, and no step that would take the run past decode_run_ms (0: one step)."""
    async def body(**config: float) -> list[StreamChunk]:
        async with bigram.engine(**config) as engine:
            return await collect(engine, "Q", GenerationParams.validate(max_new_tokens=10, ignore_eos=True))

    for run_ms, most in ((10_000, 4), (0, 1)):
        config = {"decode_steps": 4, "decode_run_ms": run_ms}
        chunks = run(body(**config))
        sizes = [len(c.tokens) for c in chunks]
        assert sum(sizes) == 10 and max(sizes) == most, (run_ms, sizes)
        assert "".join(c.text for c in chunks) == "Wyxxxxxxxx"


# ---------------------------------------------------------------- the next step computed while the loop applies one


async def arriving(engine: GenerationEngine, jobs: list[tuple[str, dict]], gap_s: float) -> list[Any]:
    """The jobs' requests sent gap_s apart (so most arrive while others decode), answered whole."""
    async def one(i: int, prompt: str, kwargs: dict) -> Any:
        await asyncio.sleep(gap_s * i)
        return await engine.generate(prompt, GenerationParams.validate(**kwargs))

    return await asyncio.gather(*(one(i, p, kw) for i, (p, kw) in enumerate(jobs)))


def overlapped(metrics: Metrics) -> float:
    return metrics.registry.get_sample_value("ortserve_overlapped_steps_total", {"model": "test"}) or 0.0


def test_steps_computed_while_the_loop_applies_give_the_tokens_logprobs_and_endings_of_one_step_an_iteration(
        gpt: Package) -> None:
    """overlap_step_ms: while requests arrive, the worker computes the step after each iteration's from the tokens
    it just chose, before the loop has taken them. Rows that step ends (max_new_tokens, a stop id, eos after
    min_tokens) are left out of it; the loop takes its tokens after the first step's; penalties, seeded draws and
    logprobs are those of one step an iteration (decode_steps=1, where nothing is computed ahead)."""
    stop_id = greedy_generate(gpt.session, gpt.manifest, gpt.ids(PROMPTS[2]), 6, stop_at_eos=False)[3]
    jobs = [(PROMPTS[0], dict(max_new_tokens=13, logprobs=True, top_logprobs=3, ignore_eos=True)),
            (PROMPTS[1], dict(max_new_tokens=21, temperature=1.2, top_p=0.9, seed=7, frequency_penalty=0.5,
                              ignore_eos=True)),
            (PROMPTS[2], dict(max_new_tokens=1, ignore_eos=True)),
            (PROMPTS[3], dict(max_new_tokens=9, repetition_penalty=1.3, ignore_eos=True)),
            (PROMPTS[4], dict(max_new_tokens=30, min_tokens=12, temperature=0.8, seed=3)),
            (PROMPTS[0], dict(max_new_tokens=17, presence_penalty=0.7, temperature=1.0, seed=11, ignore_eos=True)),
            (PROMPTS[2], dict(max_new_tokens=6, stop_token_ids=[stop_id]))]

    async def body(metrics: Metrics, **config: float) -> list[Any]:
        async with gpt.engine(metrics=metrics, **config) as engine:
            return await arriving(engine, jobs, 0.003)

    one_metrics, ahead_metrics = Metrics(CollectorRegistry()), Metrics(CollectorRegistry())
    one, ahead = run(body(one_metrics, decode_steps=1)), run(body(ahead_metrics, overlap_step_ms=10_000))
    assert overlapped(one_metrics) == 0 and overlapped(ahead_metrics) > 0
    assert [r.usage.completion_tokens for r in ahead][:4] == [13, 21, 1, 9] and ahead[6].finish_reason == "stop"
    assert_same_answers(one, ahead)


@pytest.mark.parametrize("stop, text, reason", [
    (["yx"], "W", "stop"),              # the stop string ends the row while its next token is computed
    (["xxx", "Wyx"], "", "stop"),
    (["xyz"], "Wyxxxxxxxx", "length"),
])
def test_a_stop_string_seen_while_the_next_step_computes_drops_that_token(bigram: Package, stop: list[str],
                                                                            text: str, reason: str) -> None:
    """Stop strings are matched on the loop: a row one ends is still in the step computed meanwhile, and that
    token is dropped (the answer as one step an iteration gives it)."""
    jobs = [("Q", dict(max_new_tokens=10, stop=stop))] * 4

    async def body(metrics: Metrics, **config: float) -> list[Any]:
        async with bigram.engine(metrics=metrics, **config) as engine:
            return await arriving(engine, jobs, 0.002)

    metrics = Metrics(CollectorRegistry())
    one, ahead = run(body(Metrics(CollectorRegistry()), decode_steps=1)), \
        run(body(metrics, overlap_step_ms=10_000))
    assert overlapped(metrics) > 0
    for a, b in zip(one, ahead):
        assert (b.text, b.finish_reason) == (text, reason)
        assert (a.text, a.finish_reason, a.usage) == (b.text, b.finish_reason, b.usage)
        assert [t.token_id for t in a.tokens] == [t.token_id for t in b.tokens]


@pytest.mark.parametrize("step_ms", [0, 1e-6])
def test_no_step_is_computed_ahead_at_0_or_when_the_step_before_took_longer(gpt: Package, step_ms: float) -> None:
    """The overlap applies only while the step before took under overlap_step_ms (no step takes a nanosecond)."""
    metrics = Metrics(CollectorRegistry())

    async def body() -> None:
        async with gpt.engine(metrics=metrics, overlap_step_ms=step_ms) as engine:
            await arriving(engine, [(p, dict(max_new_tokens=8, ignore_eos=True)) for p in PROMPTS], 0.003)

    run(body())
    assert overlapped(metrics) == 0
    assert metrics.registry.get_sample_value("ortserve_generated_tokens_total", {"model": "test"}) == 8 * len(PROMPTS)


def test_a_request_arriving_during_a_run_of_steps_is_admitted_after_the_step_in_progress(gpt: Package) -> None:
    """With room for 1000 steps (and 10 s) a run would finish the long stream first; the arrival stops it after
    one."""
    long = GenerationParams.validate(max_new_tokens=100, ignore_eos=True)

    async def body() -> tuple[list[int], int]:
        async with gpt.engine(decode_steps=1000, decode_run_ms=10_000) as engine:
            first = asyncio.Event()

            async def reader() -> None:
                async for _ in engine.stream(PROMPTS[3], long):
                    first.set()

            task = asyncio.create_task(reader())
            await first.wait()                         # the long stream now runs its steps back to back
            short = await engine.generate(PROMPTS[1], GenerationParams.validate(max_new_tokens=3, ignore_eos=True))
            still_running = engine.active_sequences
            await task
            return [t.token_id for t in short.tokens], still_running

    short, still_running = run(body())
    assert still_running == 1, "the long stream's run of steps finished before the arrival was served"
    assert short == greedy_generate(gpt.session, gpt.manifest, gpt.ids(PROMPTS[1]), 3, stop_at_eos=False)


def test_tokens_held_by_the_stream_interval_reach_the_consumer_before_a_failure(gpt: Package) -> None:
    from server.generation.results import GeneratedToken
    from server.generation.sequence import Sequence

    async def body() -> None:
        seq = Sequence.create(gpt.ids("a"), GenerationParams.validate(), gpt.tokenizer, 100, None, stream_interval=4)
        for i, text in enumerate("xyz"):
            seq.generated.append(i)
            seq.send(StreamChunk(text=text, tokens=[GeneratedToken(i)]))
        first = await seq.next_chunk()                       # the first token is never held
        assert (first.text, seq.held and len(seq.held)) == ("x", 2)
        seq.fail(RuntimeError("decode step failed"))
        held = await seq.next_chunk()
        assert (held.text, [t.token_id for t in held.tokens]) == ("yz", [1, 2])
        with pytest.raises(RuntimeError, match="decode step failed"):
            await seq.next_chunk()

    run(body())


def test_a_request_collected_whole_queues_one_chunk_and_answers_as_streamed(bigram: Package) -> None:
    """A unary request's tokens wait for its final chunk (no queue round trip per token), and its answer is what
    the stream of the same request reassembles to; a failure still delivers what was held before the error."""
    from server.generation.results import GeneratedToken
    from server.generation.sequence import Sequence

    params = GenerationParams.validate(max_new_tokens=10, ignore_eos=True)

    async def body() -> tuple[list[StreamChunk], Any]:
        async with bigram.engine(decode_steps=1) as engine:
            streamed = await collect(engine, "Z", params)
            whole = await engine.generate("Z", params)
        seq = Sequence.create(bigram.ids("Z"), params, bigram.tokenizer, 100, None)
        seq.whole = True
        for i, text in enumerate("xy"):
            seq.generated.append(i)
            seq.send(StreamChunk(text=text, tokens=[GeneratedToken(i)]))
        assert seq.queue.empty() and len(seq.held) == 2
        seq.fail(RuntimeError("decode step failed"))
        held = await seq.next_chunk()
        assert (held.text, [t.token_id for t in held.tokens]) == ("xy", [0, 1])
        with pytest.raises(RuntimeError, match="decode step failed"):
            await seq.next_chunk()
        return streamed, whole

    streamed, whole = run(body())
    assert whole.text == "".join(c.text for c in streamed) == "é漢🙂<|endoftext|>"     # ignore_eos: eos's text too
    assert sum(len(c.tokens) for c in streamed) == 10
    assert [t.token_id for t in whole.tokens] == [t.token_id for c in streamed for t in c.tokens]
    assert (whole.finish_reason, whole.usage) == (streamed[-1].finish_reason, streamed[-1].usage)


def test_ignore_eos_continues_past_it_and_keeps_its_text(bigram: Package) -> None:
    """With ignore_eos, eos is an ordinary token: its text is in the output, as the token is in the list."""
    async def body() -> Any:
        async with bigram.engine() as engine:
            return await engine.generate("Z", GenerationParams.validate(max_new_tokens=12, ignore_eos=True,
                                                                        logprobs=True))

    result = run(body())
    assert (result.text, result.finish_reason) == ("é漢🙂<|endoftext|>xx", "length")
    assert bigram.tokenizer.token_to_id("<|endoftext|>") in [t.token_id for t in result.tokens]


def test_min_tokens_holds_eos_back(bigram: Package) -> None:
    async def body() -> Any:
        async with bigram.engine() as engine:
            alone = await engine.generate("Z", GenerationParams.validate(max_new_tokens=16))
            held = await engine.generate("Z", GenerationParams.validate(max_new_tokens=16, min_tokens=12))
            return alone, held

    alone, held = run(body())
    eos = bigram.tokenizer.token_to_id("<|endoftext|>")
    assert (alone.text, alone.finish_reason, alone.usage.completion_tokens) == ("é漢🙂", "eos", 10)
    assert held.text.startswith("é漢🙂") and held.usage.completion_tokens >= 12
    assert eos not in [t.token_id for t in held.tokens[:12]]


def test_stop_token_ids_end_without_their_text(bigram: Package) -> None:
    stop_id = byte_ids(bigram.tokenizer, "漢")[0]

    async def body() -> Any:
        async with bigram.engine() as engine:
            return await engine.generate("Z", GenerationParams.validate(stop_token_ids=[stop_id]))

    result = run(body())
    assert (result.text, result.finish_reason) == ("é", "stop")
    assert result.tokens[-1].token_id == stop_id


@pytest.mark.parametrize("stop, text, reason", [
    (["yx"], "W", "stop"),              # spans two tokens
    (["xxx", "Wyx"], "", "stop"),       # the earliest match wins
    (["xyz"], "Wyxxxxxxxx", "length"),  # held-back "x" prefixes are released at the end
])
def test_stop_sequences(bigram: Package, stop: list[str], text: str, reason: str) -> None:
    async def body() -> list[StreamChunk]:
        async with bigram.engine() as engine:
            return await collect(engine, "Q", GenerationParams.validate(max_new_tokens=10, stop=stop))

    chunks = run(body())
    assert "".join(c.text for c in chunks) == text
    assert chunks[-1].finish_reason == reason

@pytest.fixture(scope="session")
def duet(gpt: Package, tmp_path_factory: pytest.TempPathFactory) -> Package:
    """After any token: "x" scores 10, "y" 9, everything else 0."""
    vocab = gpt.tokenizer.get_vocab_size()
    table = np.zeros((vocab, vocab), dtype=np.float32)
    table[:, gpt.tokenizer.token_to_id("x")] = 10.0
    table[:, gpt.tokenizer.token_to_id("y")] = 9.0
    path = tmp_path_factory.mktemp("duet") / "model.onnx"
    onnx.save(_bigram_graph(table), str(path))
    manifest = dict(gpt.manifest, cache={"num_layers": 1, "num_heads": 1, "head_dim": 1, "layout": "inplace"}, max_length=64,
                    vocab_size=vocab)
    return Package(_session(path), manifest, gpt.tokenizer)


@pytest.mark.parametrize("params, text", [
    ({}, "xxxxxx"),
    # x once: 10 - 2 = 8 < 9, so y; then y's 7 < 8, so x; 6 < 7 ... they take turns.
    ({"frequency_penalty": 2.0}, "xyxyxy"),
    # A presence penalty is paid once: x 8.5 < y 9, then y 7.5 < x 8.5, and x leads from then on.
    ({"presence_penalty": 1.5}, "xyxxxx"),
    ({"logit_bias": {"y": 2.0}}, "yyyyyy"),        # 9 + 2 > 10
])
def test_presence_frequency_penalties_and_logit_bias_as_openai_defines_them(duet: Package, params: dict,
                                                                             text: str) -> None:
    if "logit_bias" in params:      # written by token text above
        params = {"logit_bias": {duet.tokenizer.token_to_id(t): b for t, b in params["logit_bias"].items()}}

    async def body() -> Any:
        async with duet.engine() as engine:
            return await engine.generate("x", GenerationParams.validate(max_new_tokens=6, ignore_eos=True, **params))

    assert run(body()).text == text


def test_a_logit_bias_outside_the_vocabulary_is_refused(duet: Package) -> None:
    vocab = duet.tokenizer.get_vocab_size()

    async def body() -> Any:
        async with duet.engine() as engine:
            return await engine.generate("x", GenerationParams.validate(logit_bias={vocab: 1.0}))

    with pytest.raises(ValueError, match=r"^parameters.logit_bias: token \d+ is outside the vocabulary"):
        run(body())

# ---------------------------------------------------------------- lifecycle: cancel, deadline, overload


def test_closing_the_stream_frees_the_slot_within_a_step(gpt: Package) -> None:
    """A closed stream's row stops the run of steps in flight (the worker sees it cancelled before its next step),
    so its slot is free while the other stream still decodes. The runs may take 1000 steps: one that went on would
    end only with the keeper's 100th token, and both sequences would leave in the same outcome. Judged by
    sequences, not tokens: the steps computed before the close are applied after it, as many as the load let the
    worker run before the loop got to the close."""
    long = GenerationParams.validate(max_new_tokens=100, ignore_eos=True)

    async def body() -> None:
        async with gpt.engine(decode_steps=1000, decode_run_ms=10_000) as engine:
            keeper_tokens: list[int] = []

            async def keeper() -> None:
                async for chunk in engine.stream(PROMPTS[3], long):
                    keeper_tokens.extend(t.token_id for t in chunk.tokens)

            keeper_task = asyncio.create_task(keeper())
            while not keeper_tokens:
                await asyncio.sleep(0)
            stream = engine.stream(PROMPTS[0], long)
            await stream.__anext__()           # its first token: both now decode in one run
            assert engine.active_sequences == 2
            await stream.aclose()
            while engine.active_sequences == 2:
                await asyncio.sleep(0)
            assert engine.active_sequences == 1 and not keeper_task.done()
            # The unary path: cancelling the task that awaits generate() frees the slot the same way.
            unary = asyncio.create_task(engine.generate(PROMPTS[1], long))
            while engine.active_sequences != 2:
                await asyncio.sleep(0)
            unary.cancel()
            with pytest.raises(asyncio.CancelledError):
                await unary
            while engine.active_sequences == 2:
                await asyncio.sleep(0)
            assert engine.active_sequences == 1 and not keeper_task.done()
            await keeper_task
            assert len(keeper_tokens) == 100 and engine.active_sequences == 0

    run(body())


def test_deadline_before_prefill_raises_and_while_running_cancels(gpt: Package) -> None:
    async def body() -> None:
        async with gpt.engine() as engine:
            params = GenerationParams.validate(max_new_tokens=100, ignore_eos=True)
            with pytest.raises(TimeoutError):
                await engine.generate(PROMPTS[0], params, deadline=time.monotonic() - 1)
            stream = engine.stream(PROMPTS[0], params, deadline=time.monotonic() + 0.05)
            chunks = [await stream.__anext__()]
            time.sleep(0.06)   # block the loop past the deadline: the engine sees it at its next iteration
            chunks += [c async for c in stream]
            assert chunks[-1].finish_reason == "cancelled"
            assert 1 <= chunks[-1].usage.completion_tokens < 100

    run(body())


def test_a_requests_sequences_are_admitted_together_and_cancelled_together(gpt: Package) -> None:
    """generate_many / stream_many (KServe's prompts, OpenAI's prompts x n): refused before any sequence starts
    when one cannot run, INVALID when the request can never fit the queue plus the batch, and every sequence
    gone when the caller cancels or drops its streams."""
    params = GenerationParams.validate(max_new_tokens=60, ignore_eos=True)
    jobs = [(p, params) for p in PROMPTS[:3]]

    async def body() -> None:
        async with gpt.engine(max_batch_size=2, max_waiting=2) as engine:
            with pytest.raises(ValueError, match=r"^inputs\['prompt'\]: 5 sequences in one request exceed the 4"):
                await engine.generate_many([(PROMPTS[0], params)] * 5, field="inputs['prompt']")
            with pytest.raises(ValueError, match="^prompt: "):     # the last one cannot fit the context
                await engine.generate_many([*jobs, ("word " * 5000, params)])
            assert engine.waiting_requests == 0 and engine.active_sequences == 0
            running = engine.stream(PROMPTS[3], params)
            await running.__anext__()                             # one slot taken: room for 2 waiting + 1
            with pytest.raises(OverloadedError, match="this request has 4 sequences and there is room for 3"):
                await engine.generate_many([*jobs, (PROMPTS[4], params)])
            assert engine.waiting_requests == 0 and engine.active_sequences == 1
            await running.aclose()

            task = asyncio.create_task(engine.generate_many(jobs))
            while engine.active_sequences < 2:
                await asyncio.sleep(0.001)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            await asyncio.sleep(0.05)                             # the loop retires them at its next iteration
            assert engine.waiting_requests == 0 and engine.active_sequences == 0

            streams = await engine.stream_many(jobs)
            assert (await streams[0].__anext__()).text is not None
            del streams                                           # dropped unclosed (a response never sent)
            await asyncio.sleep(0.05)
            assert engine.waiting_requests == 0 and engine.active_sequences == 0
            results = await engine.generate_many(jobs)
            assert [r.usage.completion_tokens for r in results] == [60, 60, 60]

    run(body())


def test_admission_limits_raise_overloaded(gpt: Package) -> None:
    params = GenerationParams.validate(max_new_tokens=60, ignore_eos=True)

    async def body() -> None:
        async with gpt.engine(max_batch_size=1, max_waiting=1) as engine:
            running = engine.stream(PROMPTS[0], params)
            await running.__anext__()                       # admitted: the batch (of 1) is full
            waiting = asyncio.create_task(engine.generate(PROMPTS[1], params))
            await asyncio.sleep(0)
            assert engine.waiting_requests == 1
            with pytest.raises(OverloadedError):
                await engine.generate(PROMPTS[2], params)
            await running.aclose()
            assert (await waiting).finish_reason == "length"
        async with gpt.engine(max_tokens_in_flight=50) as engine:   # one request above the budget: never fits
            with pytest.raises(ValueError, match="can never be admitted"):
                await engine.generate(PROMPTS[0], params)
        async with gpt.engine(max_tokens_in_flight=100) as engine:  # fits alone, not beside another: later
            running = engine.stream(PROMPTS[0], params)
            await running.__anext__()
            with pytest.raises(OverloadedError, match="tokens in flight"):
                await engine.generate(PROMPTS[1], params)
            await running.aclose()

    run(body())

# ---------------------------------------------------------------- context and prompt errors


def test_context_overflow_names_the_field_and_truncate_keeps_the_tail(gpt: Package) -> None:
    context = gpt.manifest["max_length"]
    long_prompt = " ".join(["the king"] * context)
    ids = gpt.ids(long_prompt)
    assert len(ids) > context

    async def body() -> None:
        async with gpt.engine() as engine:
            with pytest.raises(ValueError, match=r"^prompt: "):
                await engine.generate(long_prompt, GenerationParams.validate(max_new_tokens=8))
            with pytest.raises(ValueError, match=r"^parameters\.max_new_tokens: "):
                await engine.generate("hi", GenerationParams.validate(max_new_tokens=context))
            result = await engine.generate(long_prompt, GenerationParams.validate(
                max_new_tokens=8, truncate_prompt=True, ignore_eos=True))
            assert result.usage.prompt_tokens == context - 8
            tail = ids[-(context - 8):]
            assert [t.token_id for t in result.tokens] == greedy_generate(
                gpt.session, gpt.manifest, tail, 8, stop_at_eos=False)

    run(body())


def test_empty_prompt_starts_from_bos_or_is_refused(gpt: Package) -> None:
    no_specials = dict(gpt.manifest, special_tokens=dict(gpt.manifest["special_tokens"], bos=None, eos=None))

    async def body() -> None:
        async with gpt.engine() as engine:
            result = await engine.generate("", GenerationParams.validate(max_new_tokens=4, ignore_eos=True))
            assert result.usage.prompt_tokens == 1
            start = gpt.manifest["special_tokens"]["bos"]
            assert [t.token_id for t in result.tokens] == greedy_generate(
                gpt.session, gpt.manifest, [start], 4, stop_at_eos=False)
        async with gpt.engine(manifest=no_specials) as engine:
            with pytest.raises(ValueError, match=r"^prompt: must not be empty"):
                await engine.generate("", GenerationParams.validate())
            with pytest.raises(ValueError, match=r"^parameters\.stop_token_ids\[0\]: "):
                await engine.generate("a", GenerationParams.validate(stop_token_ids=[10 ** 6]))

    run(body())


def test_warmup_runs_and_a_wrong_manifest_is_refused(gpt: Package) -> None:
    GenerationEngine(gpt.session, Manifest.from_dict(gpt.manifest), gpt.tokenizer, GenerationConfig(), None, "w").warmup()
    wrong = dict(gpt.manifest, cache=dict(gpt.manifest["cache"], num_layers=gpt.manifest["cache"]["num_layers"] + 1))
    with pytest.raises(ValueError, match="past_key_values"):
        GenerationEngine(gpt.session, Manifest.from_dict(wrong), gpt.tokenizer, GenerationConfig(), None, "w")

# ---------------------------------------------------------------- metrics


def test_metrics_are_recorded(gpt: Package) -> None:
    metrics = Metrics(CollectorRegistry())
    n = 6

    async def body() -> None:
        async with gpt.engine(metrics=metrics) as engine:
            params = GenerationParams.validate(max_new_tokens=n, ignore_eos=True)
            await asyncio.gather(*(engine.generate(p, params) for p in PROMPTS[:3]))

    run(body())
    get = metrics.registry.get_sample_value
    labels = {"model": "test"}
    assert get("ortserve_generated_tokens_total", labels) == 3 * n
    assert get("ortserve_time_to_first_token_seconds_count", labels) == 3
    assert get("ortserve_inter_token_latency_seconds_count", labels) == 3 * (n - 1)
    steps = get("ortserve_batch_size_count", labels)
    assert steps is not None and get("ortserve_batch_size_sum", labels) > steps   # some steps had batch > 1
    assert get("ortserve_active_sequences", labels) == 0


@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_a_burst_reaching_an_idle_engine_a_moment_apart_is_prefilled_as_one_group(gpt: Package, loop: str) -> None:
    """Requests sent together reach the engine a few hundred microseconds apart: gRPC's poller thread hands each
    to the event loop, which parses and tokenizes it. Woken from idle, the engine waits until none came for a
    quiet spell, so the four prompts go in one call at the large budget: four chunks. Had it started with the
    first alone, the others would be cut into 2-token chunks beside its decode (prefill_chunk_tokens=2): many more.
    The quiet spell here is far longer than the gaps, so a sender thread descheduled on busy cores still lands
    inside it (the default's millisecond did not, under load)."""
    metrics = Metrics(CollectorRegistry())
    prompts = [p for p in PROMPTS if len(gpt.ids(p)) > 2][:4]

    async def body() -> None:
        async with gpt.engine(metrics=metrics, prefill_chunk_tokens=2, arrival_quiet_ms=50,
                              arrival_window_ms=500) as engine:
            params = GenerationParams.validate(max_new_tokens=3, ignore_eos=True)
            running = asyncio.get_running_loop()
            tasks: list[asyncio.Task] = []

            def arrive(prompt: str) -> None:      # on the loop, like a request's handler
                time.sleep(0.0003)                # parsing and tokenizing it
                tasks.append(asyncio.create_task(engine.generate(prompt, params)))

            def sender() -> None:                 # the poller thread: one request every 0.4 ms
                for prompt in prompts:
                    running.call_soon_threadsafe(arrive, prompt)
                    time.sleep(0.0004)

            await asyncio.to_thread(sender)
            while len(tasks) < len(prompts):
                await asyncio.sleep(0.001)
            await asyncio.gather(*tasks)

    eventloop.run(asyncio.wait_for(body(), timeout=60), loop)
    assert metrics.registry.get_sample_value("ortserve_prefill_chunks_total", {"model": "test"}) == len(prompts)


# ---------------------------------------------------------------- robustness


def test_a_padding_tokenizer_does_not_change_the_prompt(gpt: Package) -> None:
    padded = Tokenizer.from_str(gpt.tokenizer.to_str())
    padded.enable_padding(length=gpt.manifest["max_length"])
    params = GenerationParams.validate(max_new_tokens=6, ignore_eos=True)

    async def body() -> Any:
        engine = GenerationEngine(gpt.session, Manifest.from_dict(gpt.manifest), padded, GenerationConfig(), None, "padded")
        await engine.start()
        try:
            return await engine.generate(PROMPTS[1], params)
        finally:
            await engine.stop()

    result = run(body())
    assert result.usage.prompt_tokens == len(gpt.ids(PROMPTS[1]))
    assert [t.token_id for t in result.tokens] == greedy_generate(
        gpt.session, gpt.manifest, gpt.ids(PROMPTS[1]), 6, stop_at_eos=False)
    assert padded.padding is not None   # the caller's tokenizer is left as it was


def test_graph_failures_reach_the_caller_and_the_engine_keeps_serving(gpt: Package) -> None:
    # The graph's position table has max_length rows; a manifest claiming more lets requests run past it.
    context = gpt.manifest["max_length"]
    lying = dict(gpt.manifest, max_length=context * 2)
    over = " ".join(["the"] * (context + 10))
    assert len(gpt.ids(over)) > context
    near = gpt.tokenizer.decode(gpt.ids(" ".join(["the"] * context))[: context - 2])

    async def body() -> None:
        async with gpt.engine(manifest=lying) as engine:
            with pytest.raises(RuntimeError, match="^prefill failed"):
                await engine.generate(over, GenerationParams.validate(max_new_tokens=4))
            tokens = 0
            with pytest.raises(RuntimeError, match="^decode step failed"):
                async for chunk in engine.stream(near, GenerationParams.validate(max_new_tokens=20, ignore_eos=True)):
                    tokens += len(chunk.tokens)
            assert tokens >= 1 and engine.active_sequences == 0
            ok = await engine.generate(PROMPTS[0], GenerationParams.validate(max_new_tokens=4, ignore_eos=True))
            assert ok.finish_reason == "length"

    run(body())


def test_stop_cancels_running_streams_and_refuses_new_ones(gpt: Package) -> None:
    from server.generation import EngineStoppedError

    async def body() -> None:
        engine = GenerationEngine(gpt.session, Manifest.from_dict(gpt.manifest), gpt.tokenizer, GenerationConfig(), None, "stop")
        with pytest.raises(EngineStoppedError):
            await engine.generate("a", GenerationParams.validate())
        await engine.start()
        stream = engine.stream(PROMPTS[0], GenerationParams.validate(max_new_tokens=100, ignore_eos=True))
        await stream.__anext__()
        await engine.stop()
        rest = [c async for c in stream]
        assert rest[-1].final and rest[-1].finish_reason == "cancelled"
        with pytest.raises(EngineStoppedError):
            await engine.generate("a", GenerationParams.validate())

    run(body())
