"""Safetensors dtype names, their sizes and their torch equivalents (safetensors format spec,
"dtype" field).

torch is imported only by the functions that return torch dtypes, so the layers that only read
headers and sizes (loader, kvstore on CPU) start without it.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    import torch

T = TypeVar("T")

ITEM_SIZES: dict[str, int] = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
}
"""Bytes per element of each supported safetensors dtype."""


def itemsize(name: str) -> int:
    """Bytes per element of a safetensors dtype name such as ``"BF16"``.

    Raises:
        ValueError: the name is not a supported safetensors dtype.
    """
    return _look_up(ITEM_SIZES, name)


TORCH_NAMES: dict[str, str] = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
}
"""The torch name (``torch.<name>``) of each supported safetensors dtype."""


def torch_name(name: str) -> str:
    """Returns the torch-style name (``"bfloat16"``) of a safetensors dtype name (``"BF16"``),
    without importing torch.

    Raises:
        ValueError: the name is not a supported safetensors dtype.
    """
    return _look_up(TORCH_NAMES, name)


@cache
def _to_torch() -> dict[str, torch.dtype]:
    import torch

    return {name: getattr(torch, attr) for name, attr in TORCH_NAMES.items()}


def torch_dtype(name: str) -> torch.dtype:
    """Returns the torch dtype of a safetensors dtype name such as ``"BF16"`` (imports torch).

    Raises:
        ValueError: the name is not a supported safetensors dtype.
    """
    return _look_up(_to_torch(), name)


def _look_up(table: dict[str, T], name: str) -> T:
    try:
        return table[name]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Returns the safetensors name (``"F32"``, ``"BF16"`` ...) of a torch dtype."""
    return {v: k for k, v in _to_torch().items()}[dtype]
