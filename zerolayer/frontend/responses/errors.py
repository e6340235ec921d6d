"""Errors of ``/v1/responses`` in OpenAI's shape (``zerolayer.frontend.openai.errors``), naming
the Responses API's fields: a stored response that is not there is a 404 naming the field that
named it (``previous_response_id``, ``response_id``)."""

from __future__ import annotations

import grpc
from pydantic import ValidationError

from zerolayer.common.errors import InvalidArgument
from zerolayer.frontend.http_call import HttpError
from zerolayer.frontend.http_exchange import BodyTooLarge
from zerolayer.frontend.openai.errors import error_of, http_error, validation_error
from zerolayer.frontend.responses.store import ResponseNotFound

PARAM_NAMES = {
    "max_new_tokens": "max_output_tokens",
    "prompt": "input",
    "messages": "input",
}
"""GenerateParams field -> the Responses API field a client sent it as (the rest are the
same)."""


def responses_param(field: str) -> str:
    """The Responses API's name of the GenerateParams ``field`` an error names
    (``structured_output.json_schema`` -> ``text.format``, ``messages[2].role`` -> ``input``)."""
    if field.startswith("structured_output"):
        return "text.format"
    if field.startswith("messages"):
        return "input"
    if field.startswith("tools[") and field.endswith(".parameters_json"):
        return field.removesuffix("_json")  # a function tool's JSON schema: its parameters
    return PARAM_NAMES.get(field, field)


def responses_error(exc: Exception) -> HttpError:
    """The answer to an error raised while taking or serving a ``/v1/responses`` call."""
    if isinstance(exc, ValidationError):
        return validation_error(exc)
    if isinstance(exc, BodyTooLarge):
        return http_error(413, str(exc), grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    if isinstance(exc, ResponseNotFound):
        return http_error(404, str(exc), exc.param, "not_found")
    if isinstance(exc, InvalidArgument):
        param = responses_param(exc.field)
        message = f"{param}: {str(exc).removeprefix(f'{exc.field}: ')}"
        return http_error(400, message, param, exc.reason.replace("-", "_") or None)
    if isinstance(exc, ValueError):
        return http_error(400, f"request body: not JSON ({exc})")
    return error_of(exc, chat=True)
