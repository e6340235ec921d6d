"""Errors of the Anthropic Messages API: Anthropic's body ``{"type": "error", "error": {"type",
"message"}}`` (https://docs.anthropic.com/en/api/errors) with the HTTP status of the gRPC status
the same error answers with on the gRPC port (``zerolayer.frontend.http_call.HTTP_STATUS``). The
message starts with the field it is about, as Anthropic's do (``max_tokens: Field required``)."""

from __future__ import annotations

import re

import grpc
from pydantic import ValidationError

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.status import answer_status
from zerolayer.frontend.anthropic.params import dotted
from zerolayer.frontend.http_call import HTTP_STATUS, HttpError, grpc_code_of

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    504: "timeout_error",
}
"""Anthropic's ``error.type`` by HTTP status; any other: ``invalid_request_error`` below 500,
``api_error`` from 500 on."""
FIELD_NAMES = {"max_new_tokens": "max_tokens", "prompt": "messages"}
"""GenerateParams field -> the Anthropic field a client sent it as (the rest are the same)."""


def anthropic_error(
    status: int, message: str, grpc_code: grpc.StatusCode | None = None
) -> HttpError:
    """Anthropic's error body with ``status``'s ``type``; ``grpc_code`` None: the first code
    answered with ``status``."""
    kind = ERROR_TYPES.get(status, "invalid_request_error" if status < 500 else "api_error")
    body = {"type": "error", "error": {"type": kind, "message": message}}
    return HttpError(status, body, (grpc_code or grpc_code_of(status)).name)


def error_of(exc: Exception) -> HttpError:
    """The answer to an error raised while serving a request (logs an unexpected one, as the
    gRPC edge does). An :class:`InvalidArgument` names its field as Anthropic calls it (one
    with no field, e.g. too many ``cache_control`` blocks, is Anthropic's message whole)."""
    status = answer_status(exc)
    http_status = HTTP_STATUS.get(status.code, 500)
    message = status.details
    if isinstance(exc, InvalidArgument) and exc.field:
        field = anthropic_field(exc.field)
        message = f"{field}: {message.removeprefix(f'{exc.field}: ')}"
    return anthropic_error(http_status, message, status.code)


def validation_error(exc: ValidationError) -> HttpError:
    """400 for a body pydantic refused: its first error, naming the field as Anthropic does
    (``messages.0.role: Input should be 'user' or 'assistant'``). Of a field that is a union
    (``system``: a string or blocks) pydantic reports each member's error; the deepest is the
    one about what was sent (``system.0.cache_control.ttl``, not ``system: Input should be a
    valid string``)."""
    errors = exc.errors(include_url=False)
    parent = errors[0]["loc"][:-1]
    first = max(
        (e for e in errors if e["loc"][: len(parent)] == parent),
        key=lambda e: len(e["loc"]),
    )
    field = dotted("", first["loc"])
    if first["type"] == "extra_forbidden":
        return anthropic_error(400, f"{field}: Extra inputs are not permitted")
    return anthropic_error(400, f"{field}: {first['msg']}" if field else first["msg"])


def anthropic_field(field: str) -> str:
    """The Anthropic name of the GenerateParams ``field`` an error names (``stop`` and
    ``stop[2]`` -> ``stop_sequences``, ``max_new_tokens`` -> ``max_tokens``, ``prompt`` ->
    ``messages``, ``tools[0].parameters_json`` -> ``tools.0.input_schema``)."""
    if field == "stop" or field.startswith("stop["):
        return "stop_sequences"
    tool = re.fullmatch(r"tools\[(\d+)\]\.(\w+)", field)
    if tool:  # NOTE: in Anthropic's dotted path style; a tool's schema is its input_schema
        name = "input_schema" if tool.group(2) == "parameters_json" else tool.group(2)
        return f"tools.{tool.group(1)}.{name}"
    return FIELD_NAMES.get(field, field)
