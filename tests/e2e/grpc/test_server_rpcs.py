"""The server process end to end: every RPC of both services with real clients, bad inputs, batching,
cancellation, metrics, and the process never importing torch.

One real server (`python -m server --port 0`) on the shared tiny repository serves the whole module.
Expected values come from onnxruntime / tokenizers run directly on the package files in the test, never
from the server's own code.
"""
from __future__ import annotations

import json
import os
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families
from tests.server_process import ServerProcess, metrics_url_of, rpc_error, sample, wait_ready
from tokenizers import Tokenizer
from tritonclient.grpc import service_pb2 as kserve_pb, service_pb2_grpc as kserve_grpc

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc

CLASSIFIER, FILL_MASK, GPT = "tiny-classifier", "tiny-fill-mask", "tiny-gpt"


@dataclass
class Running:
    proc: ServerProcess
    repository: Path
    metrics_url: str

    @property
    def address(self) -> str:
        return self.proc.address


@pytest.fixture(scope="module")
def server(tiny_repository: Path) -> Any:
    # Python's own import profiler lists every module the process imports (see the torch test below).
    saved = os.environ.get("PYTHONPROFILEIMPORTTIME")
    os.environ["PYTHONPROFILEIMPORTTIME"] = "1"
    try:
        proc = ServerProcess(tiny_repository, ["--metrics-port", "0", "--max-queue-delay-ms", "10"])
    finally:
        if saved is None:
            del os.environ["PYTHONPROFILEIMPORTTIME"]
        else:
            os.environ["PYTHONPROFILEIMPORTTIME"] = saved
    try:
        wait_ready(proc.address)
        yield Running(proc, tiny_repository, metrics_url_of(proc))
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def channel(server: Running) -> Any:
    with grpc.insecure_channel(server.address) as ch:
        yield ch


@pytest.fixture(scope="module")
def tasks(channel: grpc.Channel) -> pb_grpc.TaskServiceStub:
    return pb_grpc.TaskServiceStub(channel)


@pytest.fixture(scope="module")
def kserve(server: Running) -> triton.InferenceServerClient:
    return triton.InferenceServerClient(server.address)


# ---------------------------------------------------------------- references computed in the test

def package(server: Running, name: str) -> Path:
    return server.repository / name / "1"


def manifest(server: Running, name: str) -> dict[str, Any]:
    return json.loads((package(server, name) / "model.json").read_text())


