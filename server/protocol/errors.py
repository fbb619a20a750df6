"""The one error type of the data plane, independent of any protocol (the front doors map it to status codes)."""
from __future__ import annotations

import enum


class Code(str, enum.Enum):
    """Error classes; the names are the gRPC status code names they map to."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    CANCELLED = "CANCELLED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    INTERNAL = "INTERNAL"


class ServingError(Exception):
    """A request that cannot be answered; `message` names the offending field where there is one."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(f"{code.value}: {message}")
        self.code = code
        self.message = message

    @classmethod
    def invalid(cls, field: str, problem: str) -> "ServingError":
        return cls(Code.INVALID_ARGUMENT, f"{field}: {problem}")
