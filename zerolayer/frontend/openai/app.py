"""The OpenAI-compatible HTTP API of the frontend (``--http-listen``), a FastAPI app over the same
:class:`TextGenerator` as the gRPC service.

Routes: ``POST /v1/completions``, ``POST /v1/chat/completions`` (``stream``: server-sent events,
https://html.spec.whatwg.org/multipage/server-sent-events.html, ending ``data: [DONE]``),
``GET /v1/models``, ``GET /v1/models/{model}``, ``GET /health`` (200 while the process runs) and
``GET /ready`` (200 while a scheduler can take requests, else 503). A model other than the served
one is OpenAI's 404 ``model_not_found`` (``param`` ``model``), on ``GET /v1/models/{model}`` as on
a generation. Generation calls need a tenant like gRPC's Generate (``Authorization: Bearer
<token>`` with ``--tenants``; 401 otherwise); the rest stay open, like GetModelInfo and health.
Each generation is a SERVER span that joins the caller's trace (W3C ``traceparent`` header). A
client that disconnects ends its request, streamed or not: closing the generation aborts it in the
scheduler, which frees its blocks.
"""

from __future__ import annotations

import logging
import time

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from zerolayer.common.errors import NotFound, Unauthenticated, ZerolayerError
from zerolayer.common.generation import GenerateParams
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.http_call import CallRecord, HttpError, start_call
from zerolayer.frontend.http_exchange import (
    MAX_BODY_BYTES,
    BodyTooLarge,
    ClientGone,
    ClosingStreamingResponse,
    first_chunk,
    generation_refusal,
    pin_refusal_headers,
    read_json,
    whole_generation,
)
from zerolayer.frontend.openai.errors import error_of, http_error, validation_error
from zerolayer.frontend.openai.params import chat_params, completion_params, new_request_id
from zerolayer.frontend.openai.response import ResponseHead, StreamEncoder, whole_response
from zerolayer.frontend.openai.schema import ChatCompletionRequest, CompletionRequest
from zerolayer.frontend.openai.stream import events
from zerolayer.frontend.tenants import TenantPolicy
from zerolayer.frontend.text.validation import check_model

log = logging.getLogger(__name__)

OWNED_BY = "zerolayer"
"""``owned_by`` of the served model in ``/v1/models``."""


