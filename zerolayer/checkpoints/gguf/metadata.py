"""Typed reads of a GGUF file's metadata, each refusal naming its key.

Key names follow ggml's ``docs/gguf.md`` (and gguf-py's ``gguf.constants.Keys``):
``general.*``, ``<arch>.*`` hyperparameters, ``tokenizer.ggml.*``, ``split.*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from zerolayer.checkpoints.errors import CheckpointError

_MISSING = object()


@dataclass(frozen=True)
class Metadata:
    """A GGUF file's metadata (key -> value, as :class:`~.reader.GGUFFile` holds it)."""

    values: dict[str, Any]

    def __contains__(self, key: str) -> bool:
        return key in self.values

    def integer(self, key: str, default: Any = _MISSING) -> int:
        """The integer at ``key``; ``default`` when absent (without one: missing is an error).

        Raises:
            CheckpointError: missing (no default), or not an integer.
        """
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, int) or isinstance(value, bool):
            raise CheckpointError(f"metadata key {key!r} is {value!r}, not an integer")
        return value

    def number(self, key: str, default: Any = _MISSING) -> float:
        """The number (integer or float) at ``key``, as a float; ``default`` when absent.

        Raises:
            CheckpointError: missing (no default), or not a number.
        """
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise CheckpointError(f"metadata key {key!r} is {value!r}, not a number")
        return float(value)

    def string(self, key: str, default: Any = _MISSING) -> str:
        """The string at ``key``; ``default`` when absent.

        Raises:
            CheckpointError: missing (no default), or not a string.
        """
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, str):
            raise CheckpointError(f"metadata key {key!r} is {value!r}, not a string")
        return value

    def boolean(self, key: str, default: Any = _MISSING) -> bool:
        """The bool at ``key``; ``default`` when absent.

        Raises:
            CheckpointError: missing (no default), or not a bool.
        """
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, bool):
            raise CheckpointError(f"metadata key {key!r} is {value!r}, not a bool")
        return value

    def array(self, key: str, item: type | tuple[type, ...], default: Any = _MISSING) -> list:
        """The array at ``key`` whose items are all ``item`` (int excludes bool); ``default``
        when absent.

        Raises:
            CheckpointError: missing (no default), not an array, or an item of another type.
        """
        value = self._get(key, default)
        if value is default and default is not _MISSING:
            return value
        if not isinstance(value, list):
            raise CheckpointError(f"metadata key {key!r} is not an array")
        for i, element in enumerate(value):
            if not isinstance(element, item) or (item is int and isinstance(element, bool)):
                raise CheckpointError(f"metadata key {key!r}: item {i} is {element!r}")
        return value

    def _get(self, key: str, default: Any) -> Any:
        value = self.values.get(key, default)
        if value is _MISSING:
            raise CheckpointError(f"metadata key {key!r} is missing")
        return value
