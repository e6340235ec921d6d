"""Schemathesis (https://schemathesis.readthedocs.io) fuzzes the shared stack's OpenAI-compatible
HTTP endpoint from OpenAI's own request schemas (the pinned subset of its OpenAPI document,
tests/openai_conformance.py): bodies the spec allows (positive) and bodies it does not
(negative), for ``POST /v1/completions`` and ``POST /v1/chat/completions``. No answer may be a
5xx, and every answer, a 400 included, must be of the spec's shape.

The spec leaves its objects open (any other property is valid), where OpenAI, and zerolayer,
refuse a field they do not know: the fuzzer gets the spec's objects closed (``additionalProperties:
false``, a request's ``allOf`` parts merged into one object first), so that a "valid" body is one
both would take and a field it adds is an invalid one.

Bounded: a fixed number of examples per route and mode, derandomized (the same inputs each
run), the generation they ask for capped (``max_tokens`` 4, ``n`` 2) so that each example is a
short generation of the real stack; ``model`` is always the served one (another name is one
404, tested in test_openai_http.py) and a prompt's token ids are folded into the vocabulary
(:data:`FOLD_IDS`), so the rest of the body is what gets checked.
"""

from __future__ import annotations

import pytest
import requests
from openai_conformance import SPEC_PATH

pytestmark = pytest.mark.e2e

schemathesis = pytest.importorskip("schemathesis")
hypothesis = pytest.importorskip("hypothesis")

MAX_EXAMPLES = 25
"""Examples per route and generation mode (4 runs: 100 requests, about 10 s)."""
CAPS = {"max_tokens": 4, "max_completion_tokens": 4, "n": 2}
"""Upper bounds put on the generation a fuzzed body asks for (fields absent stay absent)."""
FOLD_IDS = 256
"""Token ids of a fuzzed prompt at or above this are taken modulo it (the generated ones are
mostly past any vocabulary, a refusal tested on its own), so that the rest of the prompt (a
negative id) is what gets checked."""


@pytest.fixture(scope="module")
def fuzzed_schema():
    """The spec subset's chat and completion operations, as schemathesis reads them."""
    import yaml

    if not SPEC_PATH.exists():
        pytest.skip(f"shared API specification missing: {SPEC_PATH}")
    document = yaml.load(SPEC_PATH.read_text(), Loader=yaml.CSafeLoader)
    document["paths"] = {p: document["paths"][p] for p in ("/completions", "/chat/completions")}
    schemas = document["components"]["schemas"]
    for name in ("CreateCompletionRequest", "CreateChatCompletionRequest"):
        schemas[name] = merged(schemas, schemas[name])
    closed(schemas)
    return schemathesis.openapi.from_dict(document)


def merged(schemas: dict, schema: dict) -> dict:
    """``schema`` with its ``allOf`` parts (components referred to included) merged into one
    object: their properties (a later part's winning) and their required fields."""
    if "$ref" in schema:
        return merged(schemas, schemas[schema["$ref"].rpartition("/")[2]])
    parts = [merged(schemas, part) for part in schema.get("allOf", [])]
    properties, required = {}, []
    for part in [*parts, schema]:
        properties.update(part.get("properties", {}))
        required += [r for r in part.get("required", []) if r not in required]
    out = {k: v for k, v in schema.items() if k != "allOf"}
    return {**out, "type": "object", "properties": properties, "required": required}


def closed(node: object) -> None:
    """Sets ``additionalProperties: false`` on every object schema under ``node`` that lists
    its properties and says nothing of others (in place)."""
    if isinstance(node, list):
        for item in node:
            closed(item)
    elif isinstance(node, dict):
        if "properties" in node and "additionalProperties" not in node and "allOf" not in node:
            node["additionalProperties"] = False
        for value in node.values():
            closed(value)


def bounded(body: object, model: str) -> object:
    """``body`` with the served ``model`` and :data:`CAPS` applied, where it is an object."""
    if not isinstance(body, dict):
        return body
    out = {**body, "model": model}
    if isinstance(out.get("prompt"), list):
        out["prompt"] = [_folded(p) for p in out["prompt"]]
    for field, cap in CAPS.items():
        value = out.get(field)
        if isinstance(value, int) and not isinstance(value, bool) and value > cap:
            out[field] = cap
    return out


def _folded(item: object) -> object:
    if isinstance(item, list):
        return [_folded(i) for i in item]
    if isinstance(item, int) and not isinstance(item, bool) and item >= FOLD_IDS:
        return item % FOLD_IDS
    return item


@pytest.mark.parametrize("mode", ["positive", "negative"])
@pytest.mark.parametrize("path", ["/completions", "/chat/completions"])
def test_no_fuzzed_body_gets_a_5xx_and_every_answer_is_the_specs(
    shared_stack, fuzzed_schema, openai_spec, path, mode
) -> None:
    base_url = f"http://{shared_stack.stack.config.http_listen}/v1"
    model = requests.get(f"{base_url}/models", timeout=10).json()["data"][0]["id"]
    operation = fuzzed_schema[path]["POST"]
    session = requests.Session()
    strategy = operation.as_strategy(schemathesis.GenerationMode(mode))
    seen: list[int] = []

    @hypothesis.settings(
        max_examples=MAX_EXAMPLES,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[hypothesis.Phase.generate],
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(case=strategy)
    def fuzz(case) -> None:
        case.body = bounded(case.body, model)
        response = case.call(base_url=base_url, session=session, timeout=60)
        seen.append(response.status_code)
        assert response.status_code < 500, (case.body, response.text[:500])
        content_type = response.headers.get("content-type", [""])
        if isinstance(content_type, list):
            content_type = content_type[0] if content_type else ""
        openai_spec.check_answer(
            "POST", f"/v1{path}", response.status_code, content_type, response.content
        )

    fuzz()
    assert seen, "no example ran"
