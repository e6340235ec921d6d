"""The GGUF tensor types the forward multiplies, by the names the loader gives them
(``MappedWeights.quant_types``) and the ggml ids the native kernels take.

Sizes after ggml's ``ggml-common.h`` (gguf-py: ``GGML_QUANT_SIZES``); the block layouts are in
``csrc/gguf_blocks.h`` and :mod:`zerolayer.scheduler.model.gguf.dequantize`.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GgufType:
    """One tensor type of GGUF files."""

    name: str
    """The type's name in ggml (``Q4_K``)."""
    type_id: int
    """Its ``ggml_type`` id, as GGUF files and ``csrc/api.h`` number it."""
    block_size: int
    """Values per block (1 for the float types)."""
    type_size: int
    """Bytes per block."""

    @property
    def is_float(self) -> bool:
        """F32, F16 or BF16: values stored one by one."""
        return self.block_size == 1

    def row_bytes(self, k: int) -> int:
        """Bytes of a row of ``k`` values.

        Raises:
            ValueError: ``k`` is not a multiple of the block size.
        """
        if k % self.block_size:
            raise ValueError(f"{self.name}: {k} values are not a multiple of {self.block_size}")
        return k // self.block_size * self.type_size


GGUF_TYPES: dict[str, GgufType] = {
    t.name: t
    for t in (
        GgufType("F32", 0, 1, 4),
        GgufType("F16", 1, 1, 2),
        GgufType("BF16", 30, 1, 2),
        GgufType("Q4_0", 2, 32, 18),
        GgufType("Q4_1", 3, 32, 20),
        GgufType("Q5_0", 6, 32, 22),
        GgufType("Q5_1", 7, 32, 24),
        GgufType("Q8_0", 8, 32, 34),
        GgufType("Q4_K", 12, 256, 144),
        GgufType("Q5_K", 13, 256, 176),
        GgufType("Q6_K", 14, 256, 210),
    )
}
"""Every type the kernels take, by name."""


def gguf_type(name: str) -> GgufType:
    """The type called ``name``.

    Raises:
        ValueError: a type the kernels do not take (the message names it and the ones they do).
    """
    found = GGUF_TYPES.get(name)
    if found is None:
        raise ValueError(
            f"GGUF type {name!r} is not supported (supported: {', '.join(GGUF_TYPES)})"
        )
    return found
