"""The one mapping from data-plane errors to HTTP statuses, and the two error body shapes.

KServe v2 REST answers `{"error": "<message>"}` (what tritonclient.http reads); the OpenAI API answers
`{"error": {"message", "type", "param", "code"}}` (what the openai client reads).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from server.protocol.errors import Code, ServingError

log = logging.getLogger(__name__)

STATUS = {
    Code.INVALID_ARGUMENT: 400,
    Code.FAILED_PRECONDITION: 400,
    Code.NOT_FOUND: 404,
    Code.RESOURCE_EXHAUSTED: 429,
    Code.CANCELLED: 499,
    Code.INTERNAL: 500,
    Code.UNIMPLEMENTED: 501,
    Code.UNAVAILABLE: 503,
    Code.DEADLINE_EXCEEDED: 504,
}
# For the request metrics: HTTP-only refusals, named like the gRPC codes the data plane's errors carry.
CODE_OF_STATUS = {401: "UNAUTHENTICATED", 404: "NOT_FOUND", 405: "UNIMPLEMENTED", 413: "INVALID_ARGUMENT",
                  415: "INVALID_ARGUMENT", 400: "INVALID_ARGUMENT"}
OPENAI_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error",
                405: "invalid_request_error", 413: "invalid_request_error", 415: "invalid_request_error",
                429: "rate_limit_error", 499: "cancelled", 500: "internal_error", 501: "invalid_request_error",
                503: "service_unavailable", 504: "timeout"}


@dataclass
class HttpError(Exception):
    """A refusal decided by the HTTP layer itself (auth, body size, content type, route)."""

    status: int
    message: str
    code: str = ""      # metrics code; CODE_OF_STATUS[status] when empty

    def __str__(self) -> str:
        return self.message


def classify_error(exc: Exception, route: str) -> tuple[int, str, str]:
    """(HTTP status, message, metrics code); anything unexpected is a bug: 500, logged with its traceback."""
    if isinstance(exc, HttpError):
        return exc.status, exc.message, exc.code or CODE_OF_STATUS.get(exc.status, "INVALID_ARGUMENT")
    if isinstance(exc, ServingError):
        return STATUS[exc.code], exc.message, exc.code.value
    log.error("%s failed", route, exc_info=exc)
    return 500, f"{route}: internal error", "INTERNAL"


def param_of(message: str) -> str | None:
    """The field a message starts with ("max_tokens: must be ..." -> "max_tokens"), if it names one."""
    head, sep, _ = message.partition(": ")
    return head if sep and " " not in head and len(head) < 80 else None


def kserve_body(message: str) -> dict[str, Any]:
    return {"error": message}


def openai_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": OPENAI_TYPES.get(status, "api_error"),
                      "param": param_of(message), "code": status}}
