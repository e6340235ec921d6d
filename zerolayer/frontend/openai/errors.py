"""Errors of the OpenAI-compatible HTTP API: OpenAI's body ``{"error": {"message", "type",
"param", "code"}}`` with the HTTP status of the gRPC status the same error answers with on the
gRPC port (``zerolayer.common.status``), mapped as google.rpc.Code documents
(https://github.com/googleapis/googleapis/blob/master/google/rpc/code.proto)."""

from __future__ import annotations

import grpc
from pydantic import ValidationError

from zerolayer.common.errors import InvalidArgument, ZerolayerError
from zerolayer.common.status import answer_status
from zerolayer.frontend.http_call import HTTP_STATUS, HttpError, grpc_code_of
from zerolayer.frontend.openai.params import openai_param

ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "invalid_request_error",
    429: "rate_limit_error",
}
"""OpenAI's ``error.type`` by HTTP status; any other: ``invalid_request_error`` below 500,
``server_error`` from 500 on."""
ERROR_CODES = {401: "invalid_api_key"}
"""OpenAI's ``error.code`` by HTTP status; others: the domain error's ``reason``
(``context_length_exceeded``; ``model_not_found``, whose ``param`` is ``model``), or None."""
UNION_TAGS = frozenset({"str", "int", "float", "bool", "list", "dict", "none"})
"""Names pydantic gives the members of a union in an error's location."""


def http_error(
    status: int,
    message: str,
    param: str | None = None,
    code: str | None = None,
    grpc_code: grpc.StatusCode | None = None,
) -> HttpError:
    """OpenAI's error body with ``status``'s ``type``; ``grpc_code`` None: the first code of
    :data:`HTTP_STATUS` with that status (INTERNAL if none)."""
    if grpc_code is None:
        grpc_code = grpc_code_of(status)
    error = {
        "message": message,
        "type": ERROR_TYPES.get(
            status, "invalid_request_error" if status < 500 else "server_error"
        ),
        "param": param,
        "code": code or ERROR_CODES.get(status),
    }
    return HttpError(status, {"error": error}, grpc_code.name)


def error_of(exc: Exception, chat: bool) -> HttpError:
    """The answer to an error raised while serving a request (logs an unexpected one, as the
    gRPC edge does). An :class:`InvalidArgument` names its field as OpenAI calls it, in
    ``param`` and at the start of the message."""
    status = answer_status(exc)
    http_status = HTTP_STATUS.get(status.code, 500)
    reason = exc.reason.replace("-", "_") if isinstance(exc, ZerolayerError) else ""
    if reason == "model_not_found":
        return http_error(http_status, status.details, "model", reason, status.code)
    if not isinstance(exc, InvalidArgument):
        return http_error(http_status, status.details, None, reason or None, status.code)
    param = openai_param(exc.field, chat)
    message = f"{param}: {status.details.removeprefix(f'{exc.field}: ')}"
    return http_error(http_status, message, param, reason or None, status.code)


def validation_error(exc: ValidationError) -> HttpError:
    """400 for a body pydantic refused: its first error, naming the field (``messages[0].role``)
    as OpenAI does, not FastAPI's 422 list."""
    first = exc.errors(include_url=False)[0]
    param = ""
    for part in first["loc"]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in UNION_TAGS or "[" in part or "-" in part:
            break  # pydantic names the member of a union it tried; OpenAI's param stops here
        else:
            param += f".{part}" if param else part
    if first["type"] == "extra_forbidden":
        return http_error(400, f"{param}: unrecognized request argument", param)
    message = f"{param}: {first['msg']}" if param else f"request body: {first['msg']}"
    return http_error(400, message, param or None)
