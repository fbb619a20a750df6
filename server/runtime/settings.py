"""Server configuration: one typed dataclass, filled from defaults, an optional config file, then CLI flags.

Precedence (lowest first): dataclass defaults < config file (TOML or JSON, keys = field names) <
environment (`ORTSERVE_AUTH_TOKEN` only, so a secret need not appear in the process list) < CLI flags.
Documented in docs/configuration.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from server.admission import (DEFAULT_MAX_FILL_MASK_CANDIDATES, DEFAULT_MAX_PIECES_PER_REQUEST,
                              DEFAULT_MAX_REQUEST_MEMORY_MB, DEFAULT_MAX_ROWS_PER_REQUEST)
from server.runtime.eventloop import EVENT_LOOPS
from server.generation.params import GenerationConfig

VARIANT_AUTO = "auto"
LOG_FORMATS = ("text", "json")
_LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class SettingsError(ValueError):
    """A bad setting; the message starts with the flag / key it is about."""


_ENGINE = GenerationConfig()  # the generation engine's own defaults: the server's are the same numbers


@dataclass
class ServerSettings:
    repository: Path = Path("model_repository")
    host: str = "127.0.0.1"
    port: int = 8001                      # 0 = pick a free port (logged as "listening on HOST:PORT")
    metrics_port: int = 8002              # 0 = pick a free port, -1 = no metrics endpoint
    http_port: int = 8000                 # HTTP front door (KServe v2 REST + OpenAI API); 0 = pick one
    #                                     (logged as "http listening on HOST:PORT"), -1 = no HTTP server
    poll_interval: float = 5.0            # seconds between repository scans; 0 = no polling
    providers: list[str] = field(default_factory=list)  # [] = CUDA when available, then CPU
    intra_op_threads: int = 0             # 0 = onnxruntime's default
    inter_op_threads: int = 0
    intra_op_spinning: str = "off"        # onnxruntime intra-op threads spin: off / on / auto (= decoders only);
    #                                     on: faster on dedicated cores, slower on shared ones (docs/configuration.md)
    # Encoders (one dynamic batcher per loaded version; task calls and raw ModelInfer share it):
    max_batch_size: int = 16              # rows (texts, or rows of a raw tensor) per onnxruntime run
    max_queue_delay_ms: float = 0.0       # extra wait for more rows when the model is idle (0: none)
    encoder_instances: int = 1            # batches of one encoder computed at once (each runs on its own thread
    #                                     with intra_op_threads threads: keep instances x threads <= cores)
    # Per loaded version, ONE flag for two queues: an encoder's batcher queue (requests waiting for compute)
    # and a decoder's waiting requests (admitted, not yet prefilled). Beyond it → RESOURCE_EXHAUSTED.
    max_queued_requests: int = 256
    # Admission (server/admission.py): what ONE request may cost, whatever the load; beyond → INVALID_ARGUMENT.
    max_rows_per_request: int = DEFAULT_MAX_ROWS_PER_REQUEST  # texts (or raw tensor rows) in one request
    max_pieces_per_request: int = DEFAULT_MAX_PIECES_PER_REQUEST  # pieces (max_batch_size rows each) of one
    #                                     request in its model's batcher queue at once: others' requests interleave
    max_fill_mask_candidates: int = DEFAULT_MAX_FILL_MASK_CANDIDATES  # masks x top_k summed over a request's texts
    max_request_memory_mb: int = DEFAULT_MAX_REQUEST_MEMORY_MB  # one request's estimated working memory
    #                                     (token classification, rerank: its tokens' encodings, logits, entities)
    # Decoders (one generation engine per loaded version):
    max_tokens_in_flight: int = _ENGINE.max_tokens_in_flight  # sum of prompt + max_new_tokens tokens over the
    #                                     engine's waiting AND running requests; beyond it → RESOURCE_EXHAUSTED
    max_sequences: int = _ENGINE.max_batch_size  # sequences decoded together in one step (= KV-cache slots
    #                                     allocated at load for an in-place-cache decoder)
    generation_instances: int = 1         # engines per decoder, each with its own sessions, worker thread and
    #                                     max_sequences slots, requests to the least loaded: keep instances x
    #                                     intra_op_threads <= cores (CTranslate2's inter_threads, Triton's count)
    prefill_chunk_tokens: int = _ENGINE.prefill_chunk_tokens  # prompt tokens prefilled per step while other
    #                                     sequences decode (in-place-cache decoders)
    max_prefill_tokens: int = _ENGINE.max_prefill_tokens  # padded prompt tokens (rows x longest chunk) per step
    #                                     when no sequence decodes
    stream_interval: int = _ENGINE.stream_interval  # streamed tokens per message after the first (1 = each token
    #                                     as it comes; more: fewer messages, less CPU per token on server and client)
    decode_steps: int = _ENGINE.decode_steps  # decode steps run back to back per engine iteration while no
    #                                     request waits (a request arriving stops the run after one step) ...
    decode_run_ms: float = _ENGINE.decode_run_ms  # ... and while the run stays within this many milliseconds
    overlap_step_ms: float = _ENGINE.overlap_step_ms  # steps shorter than this: the engine's thread computes
    #                                     the next while the loop applies the last, where the onnxruntime threads
    #                                     leave the loop a core (0 = never)
    max_model_len: int = 0                # generation models' served context (cache slot length) in tokens, at
    #                                     most each package's max_length (larger: the version is NOT_SERVING,
    #                                     naming this flag); 0 = each package's own
    prefix_caching: str = "on"            # in-place-cache decoders: a new prompt that starts with tokens a slot
    #                                     holds (a running or finished sequence's) skips their prefill ("off": never)
    event_loop: str = "auto"              # auto = uvloop when installed (its loop machinery is C), else asyncio
    grace_period: float = 20.0            # SIGTERM: seconds to let in-flight requests finish
    # Connections (server/http/connections.py, server/grpc/server.py): idle ones are closed, their number bounded.
    header_timeout: float = 10.0          # a request head (HTTP, metrics port) complete within this many seconds
    #                                     of connecting or of the previous response; a gRPC connection's
    #                                     handshake (TLS, HTTP/2 settings) within the same time
    read_timeout: float = 30.0            # HTTP: most seconds without a byte while a request body is arriving
    keep_alive_timeout: float = 5.0       # HTTP: an idle keep-alive connection is closed after this many seconds
    grpc_idle_timeout: float = 300.0      # gRPC: a connection without a call for this long gets GOAWAY (clients
    #                                     reconnect on their next call)
    max_connections: int = 0              # per door: connections the HTTP + metrics ports hold together, and
    #                                     those of the gRPC port; 0 = a quarter of the open-file limit (<= 16384)
    max_message_bytes: int = 64 * 1024 * 1024  # gRPC messages both ways, and HTTP request bodies
    tls_cert: Path | None = None
    tls_key: Path | None = None
    auth_token: str | None = None
    variant: str = VARIANT_AUTO           # "auto" = the manifest's default_variant for the device
    log_format: str = "text"
    log_level: str = "INFO"
    otlp_endpoint: str | None = None      # OpenTelemetry traces over OTLP/gRPC (server/runtime/tracing.py); None = off

    def validate(self) -> "ServerSettings":
        """Raises SettingsError naming the first bad field; returns self."""
        def bad(name: str, problem: str) -> SettingsError:
            return SettingsError(f"--{name.replace('_', '-')}: {problem}")

        if not self.repository.is_dir():
            raise bad("repository", f"{self.repository} is not a directory")
        if not 0 <= self.port <= 65535:
            raise bad("port", f"must be in 0..65535, got {self.port}")
        for name in ("metrics_port", "http_port"):
            if not -1 <= getattr(self, name) <= 65535:
                raise bad(name, f"must be in -1..65535, got {getattr(self, name)}")
        for name in ("poll_interval", "max_queue_delay_ms", "grace_period", "max_connections", "max_model_len"):
            if getattr(self, name) < 0:
                raise bad(name, f"must be >= 0, got {getattr(self, name)}")
        for name in ("decode_run_ms", "overlap_step_ms"):
            if not 0 <= getattr(self, name) <= 10_000:
                raise bad(name, f"must be in [0, 10000] milliseconds, got {getattr(self, name)}")
        for name in ("header_timeout", "read_timeout", "keep_alive_timeout", "grpc_idle_timeout"):
            if not 0 < getattr(self, name) <= 86400:
                raise bad(name, f"must be in (0, 86400] seconds, got {getattr(self, name)}")
        for name in ("intra_op_threads", "inter_op_threads"):
            if getattr(self, name) < 0:
                raise bad(name, f"must be >= 0, got {getattr(self, name)}")
        if self.intra_op_spinning not in SPINNING:
            raise bad("intra_op_spinning", f"must be one of {', '.join(SPINNING)}, got {self.intra_op_spinning!r}")
        if self.prefix_caching not in ON_OFF:
            raise bad("prefix_caching", f"must be one of {', '.join(ON_OFF)}, got {self.prefix_caching!r}")
        for name in ("max_batch_size", "encoder_instances", "max_queued_requests", "max_rows_per_request",
                     "max_pieces_per_request",
                     "max_fill_mask_candidates", "max_request_memory_mb", "max_tokens_in_flight", "max_sequences", "generation_instances",
                     "prefill_chunk_tokens", "max_prefill_tokens", "stream_interval",
                     "decode_steps", "max_message_bytes"):
            if getattr(self, name) < 1:
                raise bad(name, f"must be >= 1, got {getattr(self, name)}")
        if (self.tls_cert is None) != (self.tls_key is None):
            raise bad("tls_cert", "--tls-cert and --tls-key go together")
        for name, marker in (("tls_cert", b"-----BEGIN CERTIFICATE-----"), ("tls_key", b"PRIVATE KEY-----")):
            path = getattr(self, name)
            if path is not None and not path.is_file():
                raise bad(name, f"{path} is not a file")
            if path is not None and marker not in path.read_bytes():  # grpc would only say "failed to bind"
                raise bad(name, f"{path} is not a PEM {'certificate' if name == 'tls_cert' else 'private key'}")
        if self.auth_token is not None and not self.auth_token.strip():
            raise bad("auth_token", "must not be empty")
        if self.event_loop not in EVENT_LOOPS:
            raise bad("event_loop", f"must be one of {', '.join(EVENT_LOOPS)}, got {self.event_loop!r}")
        if self.otlp_endpoint is not None and not self.otlp_endpoint.startswith(("http://", "https://")):
            raise bad("otlp_endpoint", f"must be http://HOST:PORT or https://HOST:PORT, got {self.otlp_endpoint!r}")
        if self.log_format not in LOG_FORMATS:
            raise bad("log_format", f"must be one of {', '.join(LOG_FORMATS)}, got {self.log_format!r}")
        if self.log_level.upper() not in _LOG_LEVELS:
            raise bad("log_level", f"must be one of {', '.join(_LOG_LEVELS)}, got {self.log_level!r}")
        self.log_level = self.log_level.upper()
        return self


SPINNING = ("auto", "on", "off")
ON_OFF = ("on", "off")
_FIELDS = {f.name: f for f in dataclasses.fields(ServerSettings)}


def _coerce(name: str, value: Any) -> Any:
    """Converts a config-file / CLI value to the field's type; SettingsError on a mismatch."""
    kind = str(_FIELDS[name].type)
    try:
        if kind.startswith("Path"):
            return None if value is None else Path(str(value))
        if kind == "int":
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "list[str]":
            if isinstance(value, str):
                return [v.strip() for v in value.split(",") if v.strip()]
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise ValueError
            return list(value)
        if kind.startswith("str"):
            if value is not None and not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        pass
    else:
        return value
    raise SettingsError(f"{name}: expected {kind}, got {value!r}")


