"""The Anthropic Messages API on the frontend's HTTP server (``--http-listen``), beside the
OpenAI-compatible routes, over the same :class:`TextGenerator`.

Routes: ``POST /v1/messages`` (``stream``: Anthropic's server-sent events,
``zerolayer.frontend.anthropic.stream``) and ``POST /v1/messages/count_tokens``. With
``--tenants`` both need a tenant's token, sent as ``x-api-key: <token>`` (what Anthropic's
clients send) or ``Authorization: Bearer <token>``; ``anthropic-version`` and Anthropic's other
headers are accepted and ignored. A ``cache_control`` pin the kvstore refused is named in the
response header ``zerolayer-pin-refusal`` (the request ran, nothing was written to the cache).
Each call is a SERVER span that joins the caller's trace and is counted in the frontend's
request metrics, as OpenAI's calls are; a client that disconnects ends its request.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator
from dataclasses import dataclass

import grpc
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import ValidationError

from zerolayer.common.errors import Unauthenticated, ZerolayerError
from zerolayer.common.generation import GenerationChunk
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.anthropic.errors import anthropic_error, error_of, validation_error
from zerolayer.frontend.anthropic.params import count_params, generate_params
from zerolayer.frontend.anthropic.response import MessageHead, message_body
from zerolayer.frontend.anthropic.schema import CountTokensRequest, MessagesRequest
from zerolayer.frontend.anthropic.stream import MessageStreamEncoder, events
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
from zerolayer.frontend.tenants import TenantPolicy

Generation = AsyncGenerator[GenerationChunk, None]


def add_routes(
    app: FastAPI,
    generator: TextGenerator,
    tenants: TenantPolicy | None = None,
    tracing: Tracing | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Adds the Messages API's routes to ``app`` (see the module docstring).

    Args:
        tenants: who callers are (tokens only: HTTP has no client certificate here); None:
            nobody is identified.
        tracing: where spans go and how ``traceparent`` is read; None: no spans.
        max_body_bytes: largest request body read; a longer one is a 413.
    """
    routes = MessagesRoutes(generator, tenants or TenantPolicy(), tracing, max_body_bytes)
    app.add_api_route("/v1/messages", routes.messages, methods=["POST"])
    app.add_api_route("/v1/messages/count_tokens", routes.count_tokens, methods=["POST"])


@dataclass(frozen=True)
class MessagesRoutes:
    """The handlers, over one :class:`TextGenerator` (see :func:`add_routes`)."""

    generator: TextGenerator
    tenants: TenantPolicy
    tracing: Tracing | None
    max_body_bytes: int

    async def messages(self, request: Request) -> Response:
        call = start_call(request, self.tracing, self.generator.metrics)
        try:
            tenant = self._tenant(request)
            body = await read_json(request, MessagesRequest, self.max_body_bytes)
            request_id = uuid.uuid4().hex
            params = generate_params(body, request_id)
        except (ZerolayerError, ValueError) as exc:
            return call.answered(_request_error(exc))
        pin_ttl_s = max((pin.ttl_s for pin in params.cache_pins), default=0)
        head = MessageHead(f"msg_{request_id}", body.model or self.generator.served.name, pin_ttl_s)
        generation = self.generator.generate(
            params, None, body.stream, tenant, True, usage_on_every_chunk=True
        )
        if body.stream:
            return await self._stream(request, call, generation, head)
        return await self._whole(request, call, generation, head)

    async def count_tokens(self, request: Request) -> Response:
        call = start_call(request, self.tracing, self.generator.metrics)
        try:
            self._tenant(request)
            body = await read_json(request, CountTokensRequest, self.max_body_bytes)
            params = count_params(body)
        except (ZerolayerError, ValueError) as exc:
            return call.answered(_request_error(exc))
        try:
            with call.current():
                count = await self.generator.count_prompt_tokens(params)
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(error_of(exc))
        return call.answered(None, JSONResponse({"input_tokens": count}))

    async def _whole(
        self, request: Request, call: CallRecord, generation: Generation, head: MessageHead
    ) -> Response:
        try:
            chunks = await whole_generation(request, call, generation)
            body = message_body(head, chunks)
        except ClientGone:
            return call.answered(anthropic_error(499, "client disconnected"))
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(error_of(exc))
        headers = pin_refusal_headers(generation_refusal(chunks))
        return call.answered(None, JSONResponse(body, headers=headers))

    async def _stream(
        self, request: Request, call: CallRecord, generation: Generation, head: MessageHead
    ) -> Response:
        try:
            first = await first_chunk(request, call, generation)
        except ClientGone:
            return call.answered(anthropic_error(499, "client disconnected"))
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(error_of(exc))
        stream = events(call, generation, first, MessageStreamEncoder(head))
        # NOTE: the pins are made before the first chunk, so its usage has any refusal
        headers = pin_refusal_headers(first.pin_refusal)
        return ClosingStreamingResponse(stream, media_type="text/event-stream", headers=headers)

    def _tenant(self, request: Request) -> str:
        """The caller's tenant from ``x-api-key`` (first) or ``authorization``.

        Raises:
            Unauthenticated: no known token, or one sent more than once.
        """
        if not self.tenants.enabled:
            return ""
        keys = request.headers.getlist("x-api-key")
        authorizations = request.headers.getlist("authorization")
        if len(keys) > 1 or len(authorizations) > 1:
            raise Unauthenticated("x-api-key, authorization: sent more than once (one a call)")
        if keys:
            try:
                return self.tenants.tenant(f"Bearer {keys[0].strip()}", None)
            except Unauthenticated:
                raise Unauthenticated("x-api-key: empty or unknown") from None
        if authorizations:
            return self.tenants.tenant(authorizations[0], None)
        raise Unauthenticated("no tenant: this server needs 'x-api-key: <key>' (or a bearer token)")


def _request_error(exc: Exception) -> HttpError:
    if isinstance(exc, ValidationError):
        return validation_error(exc)
    if isinstance(exc, BodyTooLarge):
        return anthropic_error(413, str(exc), grpc.StatusCode.RESOURCE_EXHAUSTED)
    if isinstance(exc, ValueError):
        return anthropic_error(400, f"request body: not JSON ({exc})")
    return error_of(exc)
