"""Server parts in-process: settings / CLI parsing, the event loop choice, KServe codecs, package verification, the
repository's version policy, admission control, and the data plane API that `--local` batch mode uses (no gRPC).
(The `python -m server` process refusing bad flags in one line is tests/e2e/grpc/test_server_cli.py.)"""
from __future__ import annotations

import asyncio
import io
import json
import logging
import shutil
from pathlib import Path

import numpy as np
import pytest

from modelpkg import TensorDecl, past_names
from server.protocol.codecs import decode_tensor, encode_tensor
from server.dataplane import DataPlane
from server.protocol.errors import Code, ServingError
from server.generation import GenerationParams
from server.runtime.logs import JsonFormatter
from server.repository.package import PackageError, read_package, verify_files
from server.runtime.settings import ServerSettings, SettingsError, build_parser, settings_from_args
from server.repository.signature import check_inputs, specs_from_manifest
from server.protocol.types import ModelState

CLASSIFIER, GPT = "tiny-classifier", "tiny-gpt"


# ---------------------------------------------------------------- settings and the command line

def test_settings_precedence_defaults_file_env_flags(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text(f'repository = "{tmp_path}"\nport = 9000\nmax_batch_size = 4\n'
                      'providers = ["CPUExecutionProvider"]\nauth_token = "from-file"\n')
    s = settings_from_args(["--config", str(config), "--max-batch-size", "8"], environ={"ORTSERVE_AUTH_TOKEN": "env"})
    assert (s.repository, s.port, s.max_batch_size, s.providers) == (tmp_path, 9000, 8, ["CPUExecutionProvider"])
    assert s.auth_token == "env" and s.metrics_port == ServerSettings().metrics_port
    as_json = tmp_path / "server.json"
    as_json.write_text(json.dumps({"repository": str(tmp_path), "max_queue_delay_ms": 5, "log_format": "json"}))
    s = settings_from_args(["--config", str(as_json), "--providers", "CPUExecutionProvider"], environ={})
    assert s.max_queue_delay_ms == 5.0 and s.log_format == "json" and s.providers == ["CPUExecutionProvider"]


@pytest.mark.parametrize("content, flag", [
    ('port = "high"', "port"), ("nope = 1", "nope"), ("max_batch_size = 0", "--max-batch-size"),
    ("port = 70000", "--port"), ('log_format = "xml"', "--log-format"), ("[[", "--config"),
    ("header_timeout = 0", "--header-timeout"), ("read_timeout = -1", "--read-timeout"),
    ("keep_alive_timeout = 1e9", "--keep-alive-timeout"), ("max_connections = -1", "--max-connections"),
    ("decode_steps = 0", "--decode-steps"), ("decode_run_ms = -1", "--decode-run-ms"),
    ("generation_instances = 0", "--generation-instances"),
])
def test_bad_config_values_name_the_setting(tmp_path: Path, content: str, flag: str) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f'repository = "{tmp_path}"\n{content}\n')
    with pytest.raises(SettingsError) as info:
        settings_from_args(["--config", str(config)], environ={})
    assert flag in str(info.value)


def test_json_log_lines_carry_extra_fields() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.jsonlog")
    logger.addHandler(handler)
    logger.propagate = False
    logger.warning("listening on %s:%d", "127.0.0.1", 8001, extra={"port": 8001})
    entry = json.loads(stream.getvalue())
    assert entry["msg"] == "listening on 127.0.0.1:8001" and entry["port"] == 8001 and entry["level"] == "WARNING"


# ---------------------------------------------------------------- KServe codecs

def test_bytes_tensors_use_4_byte_little_endian_length_prefixes() -> None:
    array = np.array([b"ab", "é".encode(), b""], dtype=object)
    datatype, shape, raw = encode_tensor(array)
    assert (datatype, shape) == ("BYTES", [3])
    assert raw == b"\x02\x00\x00\x00ab" + b"\x02\x00\x00\x00\xc3\xa9" + b"\x00\x00\x00\x00"
    back = decode_tensor("t", "BYTES", [3, 1], raw, None, "inputs[0]")
    assert back.shape == (3, 1) and back[:, 0].tolist() == [b"ab", "é".encode(), b""]
    with pytest.raises(ServingError, match="holds more BYTES elements than its shape.s 2"):
        decode_tensor("t", "BYTES", [2], raw, None, "inputs[0]")


