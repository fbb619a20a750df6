"""The KServe v2 REST door end to end with the real tritonclient.http: health, metadata, raw and text-mode infer
(JSON and the binary extension), statistics and the repository, bad tensors naming the field. gRPC answers
(tritonclient.grpc, the task API) on the same server are the reference: one data plane behind both.

The server is tests/e2e/conftest.py's (the shared tiny repository, HTTP port on).
"""
from __future__ import annotations

import json
from typing import Any, Iterator

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from protos import ortserve_pb2_grpc as pb_grpc
from tests.door_calls import classifier_feeds, grpc_greedy_text, http_request, post_json, triton_inputs
from tests.server_process import ServerProcess

CLASSIFIER, FILL_MASK, GPT = "tiny-classifier", "tiny-fill-mask", "tiny-gpt"


@pytest.fixture(scope="module")
def http_client(server: ServerProcess) -> Iterator[thttp.InferenceServerClient]:
    client = thttp.InferenceServerClient(f"{server.host}:{server.http_port}")
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> tgrpc.InferenceServerClient:
    return tgrpc.InferenceServerClient(server.address)


def test_kserve_http_health_and_metadata_equal_grpc(http_client: thttp.InferenceServerClient,
                                                    grpc_client: tgrpc.InferenceServerClient) -> None:
    assert http_client.is_server_live() and http_client.is_server_ready()
    for name in (CLASSIFIER, FILL_MASK, GPT):
        assert http_client.is_model_ready(name) and http_client.is_model_ready(name, "1")
    assert not http_client.is_model_ready("no-such-model")
    meta = http_client.get_server_metadata()
    assert meta["name"] == "ortserve" and meta["extensions"] == list(grpc_client.get_server_metadata().extensions)
    for name in (CLASSIFIER, GPT):
        rest = http_client.get_model_metadata(name, "1")
        ref = grpc_client.get_model_metadata(name)
        assert rest["name"] == ref.name and rest["versions"] == list(ref.versions) and rest["platform"] == ref.platform
        assert [(t["name"], t["datatype"], t["shape"]) for t in rest["inputs"]] == [
            (t.name, t.datatype, list(t.shape)) for t in ref.inputs]
        assert [(t["name"], t["datatype"], t["shape"]) for t in rest["outputs"]] == [
            (t.name, t.datatype, list(t.shape)) for t in ref.outputs]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as info:
        http_client.get_model_metadata("nope")
    assert info.value.status() == "404"


@pytest.mark.parametrize("binary_in, binary_out", [(True, True), (False, False), (True, False), (False, True)])
def test_kserve_http_infer_equals_grpc(http_client: thttp.InferenceServerClient,
                                       grpc_client: tgrpc.InferenceServerClient, binary_in: bool,
                                       binary_out: bool) -> None:
    feeds = classifier_feeds([[2, 45, 17, 33, 3], [2, 8, 9, 3, 0]])
    feeds["attention_mask"][1, 4] = 0
    rest = http_client.infer(CLASSIFIER, triton_inputs(thttp, feeds, binary_in), request_id="h-1",
                             outputs=[thttp.InferRequestedOutput("logits", binary_data=binary_out)])
    ref = grpc_client.infer(CLASSIFIER, triton_inputs(tgrpc, feeds)).as_numpy("logits")
    got = rest.as_numpy("logits")
    assert got.dtype == np.float32 and got.shape == ref.shape == (2, 3)
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    response = rest.get_response()
    assert response["id"] == "h-1" and response["model_version"] == "1"
    assert ("parameters" in response["outputs"][0]) == binary_out


def test_kserve_http_all_outputs_binary_by_default(http_client: thttp.InferenceServerClient) -> None:
    """No outputs listed: tritonclient asks binary_data_output, the answer carries the binary extension."""
    result = http_client.infer(CLASSIFIER, triton_inputs(thttp, classifier_feeds([[2, 45, 3]])))
    assert result.as_numpy("logits").shape == (1, 3)
    assert result.get_response()["outputs"][0]["parameters"]["binary_data_size"] == 12


def test_kserve_http_text_mode_equals_grpc(http_client: thttp.InferenceServerClient,
                                           grpc_client: tgrpc.InferenceServerClient) -> None:
    texts = np.array(["Roses bloom in the garden.".encode(), "The king's banner — ünïcode!".encode()], dtype=object)
    for binary in (True, False):
        rest = http_client.infer(CLASSIFIER, triton_inputs(thttp, {"text": texts}, binary))
        ref = grpc_client.infer(CLASSIFIER, triton_inputs(tgrpc, {"text": texts}))
        assert list(rest.as_numpy("label")) == list(ref.as_numpy("label"))
        np.testing.assert_allclose(rest.as_numpy("probabilities"), ref.as_numpy("probabilities"), rtol=1e-6)
    masked = np.array([b"the [MASK] walked to the [MASK] ."], dtype=object)
    assert (http_client.infer(FILL_MASK, triton_inputs(thttp, {"text": masked})).as_numpy("sequence")[0]
            == grpc_client.infer(FILL_MASK, triton_inputs(tgrpc, {"text": masked})).as_numpy("sequence")[0])
    prompt = np.array([b"To be or not"], dtype=object)
    params = {"max_new_tokens": 6, "ignore_eos": True}
    rest = http_client.infer(GPT, triton_inputs(thttp, {"prompt": prompt}), parameters=params)
    ref = grpc_client.infer(GPT, triton_inputs(tgrpc, {"prompt": prompt}), parameters=params)
    assert rest.as_numpy("text")[0] == ref.as_numpy("text")[0]
    assert rest.as_numpy("finish_reason")[0] == b"length"


