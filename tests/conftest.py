"""Shared test helpers: where the shared test data lives."""

from __future__ import annotations

from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def stories_dir() -> Path:
    """../shared/models/stories260K (skips when the shared folder is absent)."""
    path = SHARED / "models" / "stories260K"
    if not path.exists():
        pytest.skip(f"shared test model missing: {path}")
    return path
