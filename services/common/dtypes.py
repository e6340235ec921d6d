"""Safetensors dtype names and their torch equivalents (safetensors format spec, "dtype" field)."""

from __future__ import annotations

import torch

SAFETENSORS_TO_TORCH: dict[str, torch.dtype] = {
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
TORCH_TO_SAFETENSORS: dict[torch.dtype, str] = {v: k for k, v in SAFETENSORS_TO_TORCH.items()}


def torch_dtype(name: str) -> torch.dtype:
    """Returns the torch dtype of a safetensors dtype name such as ``"BF16"``.

    Raises:
        ValueError: the name is not a supported safetensors dtype.
    """
    try:
        return SAFETENSORS_TO_TORCH[name]
    except KeyError:
        raise ValueError(f"unsupported safetensors dtype {name!r}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """Returns the safetensors name (``"F32"``, ``"BF16"`` ...) of a torch dtype."""
    return TORCH_TO_SAFETENSORS[dtype]