def tokenizer(server: Running, name: str) -> Tokenizer:
    tok = Tokenizer.from_file(str(package(server, name) / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    return tok


def reference_session(server: Running, name: str, variant: str) -> ort.InferenceSession:
    m = manifest(server, name)
    return ort.InferenceSession(str(package(server, name) / m["variants"][variant]),
                                providers=["CPUExecutionProvider"])


def encoder_feeds(tok: Tokenizer, text: str, pair: str | None = None) -> dict[str, np.ndarray]:
    enc = tok.encode(text, pair) if pair else tok.encode(text)
    ids = np.array([enc.ids], dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "token_type_ids": np.array([enc.type_ids], dtype=np.int64)}


def padded_batch(tok: Tokenizer, texts: list[str], pad_id: int) -> dict[str, np.ndarray]:
    encodings = [tok.encode(t) for t in texts]
    width = max(len(e.ids) for e in encodings)
    ids = np.full((len(texts), width), pad_id, dtype=np.int64)
    mask = np.zeros_like(ids)
    for i, e in enumerate(encodings):
        ids[i, :len(e.ids)] = e.ids
        mask[i, :len(e.ids)] = 1
    return {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def scrape(server: Running) -> dict[str, list[Any]]:
    text = urllib.request.urlopen(server.metrics_url, timeout=10).read().decode()
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


# ---------------------------------------------------------------- KServe v2 with the real tritonclient

def test_kserve_health_and_metadata(kserve: triton.InferenceServerClient) -> None:
    assert kserve.is_server_live() and kserve.is_server_ready()
    for name in (CLASSIFIER, FILL_MASK, GPT):
        assert kserve.is_model_ready(name)
        assert kserve.is_model_ready(name, "1")
    assert not kserve.is_model_ready("no-such-model")
    meta = kserve.get_server_metadata()
    assert meta.name == "ortserve" and "model_repository" in meta.extensions
    model = kserve.get_model_metadata(CLASSIFIER)
    assert model.name == CLASSIFIER and list(model.versions) == ["1"] and model.platform == "onnxruntime_onnx"
    assert [(i.name, i.datatype, list(i.shape)) for i in model.inputs] == [
        ("input_ids", "INT64", [-1, -1]), ("attention_mask", "INT64", [-1, -1]), ("token_type_ids", "INT64", [-1, -1])]
    assert [(o.name, o.datatype) for o in model.outputs] == [("logits", "FP32")]
    gpt = kserve.get_model_metadata(GPT, "1")
    assert "past_key_values.0.key" in [i.name for i in gpt.inputs]


def _triton_inputs(feeds: dict[str, np.ndarray]) -> list[triton.InferInput]:
    inputs = []
    for name, array in feeds.items():
        tensor = triton.InferInput(name, list(array.shape), "INT64")
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def test_kserve_infer_raw_tensors_equals_onnxruntime(server: Running, kserve: triton.InferenceServerClient) -> None:
    tok = tokenizer(server, CLASSIFIER)
    feeds = encoder_feeds(tok, "The king rode to the castle with his banner.")
    result = kserve.infer(CLASSIFIER, _triton_inputs(feeds), request_id="r-1",
                          outputs=[triton.InferRequestedOutput("logits")])
    # The server loads the manifest's default CPU variant (int8 for this package).
    variant = manifest(server, CLASSIFIER)["default_variant"]["cpu"]
    expected = reference_session(server, CLASSIFIER, variant).run(["logits"], feeds)[0]
    np.testing.assert_allclose(result.as_numpy("logits"), expected, rtol=1e-5, atol=1e-6)
    response = result.get_response()
    assert response.id == "r-1" and response.model_version == "1"


def test_kserve_infer_on_a_decoder_graph_is_refused_naming_the_model(server: Running,
                                                                     kserve: triton.InferenceServerClient) -> None:
    """A decoder's cache buffers are the engine's: raw tensor calls are refused (text mode generates)."""
    ids = np.array([[1, 2, 3]], dtype=np.int64)
    with pytest.raises(triton.InferenceServerException, match="raw graph calls are not served"):
        kserve.infer(GPT, _triton_inputs({"input_ids": ids, "attention_mask": np.ones_like(ids),
                                          "position_ids": np.arange(3, dtype=np.int64)[None]}))


def test_kserve_infer_bytes_tensors_run_the_task(server: Running, kserve: triton.InferenceServerClient) -> None:
    texts = ["Roses bloom in the quiet garden.", "The soldiers stormed the castle wall — ünïcode!"]
    tensor = triton.InferInput("text", [2], "BYTES")
    tensor.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
    result = kserve.infer(CLASSIFIER, [tensor])
    tok = tokenizer(server, CLASSIFIER)
    m = manifest(server, CLASSIFIER)
    session = reference_session(server, CLASSIFIER, m["default_variant"]["cpu"])
    # One request = one batch, right-padded to its longest row (int8 dynamic quantization makes the
    # numbers depend on the batch's padding, so the reference is built the same way).
    expected = softmax(session.run(["logits"], padded_batch(tok, texts, m["special_tokens"]["pad"]))[0])
    np.testing.assert_allclose(result.as_numpy("probabilities"), expected, rtol=1e-4, atol=1e-6)
    assert [x.decode() for x in result.as_numpy("label")] == [m["labels"][i] for i in expected.argmax(1)]

    masked = triton.InferInput("text", [1], "BYTES")
    masked.set_data_from_numpy(np.array([b"the [MASK] walked to the [MASK] ."], dtype=object))
    filled = kserve.infer(FILL_MASK, [masked]).as_numpy("sequence")[0].decode()
    assert "[MASK]" not in filled and "walked to the" in filled  # random MLM: any tokens, both filled

    prompt = triton.InferInput("prompt", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"To be"], dtype=object))
    params = {"max_new_tokens": 3, "ignore_eos": True}
    generated = kserve.infer(GPT, [prompt], parameters=params)
    assert generated.as_numpy("finish_reason")[0] == b"length"
    assert generated.as_numpy("text").dtype == object


def test_kserve_statistics_index_unload_and_load(server: Running, kserve: triton.InferenceServerClient,
                                                 tasks: pb_grpc.TaskServiceStub, channel: grpc.Channel) -> None:
    before = kserve.get_inference_statistics(CLASSIFIER).model_stats[0]
    tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="a b c"), pb.TextInput(text="d")]))
    after = kserve.get_inference_statistics(CLASSIFIER).model_stats[0]
    assert after.inference_count == before.inference_count + 2
    assert after.execution_count >= before.execution_count + 1
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1
    assert after.last_inference > 0 and after.batch_stats
    assert {s.name for s in kserve.get_inference_statistics().model_stats} == {CLASSIFIER, FILL_MASK, GPT}

    index = kserve.get_model_repository_index()
    assert {(m.name, m.version, m.state) for m in index.models} == {
        (CLASSIFIER, "1", "SERVING"), (FILL_MASK, "1", "SERVING"), (GPT, "1", "SERVING")}

    kserve.unload_model(FILL_MASK)
    try:
        assert not kserve.is_model_ready(FILL_MASK)
        err = rpc_error(lambda: tasks.FillMask(pb.FillMaskRequest(model=FILL_MASK, texts=["a [MASK]"])))
        assert err.code() == grpc.StatusCode.UNAVAILABLE and "UNLOADED" in err.details()
        ready_only = kserve_grpc.GRPCInferenceServiceStub(channel).RepositoryIndex(
            kserve_pb.RepositoryIndexRequest(ready=True))
        assert {(m.name, m.state) for m in ready_only.models} == {(CLASSIFIER, "SERVING"), (GPT, "SERVING")}
    finally:
        kserve.load_model(FILL_MASK)
    assert kserve.is_model_ready(FILL_MASK)
    assert tasks.FillMask(pb.FillMaskRequest(model=FILL_MASK, texts=["a [MASK]"])).results[0].masks


