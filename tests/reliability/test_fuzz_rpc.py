"""Property-based fuzzing (hypothesis) of every RPC's fields against a real server process.

For every generated request the server must answer with a status code the protocol documents for bad
input (never INTERNAL / UNKNOWN, never a hang: each call has a deadline), OK answers must be consistent
with the request, and after each test the process is alive, SERVING, and answers a normal request.

Generation draws the fourth probe's shapes too (issue 40): beams with extreme length_penalty and early_stopping,
prompt_logprobs on an encoder-decoder (a small Marian, tests/reliability/conftest.py).

Cases per RPC: ORTSERVE_FUZZ_EXAMPLES (default 60 in CI; the long run uses 1000, see docs/RELIABILITY.md).
A failing case prints a `@reproduce_failure` blob to replay it.
"""
from __future__ import annotations

import math
import os
import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import grpc
import numpy as np
import pytest
from google.protobuf.message import DecodeError
from grpc_health.v1 import health_pb2, health_pb2_grpc
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from tests.pair_models import add_tiny_embed
from tests.reliability.conftest import SEQ2SEQ
from tests.server_process import ServerProcess, repository_with
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

from protos import grpc_service_pb2, ortserve_pb2
from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

CLASSIFIER, FILL_MASK, GPT, EMBED = "tiny-classifier", "tiny-fill-mask", "tiny-gpt", "tiny-embed"
MODELS = (CLASSIFIER, FILL_MASK, GPT, EMBED)
EXAMPLES = int(os.environ.get("ORTSERVE_FUZZ_EXAMPLES", "60"))
MAX_MESSAGE = 4 * 2 ** 20  # the fuzz server's --max-message-bytes
TIMEOUT = 30.0             # a call still unanswered after this is a hang: DEADLINE_EXCEEDED fails the test

FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None, print_blob=True,
                derandomize=EXAMPLES <= 100,  # CI: the same cases every run; the long run explores
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.data_too_large, HealthCheck.filter_too_much])

C = grpc.StatusCode
BAD_INPUT = {C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND}
# RESOURCE_EXHAUSTED: generation admission (token budget); UNAVAILABLE: a model not SERVING.
GENERATE_CODES = BAD_INPUT | {C.RESOURCE_EXHAUSTED}
LOAD_CODES = BAD_INPUT | {C.FAILED_PRECONDITION}


@pytest.fixture(scope="module")
def server(tiny_repository: Path, tiny_checkpoints, seq2seq_model: Path,
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = add_tiny_embed(tiny_checkpoints, repository_with(tiny_repository, tmp_path_factory.mktemp("fuzz"),
                                                            CLASSIFIER, FILL_MASK, GPT))
    shutil.copytree(seq2seq_model, repo / SEQ2SEQ)
    proc = ServerProcess(repo, ["--max-message-bytes", str(MAX_MESSAGE)])
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def channel(server: ServerProcess) -> Iterator[grpc.Channel]:
    options = [("grpc.max_send_message_length", 64 * 2 ** 20), ("grpc.max_receive_message_length", 64 * 2 ** 20)]
    with grpc.insecure_channel(server.address, options=options) as ch:
        yield ch


@pytest.fixture(scope="module")
def tasks(channel: grpc.Channel) -> pb_grpc.TaskServiceStub:
    return pb_grpc.TaskServiceStub(channel)


@pytest.fixture(scope="module")
def kserve(channel: grpc.Channel) -> kserve_grpc.GRPCInferenceServiceStub:
    return kserve_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture(scope="module")
def labels(tasks: pb_grpc.TaskServiceStub) -> list[str]:
    return list(tasks.ModelInfo(pb.ModelInfoRequest(model=CLASSIFIER)).labels)


@pytest.fixture(autouse=True)
def still_healthy(server: ServerProcess, channel: grpc.Channel, tasks: pb_grpc.TaskServiceStub) -> Iterator[None]:
    """After every test: the process lives, reports SERVING, and answers a normal request of each task."""
    yield
    assert server.proc.poll() is None, "the server died:\n" + "".join(server.lines[-40:])
    health = health_pb2_grpc.HealthStub(channel)
    assert health.Check(health_pb2.HealthCheckRequest(), timeout=10).status == health_pb2.HealthCheckResponse.SERVING
    assert tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="a crown")]),
                          timeout=10).results[0].label
    assert tasks.FillMask(pb.FillMaskRequest(model=FILL_MASK, texts=["a [MASK] b"]), timeout=10).results
    assert tasks.Generate(pb.GenerateRequest(model=GPT, prompt="x", parameters=pb.GenerationParameters(
        max_new_tokens=2, ignore_eos=True)), timeout=10).usage.completion_tokens == 2


