"""OpenAI's error bodies and HTTP statuses (zerolayer.frontend.openai.errors)."""

from __future__ import annotations

import grpc
import pytest
from pydantic import ValidationError

from zerolayer.common.errors import (
    InvalidArgument,
    NotFound,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
)
from zerolayer.frontend.openai.errors import error_of, validation_error
from zerolayer.frontend.openai.schema import ChatCompletionRequest, CompletionRequest
from zerolayer.frontend.text.validation import ServedModel, check_model


def model_not_found() -> NotFound:
    """The domain's refusal of a model that is not served (text.validation.check_model)."""
    try:
        check_model("x", ServedModel("tiny", 259, 64))
    except NotFound as exc:
        return exc
    raise AssertionError("check_model accepted a model that is not served")


@pytest.mark.parametrize(
    ("exc", "status", "kind", "code"),
    [
        (model_not_found(), 404, "invalid_request_error", "model_not_found"),
        # Another thing not found is no model: no code, no param.
        (NotFound("model_version: '2' is not served"), 404, "invalid_request_error", None),
        (
            Unauthenticated("authorization: unknown bearer token"),
            401,
            "authentication_error",
            "invalid_api_key",
        ),
        (ResourceExhausted("kv: too long"), 429, "rate_limit_error", None),
        (Unavailable("scheduler: down"), 503, "server_error", None),
        (RuntimeError("bug"), 500, "server_error", None),
    ],
)
def test_domain_errors_have_the_status_of_their_grpc_code(exc, status, kind, code) -> None:
    error = error_of(exc, chat=False)
    assert error.status == status
    assert error.body["error"]["type"] == kind and error.body["error"]["code"] == code
    # OpenAI names the model as the param of model_not_found
    assert error.body["error"]["param"] == ("model" if code == "model_not_found" else None)


def test_an_upstream_grpc_error_keeps_its_status() -> None:
    upstream = grpc.aio.AioRpcError(
        grpc.StatusCode.DEADLINE_EXCEEDED, grpc.aio.Metadata(), grpc.aio.Metadata(), "late"
    )
    assert error_of(upstream, chat=True).status == 504


def test_an_invalid_argument_names_the_openai_field() -> None:
    error = error_of(InvalidArgument("max_new_tokens", "too many"), chat=False)
    assert (error.status, error.body["error"]["param"]) == (400, "max_tokens")
    assert error.body["error"]["message"] == "max_tokens: too many"
    refused = InvalidArgument("logprobs", "at most 20")
    assert error_of(refused, chat=True).body["error"]["message"] == "top_logprobs: at most 20"


def test_a_domain_reason_is_the_code() -> None:
    overflow = InvalidArgument("max_new_tokens", "context")
    overflow.reason = "context-length-exceeded"
    assert error_of(overflow, chat=False).body["error"]["code"] == "context_length_exceeded"


@pytest.mark.parametrize(
    ("model", "body", "param", "message"),
    [
        (CompletionRequest, {"prompt": "x", "n": "2"}, "n", "n: Input should be a valid integer"),
        (CompletionRequest, {"prompt": "x", "foo": 1}, "foo", "foo: unrecognized request argument"),
        (CompletionRequest, {"prompt": 1}, "prompt", "prompt: Input should be a valid string"),
        (
            CompletionRequest,
            [],
            None,
            "request body: Input should be a valid dictionary or instance of CompletionRequest",
        ),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": 1}]},
            "messages[0].content",
            "messages[0].content: Input should be a valid string",
        ),
    ],
)
def test_a_body_pydantic_refuses_is_a_400_naming_the_field(model, body, param, message) -> None:
    with pytest.raises(ValidationError) as refused:
        model.model_validate(body)
    error = validation_error(refused.value)
    assert (error.status, error.body["error"]["param"], error.body["error"]["message"]) == (
        400,
        param,
        message,
    )