def load_config_file(path: Path) -> dict[str, Any]:
    """Reads a TOML (.toml) or JSON (anything else) config file into field values."""
    if not path.is_file():
        raise SettingsError(f"--config: {path} is not a file")
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(path.read_text())
        else:
            data = json.loads(path.read_text())
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SettingsError(f"--config: {path} does not parse: {exc}") from None
    if not isinstance(data, dict):
        raise SettingsError(f"--config: {path} must hold a table / object of settings")
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise SettingsError(f"--config: unknown setting {unknown[0]!r} in {path}")
    return {k: _coerce(k, v) for k, v in data.items()}


def build_parser(parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> argparse.ArgumentParser:
    d = ServerSettings()  # the defaults the help texts quote
    p = parser_class(
        prog="python -m server",
        description="ortserve: gRPC inference server (task API + KServe v2) on onnxruntime.",
        argument_default=argparse.SUPPRESS)  # so only flags actually given override the config file
    p.add_argument("--config", type=Path, help="TOML or JSON file of settings (keys = the long flag names with _)")
    p.add_argument("--repository", type=Path, help="model repository: <repo>/<name>/<version>/")
    p.add_argument("--host", help="address to bind (default 127.0.0.1; 0.0.0.0 in a container)")
    p.add_argument("--port", type=int, help="gRPC port; 0 picks a free one (default 8001)")
    p.add_argument("--metrics-port", type=int, help="Prometheus HTTP port; 0 picks one, -1 disables (default 8002)")
    p.add_argument("--http-port", type=int,
                   help="HTTP port (KServe v2 REST, OpenAI-compatible API); 0 picks one, -1 disables (default 8000)")
    p.add_argument("--poll-interval", type=float, help="seconds between repository scans, 0 = off (default 5)")
    p.add_argument("--providers", help="comma-separated onnxruntime providers (default: CUDA if available, CPU)")
    p.add_argument("--intra-op-threads", type=int, help="onnxruntime intra-op threads (0 = its default)")
    p.add_argument("--inter-op-threads", type=int, help="onnxruntime inter-op threads (0 = its default)")
    p.add_argument("--max-batch-size", type=int, help=f"rows per encoder batch (default {d.max_batch_size})")
    p.add_argument("--max-queue-delay-ms", type=float,
                   help=f"encoder batcher wait for more rows when idle (default {d.max_queue_delay_ms:g})")
    p.add_argument("--encoder-instances", type=int,
                   help="batches of one encoder computed at once, each with --intra-op-threads threads "
                        f"(default {d.encoder_instances})")
    p.add_argument("--max-queued-requests", type=int,
                   help="per model version: requests waiting in an encoder's batcher, and generation requests "
                        f"waiting for a decoder's batch, before RESOURCE_EXHAUSTED (default {d.max_queued_requests})")
    p.add_argument("--max-rows-per-request", type=int,
                   help="texts (or raw tensor rows) one request may hold; beyond INVALID_ARGUMENT "
                        f"(default {d.max_rows_per_request})")
    p.add_argument("--max-pieces-per-request", type=int,
                   help="pieces of max_batch_size rows one request keeps queued in its model's batcher at once, "
                        f"so other requests interleave (default {d.max_pieces_per_request})")
    p.add_argument("--max-fill-mask-candidates", type=int,
                   help="fill-mask: masks x top_k summed over a request's texts; beyond INVALID_ARGUMENT "
                        f"(default {d.max_fill_mask_candidates})")
    p.add_argument("--max-request-memory-mb", type=int, help="token-classify, rerank: one request's estimated "
                   f"working memory; beyond INVALID_ARGUMENT (default {d.max_request_memory_mb})")
    _generation_flags(p, d)
    p.add_argument("--intra-op-spinning", choices=SPINNING,
                   help="onnxruntime intra-op threads spin: off (default), on (dedicated cores: faster "
                        "decoders; docs/configuration.md), auto (on for decoders only)")
    p.add_argument("--event-loop", choices=EVENT_LOOPS,
                   help="auto (default): uvloop when installed, else asyncio's own loop")
    p.add_argument("--grace-period", type=float, help=f"SIGTERM drain time in seconds (default {d.grace_period:g})")
    p.add_argument("--header-timeout", type=float,
                   help="seconds a connection has to send a complete request head (HTTP, metrics port) or finish "
                        f"its gRPC handshake (default {d.header_timeout:g})")
    p.add_argument("--read-timeout", type=float,
                   help=f"HTTP: most seconds without a byte while a request body arrives (default {d.read_timeout:g})")
    p.add_argument("--keep-alive-timeout", type=float,
                   help=f"HTTP: seconds an idle keep-alive connection stays open (default {d.keep_alive_timeout:g})")
    p.add_argument("--grpc-idle-timeout", type=float,
                   help=f"gRPC: seconds without a call before a connection gets GOAWAY (default {d.grpc_idle_timeout:g})")
    p.add_argument("--max-connections", type=int,
                   help="connections the HTTP and metrics ports hold together, and those of the gRPC port; "
                        "0 = a quarter of the open-file limit, at most 16384 (default 0)")
    p.add_argument("--max-message-bytes", type=int, help="max gRPC message size, both ways, and max HTTP request body (default 64 MiB)")
    p.add_argument("--tls-cert", type=Path, help="PEM certificate chain (with --tls-key: serve TLS)")
    p.add_argument("--tls-key", type=Path, help="PEM private key")
    p.add_argument("--auth-token", help="require 'authorization: Bearer TOKEN' (or set ORTSERVE_AUTH_TOKEN)")
    p.add_argument("--variant", help="ONNX variant to load (fp32, optimized, int8, fp16; a decoder's kv8 = int8 KV cache, "
                                     "w8 / w4 = 8- / 4-bit weights, w8kv8 / w4kv8 = both) or auto (default: the "
                                     "package's default_variant for the device)")
    p.add_argument("--log-format", choices=LOG_FORMATS, help="text (default) or json lines")
    p.add_argument("--log-level", help="DEBUG, INFO (default), WARNING, ERROR")
    p.add_argument("--otlp-endpoint", help="send OpenTelemetry traces to this OTLP/gRPC collector "
                                           "(http://HOST:4317; needs the extra 'tracing'); default: off")
    return p


def _generation_flags(p: argparse.ArgumentParser, d: ServerSettings) -> None:
    """The generation engines' flags (docs/configuration.md has each at length)."""
    p.add_argument("--max-tokens-in-flight", type=int,
                   help="generation: prompt + max_new_tokens summed over a decoder's waiting and running requests "
                        f"(default {d.max_tokens_in_flight})")
    p.add_argument("--max-sequences", type=int,
                   help=f"generation: sequences per continuous batch (default {d.max_sequences})")
    p.add_argument("--generation-instances", type=int,
                   help="generation: engines per decoder (own sessions, thread and --max-sequences slots each), "
                        "requests to the least loaded; keep instances x --intra-op-threads <= cores "
                        f"(default {d.generation_instances})")
    p.add_argument("--prefill-chunk-tokens", type=int,
                   help="generation: prompt tokens prefilled per step while other sequences decode "
                        f"(default {d.prefill_chunk_tokens})")
    p.add_argument("--max-prefill-tokens", type=int,
                   help=f"generation: padded prompt tokens per step when no sequence decodes (default {d.max_prefill_tokens})")
    p.add_argument("--stream-interval", type=int,
                   help="generation: streamed tokens per message after the first (GenerateStream, OpenAI stream); "
                        f"1 = each token as it is generated (default {d.stream_interval}); n > 1: the tokens of n steps "
                        "in one message: fewer messages, less CPU per token on the server and the client")
    p.add_argument("--decode-steps", type=int,
                   help="generation: decode steps run back to back in the engine's thread while no request waits "
                        f"(default {d.decode_steps}): the loop's per-step work then comes once per n tokens; a "
                        "request arriving or leaving stops the run after the step in progress")
    p.add_argument("--decode-run-ms", type=float,
                   help="generation: a run of decode steps stops before a step that would take it past this many "
                        f"milliseconds (default {d.decode_run_ms:g}), judged by the step before: the longest a streamed "
                        "token waits for its message; 0 = one step per iteration")
    p.add_argument("--overlap-step-ms", type=float,
                   help="generation: when an iteration cannot run several decode steps (a request waits, a prompt "
                        "goes in) and the step before took under this many milliseconds "
                        f"(default {d.overlap_step_ms:g}), the engine's thread computes the step after it while the "
                        "event loop applies its outcome (vLLM's asynchronous scheduling): an arrival meanwhile waits "
                        "one step more. Only where the onnxruntime threads (x --generation-instances) leave the loop "
                        "a core; 0 = never")
    p.add_argument("--max-model-len", type=int,
                   help="generation: the served context in tokens (prompt + generated; the cache slots' length), "
                        "at most each package's max_length: a package exported with fewer is NOT_SERVING "
                        "(default 0: each package's own)")
    p.add_argument("--prefix-caching", choices=ON_OFF,
                   help="generation: a new prompt that starts with tokens a cache slot holds (a running or finished "
                        "sequence's) copies their keys/values instead of prefilling them (default on)")


def settings_from_args(argv: Sequence[str] | None = None, environ: dict[str, str] | None = None,
                       parser_class: type[argparse.ArgumentParser] = argparse.ArgumentParser) -> ServerSettings:
    """Parses flags (+ config file + environment) into validated settings; SettingsError on bad input."""
    parser = build_parser(parser_class)
    args = vars(parser.parse_args(argv))
    values: dict[str, Any] = {}
    config = args.pop("config", None)
    if config is not None:
        values.update(load_config_file(config))
    env = os.environ if environ is None else environ
    if env.get("ORTSERVE_AUTH_TOKEN"):
        values["auth_token"] = env["ORTSERVE_AUTH_TOKEN"]
    values.update({k: _coerce(k, v) for k, v in args.items()})
    return ServerSettings(**values).validate()
