"""The GGUF tensor types zerolayer serves, and the bytes a tensor of each takes.

A GGUF tensor of type T stores each row of K weights as K / block_size blocks of type_size bytes
(ggml's ``ggml_type_traits``: ``blck_size``, ``type_size``); the float types are blocks of one
weight. The table is ggml's (``ggml.h``'s ``enum ggml_type`` for the ids) and is checked against
the ``gguf`` package's ``GGML_QUANT_SIZES`` by the tests; it is written out here so that checking
a safetensors checkpoint never imports that package (nor numpy).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GGUFType:
    """One tensor type of GGUF."""

    name: str
    """ggml's name, also ``TensorSpec.dtype`` ("F32", "Q8_0", "Q4_K" ...)."""
    ggml_type: int
    """Its id in the file (``enum ggml_type``)."""
    block_size: int
    """Weights per block (1 for the float types)."""
    type_size: int
    """Bytes per block."""

    @property
    def quantized(self) -> bool:
        """Blocks of several weights with their scales (not a float type)."""
        return self.block_size > 1


SERVED_TYPES: dict[str, GGUFType] = {
    t.name: t
    for t in (
        GGUFType("F32", 0, 1, 4),
        GGUFType("F16", 1, 1, 2),
        GGUFType("Q4_0", 2, 32, 18),
        GGUFType("Q4_1", 3, 32, 20),
        GGUFType("Q5_0", 6, 32, 22),
        GGUFType("Q5_1", 7, 32, 24),
        GGUFType("Q8_0", 8, 32, 34),
        GGUFType("Q4_K", 12, 256, 144),
        GGUFType("Q5_K", 13, 256, 176),
        GGUFType("Q6_K", 14, 256, 210),
        GGUFType("BF16", 30, 1, 2),
    )
}
"""The types of Q8_0 and Q4_K_M files (with llama.cpp's fallbacks for rows that are not a multiple
of 256: Q5_0, Q5_1, Q8_0, Q4_0, Q4_1), by name."""
BY_GGML_TYPE: dict[int, GGUFType] = {t.ggml_type: t for t in SERVED_TYPES.values()}
"""The served types by their id in the file."""


def is_quantized(dtype: str) -> bool:
    """Whether ``dtype`` (a ``TensorSpec.dtype``) is a quantized GGUF type such as "Q8_0"."""
    served = SERVED_TYPES.get(dtype)
    return served is not None and served.quantized


def byte_shape(dtype: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of a tensor's blocks as bytes: ``[..., K // block_size * type_size]`` for a
    tensor ``[..., K]`` of the quantized type ``dtype`` (how the scheduler views it: uint8).

    Raises:
        KeyError: ``dtype`` is not a served GGUF type.
        ValueError: K is not a multiple of the type's block size.
    """
    served = SERVED_TYPES[dtype]
    if shape[-1] % served.block_size:
        raise ValueError(f"row length {shape[-1]} is not a multiple of {served.block_size}")
    return (*shape[:-1], shape[-1] // served.block_size * served.type_size)


def tensor_nbytes(dtype: str, shape: tuple[int, ...]) -> int:
    """Bytes of a tensor ``shape`` (row-major, rows of K = ``shape[-1]``) of the GGUF type
    ``dtype``: rows * K / block_size * type_size.

    Raises:
        KeyError, ValueError: as :func:`byte_shape`.
    """
    count = 1
    for dim in byte_shape(dtype, shape) if is_quantized(dtype) else shape:
        count *= dim
    return count if is_quantized(dtype) else count * SERVED_TYPES[dtype].type_size
