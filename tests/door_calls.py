"""How the HTTP and KServe tests call a server: one plain HTTP request (exactly the bytes given), a JSON POST,
tritonclient tensors of numpy feeds, and the task API's greedy text as the reference answer."""
from __future__ import annotations

import http.client
import json
import ssl
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.http as thttp

from protos import ortserve_pb2 as pb
from protos import ortserve_pb2_grpc as pb_grpc


def http_request(url: str, method: str = "GET", body: bytes | None = None, headers: dict[str, str] | None = None,
                 cafile: Path | None = None) -> tuple[int, dict[str, str], bytes]:
    """One plain HTTP request (http.client: sends exactly what it is given)."""
    scheme, _, rest = url.partition("://")
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.rpartition(":")
    if scheme == "https":
        context = ssl.create_default_context(cafile=str(cafile)) if cafile else None
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(host, int(port), timeout=60, context=context)
    else:
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        conn.request(method, "/" + path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def post_json(url: str, payload: Any, headers: dict[str, str] | None = None, method: str = "POST",
              cafile: Path | None = None) -> tuple[int, Any]:
    status, _, body = http_request(url, method, json.dumps(payload).encode(),
                                   {"content-type": "application/json", **(headers or {})}, cafile)
    return status, json.loads(body)


def classifier_feeds(text_ids: list[list[int]]) -> dict[str, np.ndarray]:
    """A BERT classifier's three int64 inputs for rows of token ids (no padding)."""
    ids = np.array(text_ids, dtype=np.int64)
    return {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}


def triton_inputs(module: Any, feeds: dict[str, np.ndarray], binary: bool = True) -> list[Any]:
    """tritonclient InferInputs (`module`: tritonclient.http or .grpc) of numpy feeds; BYTES for object arrays."""
    inputs = []
    for name, array in feeds.items():
        datatype = "BYTES" if array.dtype == object else "INT64"
        tensor = module.InferInput(name, list(array.shape), datatype)
        if module is thttp:
            tensor.set_data_from_numpy(array, binary_data=binary)
        else:
            tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return inputs


def grpc_greedy_text(tasks: pb_grpc.TaskServiceStub, prompt: str, n: int, model: str = "tiny-gpt") -> str:
    """The task API's greedy answer of `n` tokens (ignore_eos): the reference for the HTTP doors' answers."""
    return tasks.Generate(pb.GenerateRequest(model=model, prompt=prompt, parameters=pb.GenerationParameters(
        max_new_tokens=n, temperature=0.0, ignore_eos=True))).text
