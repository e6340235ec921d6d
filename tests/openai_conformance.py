"""Every body the OpenAI-compatible HTTP API answers, checked against OpenAI's published schemas.

The schemas are those of OpenAI's OpenAPI document (github.com/openai/openai-openapi, version
2.3.0), as pinned in ../shared/specs/openai/openapi-subset.yaml (the routes zerolayer serves or is
about to: chat completions, completions, models, responses, and their schemas). Tests reach it
through the ``openai_spec`` fixture (tests/conftest.py), an :class:`OpenAISpec`:

- ``openai_spec(name, value)`` checks ``value`` against the component schema ``name``;
- ``openai_spec.check_answer(method, path, status, content_type, data)`` checks a whole HTTP answer
  (a JSON body, or each event of a server-sent event stream) by its route (:data:`ROUTE_SCHEMAS`);
- ``openai_spec.client(base_url, ...)`` is the official ``openai`` client whose every answer is so
  checked as it is read (a stream's events included): a test that uses it fails on the first body
  that does not conform.

Two readings of the document, both its own: ``nullable: true`` (OpenAPI 3.0's keyword, which the
3.1 document still uses in places and JSON Schema ignores) admits null; and a completion stream's
chunks are ``CreateCompletionResponse`` bodies whose ``finish_reason`` is null until the last and
whose ``usage`` is null but on the last (the document has no chunk schema for completions;
OpenAI's stream sends null there, and ``ChatCompletionStreamOptions.include_usage`` says "all
other chunks will also include a usage field, but with a null value").
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path

import httpx2 as httpx
import jsonschema

SPEC_PATH = (
    Path(__file__).resolve().parents[2] / "shared" / "specs" / "openai" / "openapi-subset.yaml"
)
"""The pinned subset of OpenAI's OpenAPI document (read by tests only, never by the product)."""
COMPLETION_CHUNK = "CreateCompletionResponse (stream chunk)"
"""The name :class:`OpenAISpec` gives a completion stream's chunk schema (see the module doc)."""
ROUTE_SCHEMAS: dict[tuple[str, str], tuple[str, str | None]] = {
    ("GET", "/v1/models"): ("ListModelsResponse", None),
    ("GET", "/v1/models/*"): ("Model", None),
    ("POST", "/v1/completions"): ("CreateCompletionResponse", COMPLETION_CHUNK),
    ("POST", "/v1/chat/completions"): (
        "CreateChatCompletionResponse",
        "CreateChatCompletionStreamResponse",
    ),
    ("POST", "/v1/responses"): ("Response", "ResponseStreamEvent"),
    ("GET", "/v1/responses/*"): ("Response", None),
}
"""(method, path; ``*`` one last segment or more) -> (schema of a 200 JSON body, schema of each
event of a stream). Any answer with status >= 400 is an ``ErrorResponse``, as is an event holding
``error``. Routes not listed (``/health``, ``/ready``, Anthropic's) are not checked here."""


def _nullable_as_json_schema(node: object) -> object:
    """``node`` with every ``nullable: true`` schema turned into ``anyOf: [schema, null]``."""
    if isinstance(node, list):
        return [_nullable_as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _nullable_as_json_schema(v) for k, v in node.items() if k != "nullable"}
    if node.get("nullable") is True:
        return {"anyOf": [out, {"type": "null"}]}
    return out