def test_numeric_tensors_raw_and_typed_contents() -> None:
    from protos import grpc_service_pb2 as kserve

    values = np.arange(6, dtype=np.float16).reshape(2, 3)
    datatype, shape, raw = encode_tensor(values)
    assert (datatype, shape, raw) == ("FP16", [2, 3], values.tobytes())
    assert np.array_equal(decode_tensor("x", "FP16", [2, 3], raw, None, "inputs[0]"), values)
    contents = kserve.InferTensorContents(int64_contents=[1, 2, 3, 4])
    typed = decode_tensor("ids", "INT64", [2, 2], None, contents, "inputs[1]")
    assert typed.dtype == np.int64 and typed.tolist() == [[1, 2], [3, 4]]
    with pytest.raises(ServingError, match=r"inputs\[1\]\.contents: 4 values, shape \[3\] needs 3"):
        decode_tensor("ids", "INT64", [3], None, contents, "inputs[1]")
    with pytest.raises(ServingError, match=r"inputs\[0\]\.datatype: unknown datatype 'INT128'"):
        decode_tensor("x", "INT128", [1], b"", None, "inputs[0]")


def test_decoder_signature_checks_past_plus_sequence() -> None:
    """The concat-layout decoder signature of docs/model-package.md (testing/concat_decoder.py; export wrote it before the in-place cache)."""
    cache = {"num_layers": 2, "num_heads": 2, "head_dim": 4}
    past = ["batch", "heads", "past_sequence", "head_dim"]
    decls = [{"name": "input_ids", "dtype": "int64", "shape": ["batch", "sequence"]},
             {"name": "attention_mask", "dtype": "int64", "shape": ["batch", "past_sequence+sequence"]},
             {"name": "position_ids", "dtype": "int64", "shape": ["batch", "sequence"]}]
    decls += [{"name": n, "dtype": "float32", "shape": past} for n in past_names(cache["num_layers"])]
    specs = specs_from_manifest([TensorDecl.from_dict(d) for d in decls])
    ids = np.zeros((1, 3), np.int64)
    feeds = {"input_ids": ids, "attention_mask": np.ones((1, 5), np.int64), "position_ids": ids.copy()}
    for i in range(cache["num_layers"]):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, cache["num_heads"], 2, cache["head_dim"]), np.float32)
    check_inputs(specs, feeds)  # 2 past + 3 new = 5 mask columns: fine
    feeds["attention_mask"] = np.ones((1, 4), np.int64)
    with pytest.raises(ServingError, match=r"attention_mask'\]\.shape: axis 1 must be past_sequence \(2\) \+ "
                                           r"sequence \(3\) = 5, got 4"):
        check_inputs(specs, feeds)


# ---------------------------------------------------------------- package verification

def test_package_verification_catches_tampering(tiny_repository: Path, tmp_path: Path) -> None:
    pkg = tmp_path / "m" / "1"
    shutil.copytree(tiny_repository / CLASSIFIER / "1", pkg)
    package = read_package(pkg, "m", 1)
    verify_files(package, ["model.json", "model.onnx", "tokenizer.json"])  # untouched: passes
    with pytest.raises(PackageError, match="not listed"):
        verify_files(package, ["model.fp16.onnx"])
    tokenizer = pkg / "tokenizer.json"
    tokenizer.write_text(tokenizer.read_text().replace("[MASK]", "[MASQ]"))
    with pytest.raises(PackageError, match="sha256 mismatch for tokenizer.json"):
        verify_files(package, ["tokenizer.json"])
    parity = json.loads((pkg / "parity.json").read_text())
    (pkg / "parity.json").write_text(json.dumps({**parity, "passed": False}))
    with pytest.raises(PackageError, match="parity gate did not pass"):
        read_package(pkg, "m", 1)
    (pkg / "parity.json").write_text(json.dumps(parity))
    manifest = json.loads((pkg / "model.json").read_text())
    (pkg / "model.json").write_text(json.dumps({**manifest, "task": "translate"}))
    with pytest.raises(PackageError, match="task 'translate'"):
        read_package(pkg, "m", 1)


