"""Fixtures of the model tests."""

from __future__ import annotations

import pytest

from zerolayer.scheduler.model.kernels import KernelLoader


@pytest.fixture(scope="module")
def native() -> KernelLoader:
    """The built native kernels, in the per-user build cache (built once per machine and torch);
    a failed build fails the test (a machine without a compiler is not a pass)."""
    loader = KernelLoader()
    if not loader.native_available():
        pytest.fail(f"native kernels did not build: {loader.unavailable_reason}")
    return loader