def test_kserve_http_text_mode_stop_as_a_json_list(server: ServerProcess, tasks: pb_grpc.TaskServiceStub) -> None:
    full = grpc_greedy_text(tasks, "Now is the winter", 12)
    stop = full[4:7]
    status, body = post_json(f"{server.http_url}/v2/models/{GPT}/infer", {
        "inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["Now is the winter"]}],
        "parameters": {"max_new_tokens": 12, "ignore_eos": True, "stop": [stop]}})
    assert status == 200, body
    outputs = {o["name"]: o["data"][0] for o in body["outputs"]}
    assert outputs == {"text": full[:full.index(stop)], "finish_reason": "stop"}


def test_kserve_text_mode_penalties_and_logit_bias_over_http_and_grpc(server: ServerProcess,
                                                                      grpc_client: tgrpc.InferenceServerClient
                                                                      ) -> None:
    """The logit bias is a JSON object over HTTP and its text over gRPC; a bias of 100 wins every step, and a
    frequency penalty of 2 makes the random model's repeated token give way (its logits lie within 2)."""
    def http(parameters: dict[str, Any]) -> str:
        status, body = post_json(f"{server.http_url}/v2/models/{GPT}/infer", {
            "inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["To be"]}],
            "parameters": {"max_new_tokens": 6, "ignore_eos": True, **parameters}})
        assert status == 200, body
        return {o["name"]: o["data"][0] for o in body["outputs"]}["text"]

    prompt = tgrpc.InferInput("prompt", [1], "BYTES")
    prompt.set_data_from_numpy(np.array([b"To be"], dtype=object))
    forced_http = http({"logit_bias": {"300": 100}})
    forced_grpc = grpc_client.infer(GPT, [prompt], parameters={
        "max_new_tokens": 6, "ignore_eos": True, "logit_bias": json.dumps({"300": 100})}).as_numpy("text")[0].decode()
    assert forced_http == forced_grpc and len(forced_http) > 0 and forced_http == forced_http[:len(forced_http) // 6] * 6
    assert http({"frequency_penalty": 2.0}) != http({})
    status, body = post_json(f"{server.http_url}/v2/models/{GPT}/infer", {
        "inputs": [{"name": "prompt", "datatype": "BYTES", "shape": [1], "data": ["To be"]}],
        "parameters": {"logit_bias": ["300"]}})
    assert status == 400 and "parameters.logit_bias" in body["error"], body


def test_kserve_http_statistics_and_repository(http_client: thttp.InferenceServerClient) -> None:
    before = http_client.get_inference_statistics(CLASSIFIER)["model_stats"][0]["inference_count"]
    http_client.infer(CLASSIFIER, triton_inputs(thttp, classifier_feeds([[2, 5, 3]])))
    after = http_client.get_inference_statistics(CLASSIFIER, "1")["model_stats"][0]
    assert after["inference_count"] == before + 1 and after["version"] == "1"
    index = http_client.get_model_repository_index()
    assert {(m["name"], m["state"]) for m in index} == {(CLASSIFIER, "SERVING"), (FILL_MASK, "SERVING"),
                                                        (GPT, "SERVING")}
    http_client.unload_model(FILL_MASK)
    try:
        assert not http_client.is_model_ready(FILL_MASK)
    finally:
        http_client.load_model(FILL_MASK)
    assert http_client.is_model_ready(FILL_MASK)


@pytest.mark.parametrize("header, field", [
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1, 3], "data": [1, 2]}]}, "inputs[0].data"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT99", "shape": [1], "data": [1]}]}, "inputs[0].datatype"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [1], "data": ["x"]}]}, "inputs[0].data"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [-1], "data": []}]}, "inputs[0].shape"),
    ({"inputs": [{"name": "input_ids", "datatype": "INT64", "shape": [2],
                  "parameters": {"binary_data_size": 999}}]}, "inputs[0].parameters.binary_data_size"),
    ({"inputs": []}, "inputs"),
    ({"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["a"]}],
      "outputs": [{"name": "nope"}]}, "outputs[0].name"),
])
def test_kserve_http_bad_tensors_are_400_naming_the_field(server: ServerProcess, header: dict[str, Any],
                                                          field: str) -> None:
    status, body = post_json(f"{server.http_url}/v2/models/{CLASSIFIER}/infer", header)
    assert status == 400 and body["error"].startswith(field), body


def test_kserve_http_binary_tail_with_raw_http(server: ServerProcess) -> None:
    """The binary extension by hand: a JSON header of Inference-Header-Content-Length bytes, then raw tensors."""
    ids = np.array([[2, 45, 17, 3]], dtype=np.int64)
    tensors = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    header = json.dumps({"inputs": [{"name": n, "datatype": "INT64", "shape": list(a.shape),
                                     "parameters": {"binary_data_size": a.nbytes}} for n, a in tensors.items()],
                         "outputs": [{"name": "logits", "parameters": {"binary_data": True}}]}).encode()
    body = header + b"".join(a.tobytes() for a in tensors.values())
    status, headers, content = http_request(f"{server.http_url}/v2/models/{CLASSIFIER}/versions/1/infer", "POST", body,
                                        {"Inference-Header-Content-Length": str(len(header)),
                                         "content-type": "application/octet-stream"})
    assert status == 200 and headers["content-type"] == "application/octet-stream"
    n = int(headers["inference-header-content-length"])
    answer = json.loads(content[:n])
    assert answer["outputs"][0]["parameters"]["binary_data_size"] == 12 == len(content) - n
    assert np.frombuffer(content[n:], dtype="<f4").shape == (3,)
    status, _, content = http_request(f"{server.http_url}/v2/models/{CLASSIFIER}/infer", "POST", body,
                                  {"Inference-Header-Content-Length": str(len(body) + 1)})
    assert status == 400 and b"inference-header-content-length" in content