# ---------------------------------------------------------------- the data plane in-process

def _settings(repo: Path, **overrides: object) -> ServerSettings:
    return ServerSettings(repository=repo, poll_interval=0, metrics_port=-1, **overrides).validate()


def test_data_plane_in_process_batches_concurrent_requests(tiny_repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / CLASSIFIER, repo / CLASSIFIER)

    async def run() -> None:
        plane = await DataPlane.start(_settings(repo, max_queue_delay_ms=20))
        try:
            texts = [[(f"the harbour boat {i}", None)] for i in range(12)]
            results = await asyncio.gather(*(plane.classify(CLASSIFIER, 0, t) for t in texts))
            assert all(r.version == 1 and len(r.results) == 1 for r in results)
            stats = plane.statistics(CLASSIFIER)[0]
            assert stats.inference_count == 12 and max(b.batch_size for b in stats.batches) > 1 \
                and stats.execution_count < 12
            big = await plane.classify(CLASSIFIER, 0, [("tide", None)] * 40)  # > max_batch_size: split, in order
            assert len(big.results) == 40
        finally:
            await plane.close()

    asyncio.run(run())


def test_encoder_instances_compute_batches_at_the_same_time(tiny_repository: Path, tmp_path: Path) -> None:
    """encoder_instances=2: two batches run at once (each instance on its own thread), answers unchanged."""
    import threading

    from server.encoders.batching import BatchConfig, DynamicBatcher
    from server.runtime.metrics import Metrics
    from server.runtime.stats import ModelStats

    both_running = threading.Barrier(2, timeout=2)  # passes only when two runs are inside run_batch together

    def run_batch(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        both_running.wait()
        return {"twice": feeds["x"] * 2}

    async def batched(instances: int) -> list[np.ndarray]:
        batcher = DynamicBatcher(run_batch, {}, BatchConfig(max_batch_size=1, instances=instances), Metrics(),
                                 "m", ModelStats())
        batcher.start()
        try:
            results = await asyncio.gather(*(batcher.submit({"x": np.full((1, 2), i)}) for i in range(4)),
                                           return_exceptions=True)
        finally:
            await batcher.stop()
        return results

    results = asyncio.run(batched(2))
    assert [r["twice"].tolist() for r in results] == [[[2 * i, 2 * i]] for i in range(4)]
    both_running.reset()
    one = asyncio.run(batched(1))  # one instance: the first run waits alone at the barrier and breaks it
    assert any(isinstance(r, ServingError) for r in one)

    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / CLASSIFIER, repo / CLASSIFIER)

    async def classify(instances: int) -> list[list[float]]:
        plane = await DataPlane.start(_settings(repo, encoder_instances=instances, intra_op_threads=1,
                                                variant="fp32"))
        try:
            out = await asyncio.gather(*(plane.classify(CLASSIFIER, 0, [(f"the harbour boat {i}", None)])
                                         for i in range(12)))
            return [[s.score for s in r.results[0].scores] for r in out]
        finally:
            await plane.close()

    np.testing.assert_allclose(asyncio.run(classify(2)), asyncio.run(classify(1)), atol=1e-5)