# ---------------------------------------------------------------- the task API with generated stubs

def test_classify_matches_onnxruntime_and_orders_labels(server: Running, tasks: pb_grpc.TaskServiceStub) -> None:
    m = manifest(server, CLASSIFIER)
    session = reference_session(server, CLASSIFIER, m["default_variant"]["cpu"])
    tok = tokenizer(server, CLASSIFIER)
    inputs = [("The fish swam past the harbour.", None), ("A crown for the king", "and a sword for the knight")]
    # One input per request: a batch of one row has no padding, so int8 numbers match the reference exactly.
    singles = [tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=t, text_pair=p or "")]))
               for t, p in inputs]
    assert all(r.model == CLASSIFIER and r.version == 1 and len(r.results) == 1 for r in singles)
    both = tasks.Classify(pb.ClassifyRequest(
        model=CLASSIFIER, inputs=[pb.TextInput(text=t, text_pair=p or "") for t, p in inputs]))
    assert [r.label for r in both.results] == [r.results[0].label for r in singles]  # in order
    for (text, pair), result in zip(inputs, [r.results[0] for r in singles]):
        probs = softmax(session.run(["logits"], encoder_feeds(tok, text, pair))[0][0])
        order = np.argsort(-probs)
        assert [s.label for s in result.scores] == [m["labels"][i] for i in order]
        np.testing.assert_allclose([s.score for s in result.scores], probs[order], rtol=1e-4, atol=1e-5)
        assert result.label == m["labels"][order[0]] and result.score == pytest.approx(probs[order[0]], rel=1e-4)
    top1 = tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="tide")], top_k=1))
    assert len(top1.results[0].scores) == 1


def test_fill_mask_candidates_match_onnxruntime(server: Running, tasks: pb_grpc.TaskServiceStub) -> None:
    tok = tokenizer(server, FILL_MASK)
    text = "the king sat on his [MASK] in the [MASK] ."
    feeds = encoder_feeds(tok, text)
    logits = reference_session(server, FILL_MASK, "fp32").run(["logits"], feeds)[0][0]
    mask_id = tok.token_to_id("[MASK]")
    positions = [i for i, t in enumerate(feeds["input_ids"][0]) if t == mask_id]
    response = tasks.FillMask(pb.FillMaskRequest(model=FILL_MASK, texts=[text], top_k=3))
    masks = response.results[0].masks
    assert [m.position for m in masks] == positions and len(positions) == 2
    for mask in masks:
        probs = softmax(logits[mask.position])
        assert [c.token_id for c in mask.candidates] == list(np.argsort(-probs)[:3])
        np.testing.assert_allclose([c.score for c in mask.candidates], np.sort(probs)[::-1][:3], rtol=1e-4)
        for c in mask.candidates:
            assert c.sequence.count("[MASK]") == 1  # only this mask is filled
    default_k = tasks.FillMask(pb.FillMaskRequest(model=FILL_MASK, texts=["a [MASK] b"]))
    assert len(default_k.results[0].masks[0].candidates) == 5