class Outcomes:
    """Status codes seen over one test's cases: proves the fuzzing reached the models, not just the gate."""

    def __init__(self) -> None:
        self.codes: dict[grpc.StatusCode, int] = {}

    def add(self, code: grpc.StatusCode) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1

    def expect(self, *codes: grpc.StatusCode) -> None:
        summary = ", ".join(f"{c.name} {n}" for c, n in sorted(self.codes.items(), key=lambda kv: -kv[1]))
        print(f"\n{sum(self.codes.values())} calls: {summary}")  # shown with -s (the long run records it)
        missing = [c for c in codes if not self.codes.get(c)]
        assert not missing, f"no case answered {missing}; seen {self.codes}"


def call(fn: Callable[[], Any], allowed: set[grpc.StatusCode], seen: Outcomes | None = None) -> Any:
    """Runs one RPC; returns its answer (None on an allowed error), fails on any other status."""
    try:
        answer = fn()
    except grpc.RpcError as exc:
        assert exc.code() in allowed, f"{exc.code()}: {exc.details()}"
        assert exc.details(), "an error status without a message"
        if seen is not None:
            seen.add(exc.code())
        return None
    if seen is not None:
        seen.add(C.OK)
    return answer


# ---------------------------------------------------------------------------- strategies

INT32 = st.integers(-2 ** 31, 2 ** 31 - 1)
INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)
UINT64 = st.integers(0, 2 ** 64 - 1)
HOSTILE = ["", " ", "..", "../tiny-classifier", "tiny-classifier/../x", "/etc/passwd", "a\\b", "\x00",
           "tiny-classifier\x00", "x" * 129, "ｔｉｎｙ-classifier", ".hidden", "tiny-classifier/1", "%2e%2e"]
names = st.one_of(st.sampled_from(MODELS), st.sampled_from(HOSTILE), st.text(max_size=40))
versions = st.one_of(st.sampled_from([0, 0, 1, 2, -1]), INT64)