def create_app(
    generator: TextGenerator,
    tenants: TenantPolicy | None = None,
    tracing: Tracing | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> FastAPI:
    """The ASGI app of the OpenAI-compatible API (see the module docstring).

    Args:
        tenants: who callers are (bearer tokens only: HTTP has no client certificate here);
            None: nobody is identified.
        tracing: where spans go and how ``traceparent`` is read; None: no spans.
        max_body_bytes: largest request body read; a longer one is a 413.
    """
    routes = OpenAIRoutes(generator, tenants or TenantPolicy(), tracing, max_body_bytes)
    app = FastAPI(docs_url=None, redoc_url=None, openapi_url=None)
    app.add_api_route("/health", routes.health, methods=["GET"])
    app.add_api_route("/ready", routes.ready, methods=["GET"])
    app.add_api_route("/v1/models", routes.models, methods=["GET"])
    app.add_api_route("/v1/models/{model:path}", routes.model, methods=["GET"])
    app.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    app.add_exception_handler(HTTPException, _http_exception)
    app.add_exception_handler(ClientDisconnect, _client_disconnected)
    return app


async def _client_disconnected(request: Request, exc: Exception) -> Response:
    """A client that went away before its request's body ended (its Content-Length promised
    more): a client event, one INFO line; the 499 answers nobody (uvicorn drops it)."""
    return error_response(body_cut_short(request))


def body_cut_short(request: Request) -> HttpError:
    """The 499 of a request whose client disconnected before its body ended, logged in one INFO
    line (a client event, not the server's error)."""
    log.info("%s %s: client disconnected before the body ended", request.method, request.url.path)
    return http_error(499, "client disconnected before the body ended")


async def _http_exception(request: Request, exc: Exception) -> Response:
    """Unknown paths and methods, in OpenAI's error shape."""
    assert isinstance(exc, HTTPException)
    return error_response(http_error(exc.status_code, f"{request.url.path}: {exc.detail}"))


def error_response(error: HttpError) -> JSONResponse:
    """``error`` as a JSON response."""
    return JSONResponse(error.body, status_code=error.status)


class OpenAIRoutes:
    """The handlers, over one :class:`TextGenerator`."""

    def __init__(
        self,
        generator: TextGenerator,
        tenants: TenantPolicy,
        tracing: Tracing | None,
        max_body_bytes: int,
    ) -> None:
        self._generator = generator
        self._max_body_bytes = max_body_bytes
        self._tenants = tenants
        self._tracing = tracing
        self._created = int(time.time())

    async def health(self) -> dict:
        return {"status": "ok"}

    async def ready(self) -> Response:
        if self._generator.ready:
            return JSONResponse({"status": "ready"})
        return error_response(http_error(503, "no scheduler can take requests now"))

    async def models(self) -> dict:
        return {"object": "list", "data": [self._model_card()]}

    async def model(self, model: str) -> Response:
        try:
            check_model(model, self._generator.served)
        except NotFound as exc:
            return error_response(error_of(exc, chat=False))
        return JSONResponse(self._model_card())

    def _model_card(self) -> dict:
        return {
            "id": self._generator.served.name,
            "object": "model",
            "created": self._created,
            "owned_by": OWNED_BY,
            "max_model_len": self._generator.served.max_model_len,
        }

    async def completions(self, request: Request) -> Response:
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request) -> Response:
        return await self._generate(request, chat=True)

    async def _generate(self, request: Request, chat: bool) -> Response:
        call = start_call(request, self._tracing, self._generator.metrics)
        try:
            tenant = self._tenant(request)
            model = ChatCompletionRequest if chat else CompletionRequest
            body = await read_json(request, model, self._max_body_bytes)
            request_id = new_request_id()
            params = chat_params(body, request_id) if chat else completion_params(body, request_id)
        except ClientDisconnect:
            return call.answered(body_cut_short(request))
        except (ZerolayerError, ValueError) as exc:
            return call.answered(_request_error(exc, chat))
        head = ResponseHead(
            f"{'chatcmpl' if chat else 'cmpl'}-{request_id}",
            int(time.time()),
            self._generator.served.name,
            chat,
        )
        logprobs = params.logprobs is not None
        if not body.stream:
            return await self._whole(request, call, params, tenant, head, logprobs)
        options = body.stream_options
        encoder = StreamEncoder(
            head,
            logprobs,
            include_usage=options is not None and options.include_usage,
            continuous_usage=options is not None and options.continuous_usage_stats,
        )
        return await self._stream(request, call, params, tenant, encoder)

    async def _whole(
        self,
        request: Request,
        call: CallRecord,
        params: GenerateParams,
        tenant: str,
        head: ResponseHead,
        logprobs: bool,
    ) -> Response:
        generation = self._generator.generate(params, None, False, tenant, True)
        try:
            chunks = await whole_generation(request, call, generation)
        except ClientGone:
            return call.answered(http_error(499, "client disconnected"))
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(error_of(exc, head.chat))
        headers = pin_refusal_headers(generation_refusal(chunks))
        body = whole_response(head, chunks, logprobs)
        return call.answered(None, JSONResponse(body, headers=headers))

    async def _stream(
        self,
        request: Request,
        call: CallRecord,
        params: GenerateParams,
        tenant: str,
        encoder: StreamEncoder,
    ) -> Response:
        generation = self._generator.generate(params, None, True, tenant, True)
        try:
            first = await first_chunk(request, call, generation)
        except ClientGone:
            return call.answered(http_error(499, "client disconnected"))
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(error_of(exc, encoder.head.chat))
        stream = events(call, generation, first, encoder)
        # NOTE: the pins are made at the first token: its chunk says whether one was refused
        headers = pin_refusal_headers(first.pin_refusal)
        return ClosingStreamingResponse(stream, media_type="text/event-stream", headers=headers)

    def _tenant(self, request: Request) -> str:
        if not self._tenants.enabled:
            return ""
        authorizations = request.headers.getlist("authorization")
        if len(authorizations) > 1:
            raise Unauthenticated("authorization: sent more than once (one token a call)")
        return self._tenants.tenant(authorizations[0] if authorizations else None, None)


def _request_error(exc: Exception, chat: bool) -> HttpError:
    if isinstance(exc, ValidationError):
        return validation_error(exc)
    if isinstance(exc, BodyTooLarge):
        return http_error(413, str(exc), grpc_code=grpc.StatusCode.RESOURCE_EXHAUSTED)
    if isinstance(exc, ValueError):
        return http_error(400, f"request body: not JSON ({exc})")
    return error_of(exc, chat)