def test_generate_equals_offline_greedy_and_stream_equals_unary(server: Running,
                                                                 tasks: pb_grpc.TaskServiceStub) -> None:
    from testing.offline import greedy_generate  # reference loop, no engine, no batching

    m = manifest(server, GPT)
    tok = tokenizer(server, GPT)
    prompt = "Shall I compare thee"
    expected_ids = greedy_generate(reference_session(server, GPT, "fp32"), m, tok.encode(prompt).ids, 12,
                                   stop_at_eos=False)
    params = pb.GenerationParameters(max_new_tokens=12, ignore_eos=True, logprobs=True)
    response = tasks.Generate(pb.GenerateRequest(model=GPT, prompt=prompt, parameters=params))
    assert [t.token_id for t in response.tokens] == expected_ids
    assert response.finish_reason == pb.FINISH_REASON_LENGTH
    assert response.usage.prompt_tokens == len(tok.encode(prompt).ids) and response.usage.completion_tokens == 12
    assert all(t.logprob <= 0 for t in response.tokens) and response.version == 1
    assert response.total_time_ms >= response.time_to_first_token_ms > 0

    chunks = list(tasks.GenerateStream(pb.GenerateRequest(model=GPT, prompt=prompt, parameters=params)))
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])
    assert chunks[-1].finish_reason == pb.FINISH_REASON_LENGTH and chunks[-1].usage.completion_tokens == 12
    assert "".join(c.text for c in chunks) == response.text
    assert [t.token_id for c in chunks for t in c.tokens] == expected_ids
    assert all(c.model == GPT and c.version == 1 for c in chunks)


def test_list_models_and_model_info(server: Running, tasks: pb_grpc.TaskServiceStub) -> None:
    listed = tasks.ListModels(pb.ListModelsRequest()).models
    assert {(s.name, s.version, s.task, s.state) for s in listed} == {
        (CLASSIFIER, 1, "classify", "SERVING"), (FILL_MASK, 1, "fill-mask", "SERVING"), (GPT, 1, "generate", "SERVING")}
    info = tasks.ModelInfo(pb.ModelInfoRequest(model=CLASSIFIER))
    m = manifest(server, CLASSIFIER)
    assert list(info.labels) == m["labels"] and info.max_length == m["max_length"]
    assert info.variant == m["default_variant"]["cpu"] and list(info.providers) == ["CPUExecutionProvider"]
    assert list(info.versions) == [1] and info.max_batch_size >= 1
    assert json.loads(info.manifest_json) == m
    assert tasks.ModelInfo(pb.ModelInfoRequest(model=FILL_MASK)).mask_token == "[MASK]"


def test_health_per_model_and_reflection(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    serving = health_pb2.HealthCheckResponse.SERVING
    assert health.Check(health_pb2.HealthCheckRequest(service="")).status == serving
    assert health.Check(health_pb2.HealthCheckRequest(service=GPT)).status == serving
    err = rpc_error(lambda: health.Check(health_pb2.HealthCheckRequest(service="nope")))
    assert err.code() == grpc.StatusCode.NOT_FOUND
    watch = health.Watch(health_pb2.HealthCheckRequest(service=CLASSIFIER))
    assert next(watch).status == serving
    watch.cancel()

    reflect = reflection_pb2_grpc.ServerReflectionStub(channel)
    answers = list(reflect.ServerReflectionInfo(iter([
        reflection_pb2.ServerReflectionRequest(list_services=""),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="inference.GRPCInferenceService"),
        reflection_pb2.ServerReflectionRequest(file_containing_symbol="ortserve.v1.TaskService")])))
    services = {s.name for s in answers[0].list_services_response.service}
    assert {"ortserve.v1.TaskService", "inference.GRPCInferenceService", "grpc.health.v1.Health"} <= services
    assert answers[1].file_descriptor_response.file_descriptor_proto and answers[2].file_descriptor_response


