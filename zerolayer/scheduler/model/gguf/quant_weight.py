"""A linear weight of a GGUF type, used in place: the blocks as the file holds them."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES, GGUFType

FLOAT_TYPES = {torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16"}
"""The GGUF type of a float tensor's dtype."""


@dataclass(frozen=True)
class QuantWeight:
    """A matrix [N, K] of a GGUF type: ``data`` is uint8 [N, row_bytes], a view of the mapped
    file (the blocks of a quantized type, the values' bytes of F32, F16 or BF16), never copied
    or dequantized whole."""

    data: torch.Tensor
    """uint8 [N, K / block_size * type_size], contiguous."""
    qtype: GGUFType
    """The blocks' type."""
    shape: tuple[int, int]
    """The logical shape (N, K)."""

    @classmethod
    def of(cls, tensor: torch.Tensor, type_name: str, name: str = "weight") -> QuantWeight:
        """The weight a mapped tensor holds: a uint8 [N, row_bytes] view of a quantized type's
        blocks, or a float tensor [N, K] (``type_name`` F32, F16 or BF16, its dtype).

        Raises:
            ValueError: the tensor is not 2-D and contiguous, its dtype does not match
                ``type_name``, or its rows are not whole blocks (the message names ``name``).
        """
        qtype = SERVED_TYPES.get(type_name)
        if qtype is None:
            raise ValueError(
                f"{name}: GGUF type {type_name!r} is not supported "
                f"(supported: {', '.join(SERVED_TYPES)})"
            )
        if tensor.dim() != 2 or not tensor.is_contiguous():
            raise ValueError(f"{name}: a contiguous 2-D tensor expected, got {list(tensor.shape)}")
        if not qtype.quantized:
            if FLOAT_TYPES.get(tensor.dtype) != qtype.name:
                raise ValueError(f"{name}: {qtype.name} expected, got {tensor.dtype}")
            n, k = tensor.shape
            return cls(tensor.view(torch.uint8), qtype, (n, k))
        if tensor.dtype != torch.uint8:
            raise ValueError(
                f"{name}: the uint8 blocks of {qtype.name} expected, got {tensor.dtype}"
            )
        n, row_bytes = tensor.shape
        if row_bytes % qtype.type_size:
            raise ValueError(
                f"{name}: rows of {row_bytes} bytes are not whole {qtype.name} blocks "
                f"of {qtype.type_size} bytes"
            )
        return cls(tensor, qtype, (n, row_bytes // qtype.type_size * qtype.block_size))

    @property
    def device(self) -> torch.device:
        """Where the weight is."""
        return self.data.device

    def rows(self, start: int, stop: int) -> QuantWeight:
        """Rows [start, stop) (clipped to N), as a weight viewing the same blocks."""
        stop = min(stop, self.shape[0])
        return QuantWeight(self.data[start:stop], self.qtype, (stop - start, self.shape[1]))

    def tensors(self) -> list[torch.Tensor]:
        """Its one tensor."""
        return [self.data]