def test_admission_control_answers_resource_exhausted(tiny_repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    for name in (CLASSIFIER, GPT):
        shutil.copytree(tiny_repository / name, repo / name)

    async def run() -> None:
        plane = await DataPlane.start(_settings(repo, max_queue_delay_ms=300, max_queued_requests=3,
                                                max_tokens_in_flight=64))
        try:
            outcomes = await asyncio.gather(*(plane.classify(CLASSIFIER, 0, [("sail", None)]) for _ in range(6)),
                                            return_exceptions=True)
            refused = [o for o in outcomes if isinstance(o, ServingError)]
            assert len(refused) == 3 and all(e.code is Code.RESOURCE_EXHAUSTED for e in refused)
            assert sum(1 for o in outcomes if not isinstance(o, BaseException)) == 3
            with pytest.raises(ServingError) as info:
                await plane.generate(GPT, 0, "x", GenerationParams.validate(max_new_tokens=100))
            # More than the whole budget can never be admitted: INVALID_ARGUMENT, not a retry invitation.
            assert info.value.code is Code.INVALID_ARGUMENT and "max_tokens_in_flight 64" in info.value.message
        finally:
            await plane.close()

    asyncio.run(run())


def test_a_request_goes_to_the_engine_where_its_tokens_fit(tiny_repository: Path, tmp_path: Path) -> None:
    """max_tokens_in_flight is per engine (docs/configuration.md). With two engines, a request that does not fit the
    preferred one (fewest sequences) but fits the other is admitted there instead of refused."""
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / GPT, repo / GPT)

    async def run() -> None:
        plane = await DataPlane.start(_settings(repo, generation_instances=2, max_tokens_in_flight=200))
        held = []
        try:
            with plane.lease(GPT, 0, "test") as served:
                first, second = served.engines
                # One sequence of 1 + 112 tokens on the first engine, two of 1 + 30 on the second: the first has
                # fewer sequences (preferred) but no room for 101 more tokens; the second has.
                held += await first.admit([("x", GenerationParams.validate(max_new_tokens=112, ignore_eos=True))])
                short = GenerationParams.validate(max_new_tokens=30, ignore_eos=True)
                held += await second.admit([("x", short), ("x", short)])
                assert served.preferred()[0] is first
                result = await plane.generate(GPT, 0, "x", GenerationParams.validate(max_new_tokens=100,
                                                                                     ignore_eos=True))
                assert result.output.usage.completion_tokens == 100
        finally:
            for seq in held:
                seq.fail(RuntimeError("test over"))
            await plane.close()

    asyncio.run(run())