# ---------------------------------------------------------------- bad input matrix

LONG_TEXT = " ".join(["castle"] * 400)
TASK_ERRORS = [
    ("unknown model", "Classify", pb.ClassifyRequest(model="nope", inputs=[pb.TextInput(text="x")]),
     grpc.StatusCode.NOT_FOUND, "nope"),
    ("unknown version", "Classify", pb.ClassifyRequest(model=CLASSIFIER, version=9, inputs=[pb.TextInput(text="x")]),
     grpc.StatusCode.NOT_FOUND, "version"),
    ("path traversal", "Classify", pb.ClassifyRequest(model="../tiny-classifier", inputs=[pb.TextInput(text="x")]),
     grpc.StatusCode.INVALID_ARGUMENT, "model"),
    ("no model", "Classify", pb.ClassifyRequest(inputs=[pb.TextInput(text="x")]), grpc.StatusCode.INVALID_ARGUMENT,
     "model"),
    ("empty text", "Classify", pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="ok"),
                                                                           pb.TextInput(text="  ")]),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[1].text"),
    ("no inputs", "Classify", pb.ClassifyRequest(model=CLASSIFIER), grpc.StatusCode.INVALID_ARGUMENT, "inputs"),
    ("negative top_k", "Classify", pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="x")], top_k=-1),
     grpc.StatusCode.INVALID_ARGUMENT, "top_k"),
    ("too long", "Classify", pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=LONG_TEXT)]),
     grpc.StatusCode.INVALID_ARGUMENT, "inputs[0]"),
    ("wrong task", "Classify", pb.ClassifyRequest(model=GPT, inputs=[pb.TextInput(text="x")]),
     grpc.StatusCode.INVALID_ARGUMENT, "model"),
    ("no mask token", "FillMask", pb.FillMaskRequest(model=FILL_MASK, texts=["a [MASK]", "no mask here"]),
     grpc.StatusCode.INVALID_ARGUMENT, "texts[1]"),
    ("no texts", "FillMask", pb.FillMaskRequest(model=FILL_MASK), grpc.StatusCode.INVALID_ARGUMENT, "texts"),
    ("negative max_new_tokens", "Generate", pb.GenerateRequest(
        model=GPT, prompt="x", parameters=pb.GenerationParameters(max_new_tokens=-1)),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.max_new_tokens"),
    ("top_p above 1", "Generate", pb.GenerateRequest(
        model=GPT, prompt="x", parameters=pb.GenerationParameters(top_p=1.5)),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.top_p"),
    ("negative temperature", "Generate", pb.GenerateRequest(
        model=GPT, prompt="x", parameters=pb.GenerationParameters(temperature=-0.5)),
     grpc.StatusCode.INVALID_ARGUMENT, "parameters.temperature"),
    ("prompt beyond context", "Generate", pb.GenerateRequest(
        model=GPT, prompt=LONG_TEXT, parameters=pb.GenerationParameters(max_new_tokens=4)),
     grpc.StatusCode.INVALID_ARGUMENT, "prompt"),
]


@pytest.mark.parametrize("method, request_, code, field", [t[1:] for t in TASK_ERRORS],
                         ids=[t[0] for t in TASK_ERRORS])
def test_task_api_bad_inputs(tasks: pb_grpc.TaskServiceStub, method: str, request_: Any, code: grpc.StatusCode,
                             field: str) -> None:
    err = rpc_error(lambda: getattr(tasks, method)(request_))
    assert err.code() == code, err.details()
    assert field in err.details()


def test_truncate_turns_too_long_into_success(tasks: pb_grpc.TaskServiceStub) -> None:
    response = tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=LONG_TEXT)],
                                                 truncate=True))
    assert len(response.results) == 1


def _raw_request(**changes: Any) -> kserve_pb.ModelInferRequest:
    """A valid classifier request in raw form, then `changes` applied (tritonclient's own messages)."""
    ids = np.array([[2, 50, 60, 3]], dtype=np.int64)
    request = kserve_pb.ModelInferRequest(model_name=CLASSIFIER)
    for name, array in (("input_ids", ids), ("attention_mask", np.ones_like(ids)),
                        ("token_type_ids", np.zeros_like(ids))):
        request.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    for key, mutate in changes.items():
        mutate(request)
    return request


