"""The generated stubs are fresh, and our KServe proto is wire-identical to the standard one.

The reference for "standard" is the descriptor compiled into the real tritonclient package
(tritonclient.grpc.service_pb2), not anything derived from our own file.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2
from tests.server_process import ROOT

PROTOS = ROOT / "protos"


def test_stubs_are_not_stale(tmp_path: Path) -> None:
    """Regenerating with the documented command reproduces every committed stub byte for byte."""
    # The script runs `python`: this interpreter's, whether or not its venv is activated.
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    subprocess.run(["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)], check=True, cwd=ROOT, env=env)
    generated = sorted((tmp_path / "protos").iterdir())
    assert {p.name for p in generated} >= {"grpc_service_pb2.py", "grpc_service_pb2_grpc.py",
                                           "grpc_service_pb2.pyi", "ortserve_pb2.py", "ortserve_pb2_grpc.py",
                                           "ortserve_pb2.pyi"}
    stale = [p.name for p in generated if not (PROTOS / p.name).is_file()
             or (PROTOS / p.name).read_bytes() != p.read_bytes()]
    assert not stale, f"stale stubs (run bash scripts/gen_protos.sh): {stale}"


def _compile(tmp_path: Path) -> descriptor_pb2.FileDescriptorProto:
    out = tmp_path / "kserve.pb"
    subprocess.run([sys.executable, "-m", "grpc_tools.protoc", "-I", ".", f"--descriptor_set_out={out}",
                    "protos/grpc_service.proto"], check=True, cwd=ROOT)
    files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    (ours,) = files.file
    return ours


def _messages(file: descriptor_pb2.FileDescriptorProto) -> dict[str, descriptor_pb2.DescriptorProto]:
    found: dict[str, descriptor_pb2.DescriptorProto] = {}

    def walk(prefix: str, messages: object) -> None:
        for m in messages:  # type: ignore[attr-defined]
            found[prefix + m.name] = m
            walk(prefix + m.name + ".", m.nested_type)

    walk("", file.message_type)
    return found


def _fields(message: descriptor_pb2.DescriptorProto) -> dict[int, tuple]:
    return {f.number: (f.name, f.type, f.label, f.type_name,
                       f.oneof_index if f.HasField("oneof_index") else None) for f in message.field}


def test_kserve_proto_matches_the_standard_field_for_field(tmp_path: Path) -> None:
    from tritonclient.grpc import service_pb2 as triton

    ours = _compile(tmp_path)
    reference = descriptor_pb2.FileDescriptorProto()
    triton.DESCRIPTOR.CopyToProto(reference)
    assert ours.package == reference.package == "inference"

    our_messages, their_messages = _messages(ours), _messages(reference)
    assert len(our_messages) >= 35
    for name, message in our_messages.items():
        assert name in their_messages, f"{name} is not a standard message"
        assert _fields(message) == _fields(their_messages[name]), f"{name} differs from the standard"
        assert [o.name for o in message.oneof_decl] == [o.name for o in their_messages[name].oneof_decl]
        assert message.options.map_entry == their_messages[name].options.map_entry

    (our_service,) = ours.service
    their_service = next(s for s in reference.service if s.name == our_service.name)
    assert our_service.name == "GRPCInferenceService"
    theirs = {m.name: m for m in their_service.method}
    required = {"ServerLive", "ServerReady", "ModelReady", "ServerMetadata", "ModelMetadata", "ModelInfer",
                "ModelStatistics", "RepositoryIndex", "RepositoryModelLoad", "RepositoryModelUnload"}
    assert {m.name for m in our_service.method} == required
    for method in our_service.method:
        other = theirs[method.name]
        assert (method.input_type, method.output_type, method.client_streaming, method.server_streaming) == \
               (other.input_type, other.output_type, other.client_streaming, other.server_streaming)


def test_our_kserve_messages_coexist_with_tritonclient_and_interoperate() -> None:
    """Both copies of `inference.*` load in one process and parse each other's bytes."""
    import numpy as np
    from tritonclient.grpc import service_pb2 as triton

    from protos import grpc_service_pb2 as ours

    request = ours.ModelInferRequest(model_name="m", model_version="2", id="x")
    tensor = request.inputs.add(name="input_ids", datatype="INT64", shape=[1, 3])
    tensor.parameters["p"].int64_param = 7
    request.raw_input_contents.append(np.arange(3, dtype="<i8").tobytes())
    parsed = triton.ModelInferRequest.FromString(request.SerializeToString())
    assert parsed.model_name == "m" and parsed.model_version == "2" and parsed.id == "x"
    assert parsed.inputs[0].name == "input_ids" and list(parsed.inputs[0].shape) == [1, 3]
    assert parsed.inputs[0].parameters["p"].int64_param == 7
    assert np.frombuffer(parsed.raw_input_contents[0], dtype="<i8").tolist() == [0, 1, 2]

    theirs = triton.ModelInferResponse(model_name="m")
    theirs.outputs.add(name="label", datatype="BYTES", shape=[1])
    theirs.raw_output_contents.append(b"\x02\x00\x00\x00hi")
    back = ours.ModelInferResponse.FromString(theirs.SerializeToString())
    assert back.outputs[0].datatype == "BYTES" and back.raw_output_contents[0] == b"\x02\x00\x00\x00hi"


@pytest.mark.parametrize("module", ["grpc_service_pb2", "ortserve_pb2"])
def test_proto_sources_ship_with_the_stubs(module: str) -> None:
    source = PROTOS / (module.removesuffix("_pb2") + ".proto")
    assert source.is_file()
    assert f"source: protos/{source.name}" in (PROTOS / f"{module}.py").read_text()


def test_shared_results_match_their_messages_and_need_only_the_standard_library() -> None:
    """protos/results.py: each class has its task-API message's fields, in order; the client and the server hand
    out these very classes; importing it loads nothing beyond the standard library (the client installs alone)."""
    import dataclasses

    from protos import ortserve_pb2 as pb
    from protos import results

    for name in results.__all__:
        cls = getattr(results, name)
        fields = [f.name for f in dataclasses.fields(cls)]
        assert fields == [f.name for f in getattr(pb, name).DESCRIPTOR.fields], name
    from clients import types as client_types
    from server.encoders import encoder, token_aggregation
    from server.protocol import types as server_types
    from server.text import spans as tokens
    from server.generation import results as generation_results
    for name in ("Classification", "LabelScore", "MaskPrediction", "TokenCandidate", "TokenEntity"):
        assert getattr(client_types, name) is getattr(results, name), name
    for name in ("Classification", "MaskPrediction", "TokenEntity"):   # the server's result types hold these
        assert getattr(server_types, name) is getattr(results, name), name
    for name in ("Classification", "LabelScore", "MaskPrediction", "TokenCandidate"):   # what encoders build
        assert getattr(encoder, name) is getattr(results, name), name
    assert client_types.TokenLogprob is generation_results.TokenLogprob is results.TokenLogprob
    assert client_types.Usage is generation_results.Usage is results.Usage
    assert client_types.TokenSpan is tokens.TokenSpan is results.TokenSpan
    assert token_aggregation.TokenEntity is results.TokenEntity
    loaded = subprocess.run([sys.executable, "-c", "import sys; before = set(sys.modules); import protos.results; "
                             "print(' '.join(sorted(set(sys.modules) - before)))"],
                            check=True, capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert {m.split(".")[0] for m in loaded} <= {"protos", *sys.stdlib_module_names}, loaded