def test_failed_new_version_keeps_the_old_one_serving(tiny_repository: Path, tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    shutil.copytree(tiny_repository / CLASSIFIER, repo / CLASSIFIER)
    v2 = repo / CLASSIFIER / "2"
    shutil.copytree(repo / CLASSIFIER / "1", v2)
    parity = json.loads((v2 / "parity.json").read_text())
    (v2 / "parity.json").write_text(json.dumps({**parity, "passed": False}))

    async def run() -> None:
        plane = await DataPlane.start(_settings(repo))
        try:
            states = {(s.version, s.state) for s in plane.list_models()}
            # v2 is the latest on disk, so it was tried first; it failed, so v1 serves instead ...
            assert states == {(2, ModelState.NOT_SERVING), (1, ModelState.SERVING)}
            assert (await plane.classify(CLASSIFIER, 0, [("x", None)])).version == 1
            assert "parity gate" in plane.model_info(CLASSIFIER, 2).status.reason
            with pytest.raises(ServingError) as info:
                await plane.classify(CLASSIFIER, 2, [("x", None)])
            assert info.value.code is Code.UNAVAILABLE and "parity gate" in info.value.message
            # ... and repairing the package (rewritten files) makes the next poll swap it in.
            (v2 / "parity.json").write_text(json.dumps(parity))
            await plane.repository.poll_once()
            assert (await plane.classify(CLASSIFIER, 0, [("x", None)])).version == 2
            # A broken version 3 does not take version 2 down.
            v3 = repo / CLASSIFIER / "3"
            shutil.copytree(v2, v3)
            (v3 / "model.onnx").write_bytes(b"not a graph")
            await plane.repository.poll_once()
            assert {(s.version, s.state) for s in plane.list_models()} >= {(2, ModelState.SERVING),
                                                                           (3, ModelState.NOT_SERVING)}
            assert (await plane.classify(CLASSIFIER, 0, [("x", None)])).version == 2
            assert "sha256 mismatch for model.onnx" in plane.model_info(CLASSIFIER, 3).status.reason
        finally:
            await plane.close()

    asyncio.run(run())


def test_generation_settings_default_to_the_engines_own_defaults() -> None:
    """One default for each generation limit: the server passes the engine exactly what it would assume."""
    from server.runtime_config import runtime_config
    from server.generation import GenerationConfig

    engine, settings = GenerationConfig(), ServerSettings()
    assert settings.max_tokens_in_flight == engine.max_tokens_in_flight
    assert settings.max_sequences == engine.max_batch_size
    passed = runtime_config(ServerSettings(providers=["CPUExecutionProvider"])).generation
    assert passed.max_tokens_in_flight == engine.max_tokens_in_flight and passed.max_batch_size == engine.max_batch_size
    # max_queued_requests feeds both queues of a model (said on the setting and in --help)
    assert passed.max_waiting == settings.max_queued_requests
    assert "decoder's batch" in " ".join(a.help or "" for a in build_parser()._actions)


@pytest.mark.parametrize("threads, instances, cores, expected", [
    (1, 1, 2, 5.0),     # a core left for the event loop
    (2, 1, 2, 0.0),     # every core computes the step
    (0, 1, 8, 0.0),     # onnxruntime's default: a thread a core
    (1, 2, 2, 0.0),     # two engines of one thread each
    (2, 3, 8, 5.0),
])
def test_steps_overlap_the_loop_only_where_the_onnxruntime_threads_leave_it_a_core(
        threads: int, instances: int, cores: int, expected: float) -> None:
    from server.runtime_config import overlap_step_ms

    settings = ServerSettings(generation_instances=instances)
    assert overlap_step_ms(settings, threads, cores) == expected
    assert overlap_step_ms(ServerSettings(overlap_step_ms=0), 1, 4) == 0.0


@pytest.mark.parametrize("threads, cores, left", [
    (2 * 1 * 1, 2, False),   # the batch script's default on 2 cores: 2 processes of one engine of one thread
    (1, 2, True),
    (2 * 2 * 1, 8, True),
    (4 * 1 * 2, 8, False),
])
def test_a_core_is_left_only_while_all_the_onnxruntime_threads_are_fewer_than_the_cores(
        threads: int, cores: int, left: bool) -> None:
    """The rule the server applies to its engines' threads and the batch script to its processes'
    (clients/batch/processes.py)."""
    from server.runtime_config import leaves_a_core

    assert leaves_a_core(threads, cores) is left


# ---------------------------------------------------------------- HTTP bodies decoded into typed requests

@pytest.mark.parametrize("body, status, message", [
    (b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}', 200, None),
    (b'{"messages": []}', 400, "model: is required"),
    (b'{"model": null, "messages": []}', 400, "model: is required"),
    (b'{"model": 5, "messages": []}', 400, "model: must be a string, got 5"),
    (b'{"model": "m", "messages": [{"role": "user"}, {"content": "x"}]}', 400, "messages[1].role: is required"),
    (b'{"model": "m", "messages": [7]}', 400, "messages[0]: must be an object, got 7"),
    (b'{"model": "m", "messages": [], "n": true}', 400, "n: must be an integer, got true"),
    (b'{"model": "m", "messages": [], "n": 2.5}', 400, "n: must be an integer, got 2.5"),
    (b'{"model": "m", "messages": [], "stop": 5}', 400, "stop: must be a string or a list, got 5"),
    (b'{"model": "m", "messages": [], "temperature": "hot"}', 400, 'temperature: must be a number, got "hot"'),
    (b'{"model": "m", "messages": [], "temperature": NaN}', 400, "temperature: must be finite, got nan"),
    (b'{"model": "m", "messages": [], "temperature": 1e400}', 400, "temperature: must be finite, got inf"),
    (b'{"model": "m", "messages": [], "logit_bias": {"5": -1e999}}', 400, "logit_bias.5: must be finite, got -inf"),
    (b'{"model": "m", "messages": [], "stream_options": {"include_usage": "y"}}', 400,
     'stream_options.include_usage: must be a boolean, got "y"'),
    (b"[1]", 400, "body: must be a JSON object, got list"),
    (b'{"model": ', 400, "body: malformed JSON (Expecting value at line 1 column 11)"),
    (b'{"model": "\xff"}', 400, "body: not UTF-8 text"),
])
def test_http_bodies_decode_once_into_typed_requests_naming_the_bad_field(body: bytes, status: int,
                                                                          message: str | None) -> None:
    from server.http.decode import decode
    from server.http.errors import classify_error
    from server.http.openai.protocol import ChatCompletionRequest

    try:
        request = decode(body, ChatCompletionRequest)
    except Exception as exc:  # noqa: BLE001 - the HTTP door's own mapping decides the status
        assert classify_error(exc, "test")[:2] == (status, message)
    else:
        assert status == 200
        assert (request.model, request.messages[0].role, request.messages[0].content, request.n) == ("m", "user",
                                                                                                   "hi", 2)
        assert request.temperature is None and request.stream_options is None   # absent: the route's defaults


def test_a_batch_histogram_scrapes_as_prometheus_clients_own_histogram_fed_one_value_at_a_time() -> None:
    """The engine puts a step's inter-token gaps into BatchHistogram in one call; what a scrape reads must be what
    prometheus_client's Histogram gives for the same values observed one by one (bucket edges included: a value
    equal to a bound counts in that bound's bucket)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from server.runtime.metrics import BatchHistogram

    bounds = (0.001, 0.01, 0.1, 1.0)
    values = [0.0, 0.001, 0.0011, 0.01, 0.05, 0.1, 0.5, 1.0, 2.0, 30.0, 0.0004]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batch = BatchHistogram("gap_seconds", "gaps", bounds, registry=ours)
    plain = Histogram("gap_seconds", "gaps", ["model"], buckets=bounds, registry=theirs)
    batch.labels("a").observe_many(values[:4])
    batch.labels("a").observe_many(values[4:])
    batch.labels("a").observe_many([])
    batch.labels("b").observe_many([0.2])
    for v in values:
        plain.labels(model="a").observe(v)
    plain.labels(model="b").observe(0.2)

    def samples(registry: CollectorRegistry) -> tuple[list[str], list[float]]:
        """The bucket and count lines as text; the sums as numbers (summed in another order: last bits differ)."""
        lines = [line for line in generate_latest(registry).decode().splitlines()
                 if line.startswith("gap_seconds") and "_created" not in line]
        return (sorted(line for line in lines if "_sum" not in line),
                [float(line.split()[-1]) for line in sorted(line for line in lines if "_sum" in line)])
    (our_lines, our_sums), (their_lines, their_sums) = samples(ours), samples(theirs)
    assert our_lines == their_lines
    assert our_sums == pytest.approx(their_sums, rel=1e-12)
    assert 'gap_seconds_bucket{le="0.001",model="a"} 3.0' in our_lines


def test_several_generation_engines_share_the_cores_unless_threads_are_set(tmp_path: Path) -> None:
    """--generation-instances N with --intra-op-threads left at 0 (onnxruntime's default: every core for each session)
    gives each engine's sessions cores / N threads; a number that is set is kept."""
    import os

    from server.runtime_config import runtime_config

    cores = len(os.sched_getaffinity(0))
    two = runtime_config(ServerSettings(repository=tmp_path, generation_instances=2).validate())
    assert two.generation_instances == 2 and two.session.intra_op_threads == max(1, cores // 2)
    assert runtime_config(ServerSettings(repository=tmp_path).validate()).session.intra_op_threads == 0
    kept = runtime_config(ServerSettings(repository=tmp_path, generation_instances=2, intra_op_threads=3).validate())
    assert kept.session.intra_op_threads == 3


def test_event_loop_choice_is_checked_before_start() -> None:
    from server.runtime.eventloop import resolve

    assert resolve("auto") == "uvloop"    # a dependency of the server's install (pyproject.toml)
    assert resolve("asyncio") == "asyncio"
    with pytest.raises(ValueError, match="--event-loop: must be one of auto, uvloop, asyncio"):
        resolve("trio")
