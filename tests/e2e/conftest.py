"""Fixtures of the end-to-end tests of the shared stack's OpenAI-compatible HTTP endpoint."""

from __future__ import annotations

import openai
import pytest


@pytest.fixture(scope="module")
def client(shared_stack, openai_spec) -> openai.OpenAI:
    """The official client of the shared stack's HTTP endpoint; every answer it reads is
    checked against OpenAI's schemas (tests/openai_conformance.py)."""
    return openai_spec.client(f"http://{shared_stack.stack.config.http_listen}/v1", timeout=60)


@pytest.fixture(scope="module")
def model(client) -> str:
    """The served model's name, as ``/v1/models`` lists it."""
    return client.models.list().data[0].id
