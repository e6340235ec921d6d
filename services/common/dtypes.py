"""Safetensors dtype names, their sizes and their torch equivalents (safetensors format spec,
"dtype" field).

torch is imported only by the functions that return torch dtypes, so the layers that only read
headers and sizes (loader, kvstore on CPU) start without it.
"""

from __future__ import annotations

from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

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
    try:
        return ITEM_SIZES[name]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {name!r}") from None


@cache
def _to_torch() -> dict[str, torch.dtype]:
    import torch

    return {
        "F64": torch.float64,
        "F32": torch.float32,
        "F16": torch.float16,
        "BF16": torch.bfloat16,
        "I64": torch.int64,
        "I32": torch.int32,
        "I16": torch.int16,
        "I8": torch.int8,
        "U8": torch.uint8,
        "BOOL": torch.bool,
    }


def torch_dtype(name: str) -> torch.dtype:
    """Returns the torch dtype of a safetensors dtype name such as ``"BF16"`` (imports torch).

    Raises:
        ValueError: the name is not a supported safetensors dtype.
    """
    try:
        return _to_torch()[name]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Returns the safetensors name (``"F32"``, ``"BF16"`` ...) of a torch dtype."""
    return {v: k for k, v in _to_torch().items()}[dtype]