def _drop_input(r: kserve_pb.ModelInferRequest) -> None:
    del r.inputs[2]
    del r.raw_input_contents[2]


def _fp32_ids(r: kserve_pb.ModelInferRequest) -> None:
    r.inputs[0].datatype = "FP32"
    r.raw_input_contents[0] = np.zeros((1, 4), np.float32).tobytes()


def _rank_one(r: kserve_pb.ModelInferRequest) -> None:
    for t in r.inputs:
        del t.shape[:]
        t.shape.append(4)


def _batch_mismatch(r: kserve_pb.ModelInferRequest) -> None:
    r.inputs[1].shape[:] = [2, 2]


KSERVE_ERRORS = [
    ("unknown model", dict(m=lambda r: setattr(r, "model_name", "nope")), grpc.StatusCode.NOT_FOUND, "nope"),
    ("traversal", dict(m=lambda r: setattr(r, "model_name", "..")), grpc.StatusCode.INVALID_ARGUMENT, "model"),
    ("missing input", dict(m=_drop_input), grpc.StatusCode.INVALID_ARGUMENT, "token_type_ids"),
    ("wrong dtype", dict(m=_fp32_ids), grpc.StatusCode.INVALID_ARGUMENT, "input_ids']. datatype".replace(" ", "")),
    ("wrong rank", dict(m=_rank_one), grpc.StatusCode.INVALID_ARGUMENT, "shape"),
    ("dims disagree", dict(m=_batch_mismatch), grpc.StatusCode.INVALID_ARGUMENT, "attention_mask"),
    ("byte length", dict(m=lambda r: r.raw_input_contents.__setitem__(1, b"\x00" * 5)),
     grpc.StatusCode.INVALID_ARGUMENT, "raw_input_contents for 'attention_mask'"),
    ("raw count", dict(m=lambda r: r.raw_input_contents.pop()), grpc.StatusCode.INVALID_ARGUMENT,
     "raw_input_contents"),
    ("unknown output", dict(m=lambda r: r.outputs.add(name="nope")), grpc.StatusCode.INVALID_ARGUMENT,
     "outputs[0].name"),
    ("token id out of vocab", dict(m=lambda r: r.raw_input_contents.__setitem__(
        0, np.array([[2, 10 ** 6, 5, 3]], np.int64).tobytes())), grpc.StatusCode.INVALID_ARGUMENT, "input_ids"),
    ("bad version", dict(m=lambda r: setattr(r, "model_version", "one")), grpc.StatusCode.INVALID_ARGUMENT,
     "model_version"),
]


@pytest.mark.parametrize("changes, code, field", [t[1:] for t in KSERVE_ERRORS], ids=[t[0] for t in KSERVE_ERRORS])
def test_kserve_bad_inputs(channel: grpc.Channel, changes: dict[str, Any], code: grpc.StatusCode, field: str) -> None:
    stub = kserve_grpc.GRPCInferenceServiceStub(channel)
    good = stub.ModelInfer(_raw_request())
    assert good.outputs[0].name == "logits"  # the unmodified request is fine
    err = rpc_error(lambda: stub.ModelInfer(_raw_request(**changes)))
    assert err.code() == code, err.details()
    assert field in err.details(), err.details()


def test_kserve_bytes_tensor_with_bad_length_prefix(channel: grpc.Channel) -> None:
    stub = kserve_grpc.GRPCInferenceServiceStub(channel)
    request = kserve_pb.ModelInferRequest(model_name=CLASSIFIER)
    request.inputs.add(name="text", datatype="BYTES", shape=[2])
    request.raw_input_contents.append(b"\x03\x00\x00\x00abc\x09\x00\x00\x00xy")  # second length runs past the end
    err = rpc_error(lambda: stub.ModelInfer(request))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "BYTES" in err.details()


# ---------------------------------------------------------------- batching, cancellation, metrics

