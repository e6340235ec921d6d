"""The Responses API's routes on the frontend's OpenAI-compatible HTTP app
(https://platform.openai.com/docs/api-reference/responses): ``POST /v1/responses`` (``stream``:
server-sent events of ``zerolayer.frontend.responses.events``), ``GET`` and ``DELETE
/v1/responses/{response_id}``, ``GET /v1/responses/{response_id}/input_items``.

Every route needs a tenant as the OpenAI routes do (``Authorization: Bearer <token>`` with
``--tenants``); a stored response is its tenant's alone (``zerolayer.frontend.responses.store``).
A generation is one call of the OpenAI app's kind: a SERVER span, counted in the request
metrics, aborted when its client disconnects.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import anyio
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.requests import ClientDisconnect

from zerolayer.common.generation import GenerationChunk
from zerolayer.common.tracing import Tracing
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.http_call import CallRecord, start_call
from zerolayer.frontend.http_exchange import (
    MAX_BODY_BYTES,
    ClientGone,
    ClosingStreamingResponse,
    first_chunk,
    read_json,
    whole_generation,
)
from zerolayer.frontend.openai.app import OpenAIRoutes, body_cut_short, error_response
from zerolayer.frontend.openai.errors import http_error
from zerolayer.frontend.openai.params import new_request_id
from zerolayer.frontend.openai.stream import sse
from zerolayer.frontend.responses.errors import responses_error
from zerolayer.frontend.responses.events import ResponseEvents
from zerolayer.frontend.responses.items import with_id
from zerolayer.frontend.responses.output import ResponseHead, response_head, whole_response
from zerolayer.frontend.responses.request import ResponseRequest, response_request
from zerolayer.frontend.responses.schema import CreateResponseRequest
from zerolayer.frontend.responses.store import ResponseStore, StoredResponse
from zerolayer.frontend.tenants import TenantPolicy

MAX_INPUT_ITEMS_LIMIT = 100
"""Largest ``limit`` of ``GET .../input_items`` (OpenAI's)."""


def add_responses_routes(
    app: FastAPI,
    generator: TextGenerator,
    store: ResponseStore,
    tenants: TenantPolicy | None = None,
    tracing: Tracing | None = None,
    max_body_bytes: int = MAX_BODY_BYTES,
) -> None:
    """Adds the Responses API's routes to ``app`` (the OpenAI app of
    ``zerolayer.frontend.openai.app.create_app``), keeping stored responses in ``store``."""
    routes = ResponsesRoutes(generator, store, tenants or TenantPolicy(), tracing, max_body_bytes)
    app.add_api_route("/v1/responses", routes.create, methods=["POST"])
    app.add_api_route("/v1/responses/{response_id}", routes.retrieve, methods=["GET"])
    app.add_api_route("/v1/responses/{response_id}", routes.delete, methods=["DELETE"])
    app.add_api_route(
        "/v1/responses/{response_id}/input_items", routes.input_items, methods=["GET"]
    )


class ResponsesRoutes(OpenAIRoutes):
    """The handlers (the OpenAI routes' span, tenant and disconnect handling)."""

    def __init__(
        self,
        generator: TextGenerator,
        store: ResponseStore,
        tenants: TenantPolicy,
        tracing: Tracing | None,
        max_body_bytes: int,
    ) -> None:
        super().__init__(generator, tenants, tracing, max_body_bytes)
        self._store = store

    async def retrieve(self, request: Request, response_id: str) -> Response:
        try:
            entry = self._store.get(self._tenant(request), response_id)
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return error_response(responses_error(exc))
        return JSONResponse(entry.body)

    async def delete(self, request: Request, response_id: str) -> Response:
        try:
            self._store.delete(self._tenant(request), response_id)
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return error_response(responses_error(exc))
        return JSONResponse({"id": response_id, "object": "response", "deleted": True})

    async def input_items(
        self,
        request: Request,
        response_id: str,
        limit: str = "20",
        order: str = "desc",
        after: str = "",
    ) -> Response:
        """OpenAI's list of the response's input items, newest first unless ``order=asc``."""
        try:
            entry = self._store.get(self._tenant(request), response_id)
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return error_response(responses_error(exc))
        if order not in ("asc", "desc"):
            return error_response(http_error(400, "order: 'asc' or 'desc'", "order"))
        if not (limit.isascii() and limit.isdigit() and 1 <= int(limit) <= MAX_INPUT_ITEMS_LIMIT):
            reason = f"limit: an integer from 1 to {MAX_INPUT_ITEMS_LIMIT}"
            return error_response(http_error(400, reason, "limit"))
        size = int(limit)
        items = list(entry.input_items if order == "asc" else reversed(entry.input_items))
        ids = [item["id"] for item in items]
        start = ids.index(after) + 1 if after in ids else 0
        page = items[start : start + size]
        return JSONResponse(
            {
                "object": "list",
                "data": page,
                "first_id": page[0]["id"] if page else None,
                "last_id": page[-1]["id"] if page else None,
                "has_more": start + size < len(items),
            }
        )

    async def create(self, request: Request) -> Response:
        call = start_call(request, self._tracing, self._generator.metrics)
        try:
            tenant = self._tenant(request)
            body = await read_json(request, CreateResponseRequest, self._max_body_bytes)
            previous = None
            if body.previous_response_id is not None:
                previous = self._store.get(
                    tenant, body.previous_response_id, "previous_response_id"
                )
            request_id = new_request_id()
            stored_for_s = self._store.max_age_s if body.store is not False else 0.0
            asked = response_request(body, request_id, previous, stored_for_s)
        except ClientDisconnect:
            return call.answered(body_cut_short(request))
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(responses_error(exc))
        head = response_head(body, request_id, self._generator.served.name)
        tenant_if_kept = tenant if body.store is not False else None
        try:
            generation = self._generator.generate(asked.params, None, body.stream, tenant, True)
            if body.stream:
                first = await first_chunk(request, call, generation)
            else:
                chunks = await whole_generation(request, call, generation)
        except ClientGone:
            return call.answered(http_error(499, "client disconnected"))
        except Exception as exc:  # noqa: BLE001 - the edge answers everything
            return call.answered(responses_error(exc))
        if body.stream:
            stream = self._events(call, generation, first, head, asked, tenant_if_kept)
            return ClosingStreamingResponse(stream, media_type="text/event-stream")
        whole = whole_response(head, chunks)
        if tenant_if_kept is not None:
            self._keep(tenant_if_kept, asked, whole, pinned(chunks))
        return call.answered(None, JSONResponse(whole))

    async def _events(
        self,
        call: CallRecord,
        generation: AsyncIterator[GenerationChunk],
        first: GenerationChunk,
        head: ResponseHead,
        asked: ResponseRequest,
        tenant_if_kept: str | None,
    ) -> AsyncIterator[str]:
        """The stream's events (``event: <type>`` and its JSON); the response is stored once
        it ended (for ``tenant_if_kept``; None: not stored). An error mid-stream is an ``error``
        event, the last."""
        encoder = ResponseEvents(head)
        code, error = "CANCELLED", ""
        pin_ids = first.pin_ids
        try:
            try:
                for event in [*encoder.start(), *encoder.chunk(first)]:
                    yield _event(event)
                while encoder.final is None:
                    with call.current():
                        chunk = await anext(generation)
                    pin_ids = chunk.pin_ids or pin_ids
                    for event in encoder.chunk(chunk):
                        yield _event(event)
                if tenant_if_kept is not None:
                    self._keep(tenant_if_kept, asked, encoder.final, pin_ids)
                code = "OK"
            except Exception as exc:  # noqa: BLE001 - the stream's status is sent already
                failed = responses_error(exc)
                code, error = failed.grpc_code, str(failed.body["error"]["message"])
                details = failed.body["error"]
                yield _event(encoder.error(details["type"], error, details["param"]))
        finally:
            # NOTE: shielded: on a client's disconnect this runs in a cancelled task group.
            with anyio.CancelScope(shield=True):
                await generation.aclose()  # type: ignore[attr-defined]
            call.ended(200, code, error)

    def _keep(
        self, tenant: str, asked: ResponseRequest, body: dict, pin_ids: tuple[str, ...]
    ) -> None:
        input_items = tuple(
            with_id(item, f"item_{body['id'][5:]}_{i}") for i, item in enumerate(asked.input_items)
        )
        stored = asked.conversation[: len(asked.conversation) - len(input_items)]
        self._store.put(
            StoredResponse(
                response_id=body["id"],
                tenant=tenant,
                body=body,
                input_items=input_items,
                conversation=(*stored, *input_items, *body["output"]),
                stored_at=self._store.now(),
                pin_ids=pin_ids,
            )
        )


def pinned(chunks: Sequence[GenerationChunk]) -> tuple[str, ...]:
    """The pins a generation made (its last chunk that names them)."""
    return next((c.pin_ids for c in reversed(chunks) if c.pin_ids), ())


def _event(event: dict) -> str:
    """One server-sent event: ``event: <type>`` then its JSON, as OpenAI sends them."""
    return f"event: {event['type']}\n{sse(event)}"