class OpenAISpec:
    """The component schemas of OpenAI's document, as JSON Schema validators."""

    def __init__(self, document: dict) -> None:
        components = _nullable_as_json_schema(document["components"])
        chunk = copy.deepcopy(components["schemas"]["CreateCompletionResponse"])
        finish = chunk["properties"]["choices"]["items"]["properties"]["finish_reason"]
        finish["enum"] = [*finish["enum"], None]
        finish["type"] = ["string", "null"]
        chunk["properties"]["usage"] = {"anyOf": [chunk["properties"]["usage"], {"type": "null"}]}
        components["schemas"][COMPLETION_CHUNK] = chunk
        self._components = components
        self._validators: dict[str, jsonschema.Draft202012Validator] = {}

    def __call__(self, name: str, value: object) -> None:
        """Checks ``value`` against the schema ``name``.

        Raises:
            jsonschema.ValidationError: it does not conform (the message says where and why).
            KeyError: no schema has that name.
        """
        validator = self._validators.get(name)
        if validator is None:
            self._components["schemas"][name]  # noqa: B018 - KeyError for an unknown name
            root = {"$ref": f"#/components/schemas/{name}", "components": self._components}
            validator = self._validators[name] = jsonschema.Draft202012Validator(root)
        error = jsonschema.exceptions.best_match(validator.iter_errors(value))
        if error is not None:
            error.message = f"{name}: {error.message} (at {list(error.absolute_path)})"
            raise error

    def check_answer(
        self, method: str, path: str, status: int, content_type: str, data: bytes
    ) -> int:
        """Checks one HTTP answer of the route ``method path``: the JSON body of a 200 or an
        error, or every ``data:`` event of a stream but ``[DONE]``.

        Returns:
            The number of bodies checked (0 for a route :data:`ROUTE_SCHEMAS` does not list).
        Raises:
            jsonschema.ValidationError: a body does not conform.
            ValueError: a body is not JSON.
        """
        schemas = route_schemas(method, path)
        if schemas is None:
            return 0
        whole, event = schemas
        if status >= 400:
            self("ErrorResponse", json.loads(data))
            return 1
        if not content_type.startswith("text/event-stream"):
            self(whole, json.loads(data))
            return 1
        bodies = [json.loads(d) for d in sse_data(data.decode()) if d != "[DONE]"]
        for body in bodies:
            self("ErrorResponse" if "error" in body else event or whole, body)
        return len(bodies)

    def client(self, base_url: str, **kwargs: object) -> object:
        """The official ``openai.OpenAI`` client for ``base_url`` (``kwargs`` its own), whose
        every answer is checked by :meth:`check_answer` once read."""
        import openai

        transport = CheckingTransport(self)
        kwargs.setdefault("api_key", "-")
        kwargs.setdefault("max_retries", 0)
        return openai.OpenAI(
            base_url=base_url, http_client=httpx.Client(transport=transport), **kwargs
        )


def route_schemas(method: str, path: str) -> tuple[str, str | None] | None:
    """The :data:`ROUTE_SCHEMAS` entry of ``method path`` (None: not checked)."""
    path = path.split("?")[0]
    if (method, path) in ROUTE_SCHEMAS:
        return ROUTE_SCHEMAS[(method, path)]
    parent, _, _ = path.rpartition("/")
    while parent:
        if (method, f"{parent}/*") in ROUTE_SCHEMAS:
            return ROUTE_SCHEMAS[(method, f"{parent}/*")]
        parent, _, _ = parent.rpartition("/")
    return None


def sse_data(text: str) -> list[str]:
    """The ``data`` of each event of a server-sent event stream
    (https://html.spec.whatwg.org/multipage/server-sent-events.html; lines of one event joined
    by newlines)."""
    out = []
    for event in text.replace("\r\n", "\n").split("\n\n"):
        lines = [line[5:].removeprefix(" ") for line in event.split("\n") if line[:5] == "data:"]
        if lines:
            out.append("\n".join(lines))
    return out


class CheckingTransport(httpx.HTTPTransport):
    """An httpx transport that checks each answer once its body has been read whole (by the
    client, as it iterates a stream: the check runs when the stream ends, before the client
    sees the end)."""

    def __init__(self, spec: OpenAISpec) -> None:
        super().__init__()
        self._spec = spec

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)

        def check(data: bytes, whole: bool) -> None:
            content_type = response.headers.get("content-type", "")
            if not whole:  # closed early (the client stops reading at [DONE]): whole events
                if not content_type.startswith("text/event-stream"):
                    return
                data = data[: data.rfind(b"\n\n") + 2]
            self._spec.check_answer(
                request.method, request.url.path, response.status_code, content_type, data
            )

        return httpx.Response(
            response.status_code,
            headers=response.headers,
            stream=_CheckedStream(response.stream, check),
            extensions=response.extensions,
            request=request,
        )


class _CheckedStream(httpx.SyncByteStream):
    """A byte stream that hands its content to ``check`` once: when it ends (``whole``), or
    what came when it is closed before."""

    def __init__(self, inner: httpx.SyncByteStream, check: Callable[[bytes, bool], None]) -> None:
        self._inner = inner
        self._check = check
        self._data = bytearray()
        self._checked = False

    def __iter__(self) -> Iterator[bytes]:
        for piece in self._inner:
            self._data += piece
            yield piece
        self._checked = True
        self._check(bytes(self._data), True)

    def close(self) -> None:
        self._inner.close()
        if not self._checked:
            self._checked = True
            self._check(bytes(self._data), False)


@cache
def load_spec() -> OpenAISpec | None:
    """The :class:`OpenAISpec` of :data:`SPEC_PATH` (None when the file is absent)."""
    import yaml

    if not SPEC_PATH.exists():
        return None
    return OpenAISpec(yaml.load(SPEC_PATH.read_text(), Loader=yaml.CSafeLoader))