def mostly(usual: Any, others: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly `usual` (a value or a strategy), else anything from `others`: cases that get past the gate
    to the model. (st.one_of does not weight its branches; hypothesis favours small integers, so 0-2 pick
    the usual branch.)"""
    usual_strategy = usual if isinstance(usual, st.SearchStrategy) else st.just(usual)
    return st.integers(0, 3).flatmap(lambda i: others if i == 3 else usual_strategy)

version_strings = st.one_of(st.sampled_from(["", "1", "2", "0", "-1", "01", "1.0", " 1", "²", "１", "١", "1e3",
                                             "99999999999999999999999", "../1"]), st.text(max_size=12))
TRICKY = ["castle", "[MASK]", "", " ", "[MASK] [MASK] [MASK]", "\x00", "\u200d\u200d", "🏰👑⚔️", "שלום עולם", "e\u0301" * 50,
          "castle " * 400, "\n\t\r", "<|endoftext|>", "[CLS] [SEP] [PAD]", "\ufeff", "A" * 3000]
texts = st.one_of(st.text(min_size=1, max_size=200), st.sampled_from(TRICKY))
floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


def maybe(strategy: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), strategy)


# The probe's length penalties (a power that overflowed: 500s), as float32.
LENGTH_PENALTIES = [1000.0, 1100.0, 1e10, 3.4e38, -3.4e38, -1000.0, 0.0, 1.0, 2.0]
GENERATORS = st.sampled_from([GPT, GPT, SEQ2SEQ])


@st.composite
def generation_parameters(draw: st.DrawFn) -> pb.GenerationParameters:
    """Each field mostly in its valid range (so cases reach the engine), sometimes anything."""
    p = pb.GenerationParameters()
    for name, strategy in (("max_new_tokens", mostly(st.integers(1, 24), INT32)),
                           ("temperature", mostly(st.floats(0, 2, width=32), floats32)),
                           ("top_p", mostly(st.floats(0.0625, 1, width=32), floats32)),
                           ("repetition_penalty", mostly(st.floats(0.5, 2, width=32), floats32)),
                           ("seed", UINT64),
                           ("prompt_logprobs", mostly(st.integers(0, 20), INT32)),
                           ("num_beams", mostly(st.integers(1, 4), INT32)),
                           ("length_penalty", mostly(st.sampled_from(LENGTH_PENALTIES), floats32))):
        value = draw(maybe(strategy))
        if value is not None:
            setattr(p, name, value)
    p.top_k = draw(mostly(st.integers(0, 50), INT32))
    p.stop.extend(draw(st.lists(mostly(st.text(min_size=1, max_size=8), st.text(max_size=300)), max_size=3)))
    p.stop_token_ids.extend(draw(st.lists(mostly(st.integers(0, 500), INT32), max_size=4)))
    p.logprobs = draw(st.booleans())
    p.top_logprobs = draw(mostly(st.integers(0, 20), INT32))
    p.truncate_prompt = draw(st.booleans())
    p.ignore_eos = draw(st.booleans())
    p.min_p = draw(mostly(st.floats(0, 1, width=32), floats32))
    p.min_tokens = draw(mostly(st.integers(0, 4), INT32))
    p.presence_penalty = draw(mostly(st.floats(-2, 2, width=32), floats32))
    p.frequency_penalty = draw(mostly(st.floats(-2, 2, width=32), floats32))
    p.early_stopping = draw(mostly(st.sampled_from(["", "true", "false", "never"]), st.text(max_size=8)))
    p.logit_bias.update(draw(st.dictionaries(mostly(st.integers(0, 500), INT32),
                                             mostly(st.floats(-100, 100, width=32), floats32), max_size=3)))
    return p


def max_tokens_of(p: pb.GenerationParameters) -> int:
    return p.max_new_tokens if p.HasField("max_new_tokens") else 32


# ---------------------------------------------------------------------------- the task API


def test_fuzz_classify(tasks: pb_grpc.TaskServiceStub, labels: list[str]) -> None:
    seen = Outcomes()

    @FUZZ
    @given(model=mostly(CLASSIFIER, names), version=mostly(0, versions), top_k=mostly(st.integers(0, 4), INT32),
           inputs=st.lists(st.tuples(texts, mostly("", texts)), max_size=6), truncate=st.booleans())
    def case(model: str, version: int, inputs: list[tuple[str, str]], top_k: int, truncate: bool) -> None:
        request = pb.ClassifyRequest(model=model, version=version, top_k=top_k, truncate=truncate,
                                     inputs=[pb.TextInput(text=t, text_pair=p) for t, p in inputs])
        response = call(lambda: tasks.Classify(request, timeout=TIMEOUT), BAD_INPUT, seen)
        if response is not None:
            assert len(response.results) == len(inputs)
            for r in response.results:
                scores = [s.score for s in r.scores]
                assert len(scores) == (len(labels) if top_k == 0 else min(top_k, len(labels)))
                assert scores == sorted(scores, reverse=True) and all(0 <= s <= 1 for s in scores)
                assert r.label == r.scores[0].label and r.label in labels

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_fill_mask(tasks: pb_grpc.TaskServiceStub) -> None:
    seen = Outcomes()
    masked = st.tuples(texts, texts).map(lambda ab: f"{ab[0]} [MASK] {ab[1]}")

    @FUZZ
    @given(model=mostly(FILL_MASK, names), version=mostly(0, versions), top_k=mostly(st.integers(0, 8), INT32),
           texts_=mostly(st.lists(masked, min_size=1, max_size=4), st.lists(mostly(masked, texts), max_size=4)),
           truncate=st.booleans())
    def case(model: str, version: int, texts_: list[str], top_k: int, truncate: bool) -> None:
        request = pb.FillMaskRequest(model=model, version=version, texts=texts_, top_k=top_k, truncate=truncate)
        response = call(lambda: tasks.FillMask(request, timeout=TIMEOUT), BAD_INPUT, seen)
        if response is not None:
            assert len(response.results) == len(texts_)
            for result in response.results:
                assert result.masks
                for mask in result.masks:
                    assert 0 < len(mask.candidates) <= (top_k or 5)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_generate(tasks: pb_grpc.TaskServiceStub) -> None:
    seen = Outcomes()

    @FUZZ
    @given(model=mostly(GENERATORS, names), version=mostly(0, versions), prompt=texts, params=generation_parameters(),
           ids=st.lists(mostly(st.integers(0, 300), INT32), max_size=6))
    def case(model: str, version: int, prompt: str, params: pb.GenerationParameters, ids: list[int]) -> None:
        request = pb.GenerateRequest(model=model, version=version, prompt=prompt, parameters=params, prompt_ids=ids)
        response = call(lambda: tasks.Generate(request, timeout=TIMEOUT), GENERATE_CODES, seen)
        if response is not None:
            assert 0 < response.usage.completion_tokens <= max_tokens_of(params)
            assert len(response.tokens) == response.usage.completion_tokens
            assert response.finish_reason != pb.FINISH_REASON_UNSPECIFIED

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_generate_stream(tasks: pb_grpc.TaskServiceStub) -> None:
    seen = Outcomes()

    @FUZZ
    @given(model=mostly(GENERATORS, names), version=mostly(0, versions), prompt=texts, params=generation_parameters())
    def case(model: str, version: int, prompt: str, params: pb.GenerationParameters) -> None:
        request = pb.GenerateRequest(model=model, version=version, prompt=prompt, parameters=params)
        chunks = call(lambda: list(tasks.GenerateStream(request, timeout=TIMEOUT)), GENERATE_CODES, seen)
        if chunks is not None:
            assert chunks and chunks[-1].final and not any(c.final for c in chunks[:-1])
            tokens = sum(len(c.tokens) for c in chunks)
            assert tokens == chunks[-1].usage.completion_tokens <= max_tokens_of(params)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_model_info(tasks: pb_grpc.TaskServiceStub) -> None:
    seen = Outcomes()

    @FUZZ
    @given(model=names, version=versions)
    def case(model: str, version: int) -> None:
        info = call(lambda: tasks.ModelInfo(pb.ModelInfoRequest(model=model, version=version), timeout=TIMEOUT),
                    BAD_INPUT, seen)
        if info is not None:
            assert info.status.name == model and (version == 0 or info.status.version == version)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND)


def test_fuzz_tokenize_and_detokenize(tasks: pb_grpc.TaskServiceStub) -> None:
    """Every model kind tokenizes; what it answers detokenizes, and ids of any value are refused by name."""
    seen = Outcomes()

    @FUZZ
    @given(model=mostly(st.sampled_from(MODELS), names), version=mostly(0, versions), prompt=texts,
           ids=st.lists(mostly(st.integers(0, 300), INT32), max_size=8))
    def case(model: str, version: int, prompt: str, ids: list[int]) -> None:
        answer = call(lambda: tasks.Tokenize(pb.TokenizeRequest(model=model, version=version, prompt=prompt),
                                             timeout=TIMEOUT), BAD_INPUT, seen)
        if answer is not None:
            for t in answer.tokens:
                assert 0 <= t.start <= t.stop <= len(prompt) and t.id >= 0
            if answer.tokens and len(answer.tokens) <= answer.max_length:
                call(lambda: tasks.Detokenize(pb.DetokenizeRequest(model=model, version=version,
                                                                   tokens=[t.id for t in answer.tokens]),
                                              timeout=TIMEOUT), {C.OK})
        call(lambda: tasks.Detokenize(pb.DetokenizeRequest(model=model, version=version, tokens=ids),
                                      timeout=TIMEOUT), BAD_INPUT, seen)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_embed_dimensions(tasks: pb_grpc.TaskServiceStub) -> None:
    seen = Outcomes()

    @FUZZ
    @given(model=mostly(EMBED, names), version=mostly(0, versions), texts_=st.lists(texts, max_size=4),
           dimensions=maybe(mostly(st.sampled_from([64, 64, 1, 0, 65]), INT32)), truncate=st.booleans())
    def case(model: str, version: int, texts_: list[str], dimensions: int | None, truncate: bool) -> None:
        request = pb.EmbedRequest(model=model, version=version, texts=texts_, truncate=truncate,
                                  dimensions=dimensions)
        response = call(lambda: tasks.Embed(request, timeout=TIMEOUT), BAD_INPUT, seen)
        if response is not None:
            assert len(response.embeddings) == len(texts_) and response.dimension == 64
            assert dimensions in (None, 64)    # tiny-embed declares no Matryoshka shortening

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_rerank(tasks: pb_grpc.TaskServiceStub) -> None:
    """Rerank by the embedding model (cosine), and refusals: a 3-label classifier, bad top_n, empty texts."""
    seen = Outcomes()

    @FUZZ
    @given(model=mostly(EMBED, names), version=mostly(0, versions), query=texts,
           documents=mostly(st.lists(texts, min_size=1, max_size=6), st.lists(texts, max_size=6)),
           top_n=maybe(mostly(st.integers(1, 7), INT32)), flags=st.tuples(st.booleans(), st.booleans(), st.booleans()))
    def case(model: str, version: int, query: str, documents: list[str], top_n: int | None,
             flags: tuple[bool, bool, bool]) -> None:
        truncate, raw_scores, return_documents = flags
        request = pb.RerankRequest(model=model, version=version, query=query, documents=documents, top_n=top_n,
                                   truncate=truncate, raw_scores=raw_scores, return_documents=return_documents)
        response = call(lambda: tasks.Rerank(request, timeout=TIMEOUT), BAD_INPUT, seen)
        if response is not None:
            n = len(documents) if top_n is None else min(top_n, len(documents))
            assert len(response.results) == n and len({r.index for r in response.results}) == n
            scores = [r.score for r in response.results]
            assert scores == sorted(scores, reverse=True) and all(-1.0001 <= s <= 1.0001 for s in scores)
            assert all(r.document == (documents[r.index] if return_documents else "") for r in response.results)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


# ---------------------------------------------------------------------------- KServe v2


def test_fuzz_kserve_model_queries(kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    seen = Outcomes()
    classes = {"ModelReady": kserve_pb.ModelReadyRequest, "ModelMetadata": kserve_pb.ModelMetadataRequest,
               "ModelStatistics": kserve_pb.ModelStatisticsRequest}

    @FUZZ
    @given(name=names, version=mostly("", version_strings), method=st.sampled_from(sorted(classes)))
    def case(name: str, version: str, method: str) -> None:
        request = classes[method](name=name, version=version)
        answer = call(lambda: getattr(kserve, method)(request, timeout=TIMEOUT), BAD_INPUT, seen)
        if answer is not None and method == "ModelMetadata":
            assert answer.name == name and answer.inputs and answer.outputs

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND)


DATATYPES = ["BOOL", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32", "UINT64", "FP16", "FP32",
             "FP64", "BYTES", "BF16", "int64", ""]
INPUT_NAMES = ["input_ids", "attention_mask", "token_type_ids", "position_ids", "past_key_values.0.key",
               "past_key_values.0.value", "past_key_values.1.key", "past_key_values.1.value", "text", "text_pair",
               "prompt", "logits", ""]
dims = st.one_of(st.integers(0, 6), st.integers(-3, 3), INT64)


@st.composite
def infer_tensor(draw: st.DrawFn, request: kserve_pb.ModelInferRequest, raw: bool) -> None:
    """Adds one input: any name/datatype/shape; data raw or in contents, often of a plausible size."""
    tensor = request.inputs.add(name=draw(st.one_of(st.sampled_from(INPUT_NAMES), st.text(max_size=12))),
                                datatype=draw(st.one_of(st.sampled_from(DATATYPES), st.text(max_size=6))),
                                shape=draw(st.lists(dims, max_size=4)))
    count = math.prod(tensor.shape) if all(0 <= d <= 64 for d in tensor.shape) else None
    if raw:
        itemsize = {"BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2, "INT32": 4, "UINT32": 4,
                    "FP32": 4}.get(tensor.datatype, 8)
        if count is not None and tensor.datatype == "INT64" and draw(st.booleans()):
            # Right length: token ids inside or outside the tiny vocabularies (~400).
            ids = draw(st.lists(st.integers(-5, 600), min_size=count, max_size=count))
            request.raw_input_contents.append(np.asarray(ids, dtype="<i8").tobytes())
        elif count is not None and tensor.datatype == "BYTES" and draw(st.booleans()):
            items = draw(st.lists(st.binary(max_size=40), min_size=count, max_size=count))
            request.raw_input_contents.append(b"".join(len(b).to_bytes(4, "little") + b for b in items))
        elif count is not None and draw(st.booleans()):
            request.raw_input_contents.append(draw(st.binary(min_size=count * itemsize, max_size=count * itemsize)))
        else:
            request.raw_input_contents.append(draw(st.binary(max_size=300)))
    else:
        n = count if count is not None and draw(st.booleans()) else draw(st.integers(0, 8))
        field = draw(st.sampled_from(["int64_contents", "int_contents", "fp32_contents", "bytes_contents",
                                      "bool_contents", "uint64_contents"]))
        values = {"int64_contents": st.integers(-5, 600), "int_contents": INT32, "fp32_contents": floats32,
                  "bytes_contents": st.binary(max_size=30), "bool_contents": st.booleans(),
                  "uint64_contents": UINT64}[field]
        getattr(tensor.contents, field).extend(draw(st.lists(values, min_size=n, max_size=n)))


@st.composite
def infer_requests(draw: st.DrawFn) -> kserve_pb.ModelInferRequest:
    request = kserve_pb.ModelInferRequest(model_name=draw(names), model_version=draw(version_strings),
                                          id=draw(st.text(max_size=10)))
    raw = draw(st.booleans())
    for _ in range(draw(st.integers(0, 5))):
        draw(infer_tensor(request, raw))
    if raw and draw(st.integers(0, 9)) == 0:  # one entry too many or too few
        if request.raw_input_contents and draw(st.booleans()):
            request.raw_input_contents.pop()
        else:
            request.raw_input_contents.append(b"\x00" * 8)
    for name in draw(st.lists(st.one_of(st.sampled_from(["logits", "present.0.key", "label", "text"]),
                                        st.text(max_size=8)), max_size=3)):
        request.outputs.add(name=name)
    for key in draw(st.lists(st.sampled_from(["max_new_tokens", "temperature", "top_p", "top_k", "seed", "stop",
                                              "truncate", "ignore_eos", "repetition_penalty", "presence_penalty", "min_p", "min_tokens",
                                              "frequency_penalty", "logit_bias", "junk"]),
                             max_size=4, unique=True)):
        param = request.parameters[key]
        kind = draw(st.sampled_from(["bool_param", "int64_param", "string_param", "double_param", "uint64_param"]))
        setattr(param, kind, draw({"bool_param": st.booleans(), "int64_param": st.one_of(st.integers(-3, 24), INT64),
                                   "string_param": st.one_of(st.just('["x"]'), st.text(max_size=10)),
                                   "double_param": st.floats(), "uint64_param": UINT64}[kind]))
    return request


GPT_CACHE = {"num_layers": 2, "num_heads": 2, "head_dim": 32}  # the tiny GPT's (tests/conftest.py)


@st.composite
def graph_requests(draw: st.DrawFn) -> kserve_pb.ModelInferRequest:
    """Raw graph inputs of the right names, mostly of consistent shapes, with values drawn wide (ids beyond
    the vocabulary, sequences beyond max_length, NaN caches), sometimes one of them broken."""
    model = draw(st.sampled_from(MODELS))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    b = draw(st.integers(0, 3))
    s = draw(st.one_of(st.integers(1, 12), st.integers(0, 140)))

    def ints(shape: tuple[int, ...], low: int, high: int) -> np.ndarray:
        return rng.integers(low, high, size=shape, dtype=np.int64)

    if model == GPT:
        past = draw(st.one_of(st.integers(0, 6), st.integers(0, 130)))
        feeds = {"input_ids": ints((b, s), -2, 420), "attention_mask": ints((b, past + s), 0, 2),
                 "position_ids": ints((b, s), -2, 140)}
        cache_shape = (b, GPT_CACHE["num_heads"], past, GPT_CACHE["head_dim"])
        for i in range(GPT_CACHE["num_layers"]):
            for kind in ("key", "value"):
                values = rng.normal(size=cache_shape).astype(np.float32)
                if draw(st.integers(0, 9)) == 0:
                    values[...] = np.nan
                feeds[f"past_key_values.{i}.{kind}"] = values
    else:
        feeds = {"input_ids": ints((b, s), -2, 420), "attention_mask": ints((b, s), 0, 2),
                 "token_type_ids": ints((b, s), 0, draw(st.sampled_from([1, 2, 3])))}
    mutation = draw(st.sampled_from(["none", "none", "none", "drop", "datatype", "shape", "extra", "cast"]))
    victim = draw(st.sampled_from(sorted(feeds)))
    if mutation == "drop":
        del feeds[victim]
    elif mutation == "extra":
        feeds["unexpected"] = ints((b, s), 0, 5)
    elif mutation == "cast":
        feeds[victim] = feeds[victim].astype(np.int32 if feeds[victim].dtype == np.int64 else np.float64)
    request = kserve_pb.ModelInferRequest(model_name=model)
    for name, array in feeds.items():
        datatype = {"int64": "INT64", "int32": "INT32", "float32": "FP32", "float64": "FP64"}[array.dtype.name]
        shape = list(array.shape)
        if name == victim and mutation == "datatype":
            datatype = "FP32" if datatype == "INT64" else "INT64"
        if name == victim and mutation == "shape":
            shape = shape[:-1] + [shape[-1] + 1] if shape else [1]
        request.inputs.add(name=name, datatype=datatype, shape=shape)
        request.raw_input_contents.append(array.tobytes())
    return request


def test_fuzz_model_infer(kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    seen = Outcomes()

    @FUZZ
    @given(request=mostly(graph_requests(), infer_requests()))
    def case(request: kserve_pb.ModelInferRequest) -> None:
        response = call(lambda: kserve.ModelInfer(request, timeout=TIMEOUT), GENERATE_CODES, seen)
        if response is not None:
            assert response.model_name == request.model_name and response.id == request.id
            assert len(response.raw_output_contents) == len(response.outputs) > 0
            if request.outputs:
                assert [o.name for o in response.outputs] == [o.name for o in request.outputs]

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


@st.composite
def text_mode_requests(draw: st.DrawFn) -> kserve_pb.ModelInferRequest:
    """The 'text mode' of ModelInfer (BYTES inputs named text / text_pair / prompt), near-valid."""
    model = draw(st.sampled_from(MODELS))
    request = kserve_pb.ModelInferRequest(model_name=model)
    names_ = {CLASSIFIER: ["text", "text_pair"], FILL_MASK: ["text"], GPT: ["prompt"], EMBED: ["text"]}[model]
    rows = draw(st.integers(0, 3))
    for name in draw(st.lists(st.sampled_from(names_), min_size=1, max_size=2, unique=True)):
        tensor = request.inputs.add(name=name, datatype="BYTES", shape=[draw(st.sampled_from([rows, rows, rows + 1]))])
        values = draw(st.lists(st.one_of(texts.map(str.encode), texts.map(lambda t: f"{t} [MASK]".encode()),
                                         st.binary(max_size=20)),
                               min_size=tensor.shape[0], max_size=tensor.shape[0]))
        tensor.contents.bytes_contents.extend(values)
    for key, strategy in (("max_new_tokens", st.integers(-2, 12)), ("temperature", st.floats(-1, 2)),
                          ("truncate", st.booleans()), ("stop", st.one_of(st.just('["a", "b"]'), st.text(max_size=12)))):
        if draw(st.booleans()):
            value = draw(strategy)
            param = request.parameters[key]
            if isinstance(value, bool):
                param.bool_param = value
            elif isinstance(value, int):
                param.int64_param = value
            elif isinstance(value, float):
                param.double_param = value
            else:
                param.string_param = value
    return request


def test_fuzz_model_infer_text_mode(kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    seen = Outcomes()

    def stop_param(value: str) -> kserve_pb.ModelInferRequest:
        request = kserve_pb.ModelInferRequest(model_name=GPT)
        request.inputs.add(name="prompt", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"x")
        request.parameters["stop"].string_param = value
        return request

    @FUZZ
    @given(request=text_mode_requests())
    @example(request=stop_param("Infinity"))  # found by the long run: JSON that is not a list was INTERNAL
    @example(request=stop_param("5"))
    def case(request: kserve_pb.ModelInferRequest) -> None:
        response = call(lambda: kserve.ModelInfer(request, timeout=TIMEOUT), GENERATE_CODES, seen)
        if response is not None:
            rows = request.inputs[0].shape[0]
            for out in response.outputs:
                assert out.shape[0] == rows

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


def test_fuzz_repository(kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    seen = Outcomes()

    @FUZZ
    @given(ready=st.booleans(), name=names, load=st.booleans())
    @example(ready=True, name="no-such-model", load=True)     # a well-formed name nobody serves: NOT_FOUND,
    @example(ready=False, name="no-such-model", load=False)   # whatever the derandomized draws hold
    def case(ready: bool, name: str, load: bool) -> None:
        index = kserve.RepositoryIndex(kserve_pb.RepositoryIndexRequest(ready=ready), timeout=TIMEOUT)
        assert {m.name for m in index.models} >= set(MODELS)
        if load:  # reloading a real model is allowed and must leave it SERVING
            call(lambda: kserve.RepositoryModelLoad(kserve_pb.RepositoryModelLoadRequest(model_name=name),
                                                    timeout=TIMEOUT), LOAD_CODES, seen)
        elif name not in MODELS:  # (unloading a real one is legitimate; the health check afterwards needs them)
            call(lambda: kserve.RepositoryModelUnload(kserve_pb.RepositoryModelUnloadRequest(model_name=name),
                                                      timeout=TIMEOUT), LOAD_CODES, seen)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT, C.NOT_FOUND)


def test_fuzz_health_check(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    seen = Outcomes()

    @FUZZ
    @given(service=st.one_of(st.just(""), names))
    def case(service: str) -> None:
        answer = call(lambda: health.Check(health_pb2.HealthCheckRequest(service=service), timeout=TIMEOUT),
                      {C.NOT_FOUND}, seen)
        if answer is not None:
            assert service in ("", *MODELS)

    case()
    seen.expect(C.OK, C.NOT_FOUND)


# ---------------------------------------------------------------------------- raw bytes on the wire


def _methods() -> list[tuple[str, Any, bool]]:
    """(path, request class, server-streaming) of every unary-request method of both services."""
    found = []
    for module, service in ((ortserve_pb2, "TaskService"), (grpc_service_pb2, "GRPCInferenceService")):
        descriptor = module.DESCRIPTOR.services_by_name[service]
        for m in descriptor.methods:
            found.append((f"/{descriptor.full_name}/{m.name}", getattr(module, m.input_type.name), m.server_streaming))
    return found


METHODS = _methods()


def test_fuzz_raw_bytes_on_every_method(channel: grpc.Channel) -> None:
    seen = Outcomes()

    @FUZZ
    @given(method=st.sampled_from(METHODS), data=st.one_of(
        st.binary(max_size=200),
        st.sampled_from([b"", b"\x0a\x05\xff\xfe\xfd\xfc\xfb", b"\x0a\xff\xff\xff\xff\x0f", b"\xff" * 16,
                         b"\x0a\x0f" + b"tiny-classifier", b"\x1a\x00" * 50])))
    def case(method: tuple[str, Any, bool], data: bytes) -> None:
        path, message_class, streaming = method
        allowed = GENERATE_CODES | LOAD_CODES | {C.UNAVAILABLE}
        try:
            message = message_class.FromString(data)
        except DecodeError:
            # Bytes that are not a message: the server's deserializer (server/grpc/decoding.py) answers
            # INVALID_ARGUMENT, naming the field when it is a string that is not UTF-8.
            allowed = {C.INVALID_ARGUMENT}
        else:
            if path.endswith("RepositoryModelUnload") and message.model_name in MODELS:
                return  # a legitimate request; the health check afterwards needs the models
        if streaming:
            call(lambda: list(channel.unary_stream(path)(data, timeout=TIMEOUT)), allowed, seen)
        else:
            call(lambda: channel.unary_unary(path)(data, timeout=TIMEOUT), allowed, seen)

    case()
    seen.expect(C.OK, C.INVALID_ARGUMENT)


# ---------------------------------------------------------------------------- oversized messages


def test_oversized_messages_are_resource_exhausted(tasks: pb_grpc.TaskServiceStub,
                                                   kserve: kserve_grpc.GRPCInferenceServiceStub) -> None:
    big_text = "castle " * (MAX_MESSAGE // 7 + 1000)  # refused before any tokenization (grpc reads the size)
    for rpc in (lambda: tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=big_text)]),
                                       timeout=TIMEOUT),
                lambda: tasks.Generate(pb.GenerateRequest(model=GPT, prompt=big_text), timeout=TIMEOUT),
                lambda: list(tasks.GenerateStream(pb.GenerateRequest(model=GPT, prompt=big_text), timeout=TIMEOUT))):
        with pytest.raises(grpc.RpcError) as info:
            rpc()
        assert info.value.code() == C.RESOURCE_EXHAUSTED, info.value.details()
    request = kserve_pb.ModelInferRequest(model_name=CLASSIFIER)
    request.inputs.add(name="input_ids", datatype="INT64", shape=[1, MAX_MESSAGE // 8 + 16])
    request.raw_input_contents.append(b"\x00" * (MAX_MESSAGE + 128))
    with pytest.raises(grpc.RpcError) as info:
        kserve.ModelInfer(request, timeout=TIMEOUT)
    assert info.value.code() == C.RESOURCE_EXHAUSTED, info.value.details()

    # Just under the limit is read and judged on its content (here: longer than the model's max_length).
    seq = (MAX_MESSAGE - 64 * 1024) // (3 * 8)
    ids = np.zeros((1, seq), np.int64).tobytes()
    request = kserve_pb.ModelInferRequest(model_name=CLASSIFIER)
    for name in ("input_ids", "attention_mask", "token_type_ids"):
        request.inputs.add(name=name, datatype="INT64", shape=[1, seq])
        request.raw_input_contents.append(ids)
    assert request.ByteSize() < MAX_MESSAGE
    with pytest.raises(grpc.RpcError) as info:
        kserve.ModelInfer(request, timeout=TIMEOUT)
    assert info.value.code() == C.INVALID_ARGUMENT and "max_length" in info.value.details(), info.value.details()
