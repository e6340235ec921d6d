"""The error every checkpoint reader raises."""

from __future__ import annotations


class CheckpointError(ValueError):
    """The model directory is missing files or holds a malformed or refused checkpoint."""
