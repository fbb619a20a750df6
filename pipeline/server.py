"""Asking a running server to load new versions now (it would also find them on its next poll).

Goes through the client library's channel (clients/channel.py), so TLS and a bearer token work as for
every other client.
"""
from __future__ import annotations

import logging

import grpc

from clients.channel import call_metadata, channel_spec, sync_channel
from clients.config import ClientConfig
from protos import grpc_service_pb2, grpc_service_pb2_grpc

from .errors import PipelineError

log = logging.getLogger("ortserve.pipeline")

LOAD_TIMEOUT_S = 120.0


def load_into_server(config: ClientConfig, published: dict[str, int]) -> None:
    """RepositoryModelLoad for each published model name; PipelineError naming the one refused."""
    address = ",".join(config.addresses)
    metadata = call_metadata(config)
    with sync_channel(channel_spec(config)) as channel:
        stub = grpc_service_pb2_grpc.GRPCInferenceServiceStub(channel)
        for name, version in published.items():
            try:
                stub.RepositoryModelLoad(grpc_service_pb2.RepositoryModelLoadRequest(model_name=name),
                                         timeout=config.timeout or LOAD_TIMEOUT_S, metadata=metadata)
            except grpc.RpcError as e:
                raise PipelineError(f"server {address} refused to load {name}: {e.code().name}: "
                                    f"{e.details()}") from None
            log.info("server %s now serves %s version %d", address, name, version)
