"""Fixtures of the checkpoint writers' tests."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest


@pytest.fixture
def strict_umask() -> Iterator[None]:
    """umask 077 while the test runs: written modes must not depend on it."""
    previous = os.umask(0o077)
    yield
    os.umask(previous)
