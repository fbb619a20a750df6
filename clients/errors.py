"""The one exception type the client library raises."""
from __future__ import annotations

import grpc


class OrtserveError(Exception):
    """A failed call: the gRPC status code and the server's (or the client's) message."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "OrtserveError":
        # Both sync and aio errors implement grpc.Call's code()/details().
        code = error.code() if hasattr(error, "code") else grpc.StatusCode.UNKNOWN
        details = error.details() if hasattr(error, "details") else str(error)
        return cls(code or grpc.StatusCode.UNKNOWN, details or "")

    def __reduce__(self):  # keeps the error picklable (Ray ships exceptions between processes)
        return (type(self), (self.code, self.message))