def test_concurrent_requests_are_batched(server: Running, tasks: pb_grpc.TaskServiceStub) -> None:
    def batches_over_one() -> float:
        samples = scrape(server)["ortserve_batch_size"]
        total = sample(samples, "ortserve_batch_size_count", model=CLASSIFIER)
        single = sample(samples, "ortserve_batch_size_bucket", model=CLASSIFIER, le="1.0")
        return total - single

    before = batches_over_one()
    texts = [f"the {w} of the harbour" for w in ("boat", "sail", "anchor", "tide", "shore", "wave", "fish", "island")]
    futures = [tasks.Classify.future(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=t)]))
               for t in texts * 3]
    labels = [f.result(timeout=30).results[0].label for f in futures]
    assert len(labels) == 24
    solo = [tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text=t)])).results[0].label
            for t in texts]
    assert labels == solo * 3  # batching (with padding) does not change answers
    assert batches_over_one() > before


def test_cancelled_stream_stops_generating(server: Running, tasks: pb_grpc.TaskServiceStub) -> None:
    def generated() -> float:
        return sample(scrape(server)["ortserve_generated_tokens"], "ortserve_generated_tokens_total", model=GPT)

    before = generated()
    params = pb.GenerationParameters(max_new_tokens=100, ignore_eos=True)
    stream = tasks.GenerateStream(pb.GenerateRequest(model=GPT, prompt="Once", parameters=params))
    next(stream)
    stream.cancel()
    time.sleep(0.5)
    assert generated() - before < 100  # the sequence left the batch instead of running to max_new_tokens
    assert sample(scrape(server)["ortserve_active_sequences"], "ortserve_active_sequences", model=GPT) == 0
    # the engine still works for the next request
    assert tasks.Generate(pb.GenerateRequest(model=GPT, prompt="x", parameters=pb.GenerationParameters(
        max_new_tokens=2, ignore_eos=True))).usage.completion_tokens == 2


def test_metrics_count_requests_per_model_method_and_code(server: Running, tasks: pb_grpc.TaskServiceStub) -> None:
    def requests(code: str) -> float:
        return sample(scrape(server)["ortserve_requests"], "ortserve_requests_total",
                      model=CLASSIFIER, method="Classify", code=code)

    ok, bad = requests("OK"), requests("INVALID_ARGUMENT")
    tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="x")]))
    rpc_error(lambda: tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="")])))
    assert requests("OK") == ok + 1 and requests("INVALID_ARGUMENT") == bad + 1
    families = scrape(server)
    assert sample(families["ortserve_request_latency_seconds"], "ortserve_request_latency_seconds_count",
                  model=CLASSIFIER, method="Classify") >= 2
    assert sample(families["ortserve_queue_time_seconds"], "ortserve_queue_time_seconds_count", model=CLASSIFIER) > 0
    assert sample(families["ortserve_model_ready"], "ortserve_model_ready", model=GPT, version="1") == 1
    # unknown model names do not become label values
    rpc_error(lambda: tasks.Classify(pb.ClassifyRequest(model="made-up", inputs=[pb.TextInput(text="x")])))
    assert not any(s.labels.get("model") == "made-up" for s in scrape(server)["ortserve_requests"])


# ---------------------------------------------------------------- torch stays out (keep last: uses all paths)

def test_server_process_never_imports_torch(server: Running, tasks: pb_grpc.TaskServiceStub,
                                            kserve: triton.InferenceServerClient) -> None:
    tasks.Classify(pb.ClassifyRequest(model=CLASSIFIER, inputs=[pb.TextInput(text="x")]))
    tasks.FillMask(pb.FillMaskRequest(model=FILL_MASK, texts=["a [MASK]"]))
    list(tasks.GenerateStream(pb.GenerateRequest(model=GPT, prompt="x")))
    kserve.infer(CLASSIFIER, _triton_inputs({"input_ids": np.array([[2, 3]]), "attention_mask": np.ones((1, 2), int),
                                             "token_type_ids": np.zeros((1, 2), int)}))
    lines = [line for line in server.proc.lines if line.startswith("import time:")]
    modules = {line.rsplit("|", 1)[-1].strip() for line in lines}
    assert {"onnxruntime", "grpc", "tokenizers", "server.dataplane"} <= modules  # the profiler really ran
    offenders = sorted(m for m in modules if m == "torch" or m.startswith("torch."))
    assert not offenders, f"the server imported {offenders[:5]}"
