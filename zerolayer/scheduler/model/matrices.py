"""The forward's matrices as the checkpoint stores them: in the model dtype, int8 with scales
(``zerolayer quantize``), or a GGUF type's blocks (:class:`QuantWeight`); each used in place, and
the pure-torch linear and embedding over any of them."""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.gguf.dequantize import dequantize_reference
from zerolayer.scheduler.model.gguf.linear import Dequantize, quant_linear_chunked
from zerolayer.scheduler.model.gguf.quant_weight import FLOAT_TYPES, QuantWeight
from zerolayer.scheduler.model.int8_linear import Int8Weight, int8_linear_chunked

Matrix = torch.Tensor | Int8Weight | QuantWeight
"""A linear weight [N, K]: in the model dtype, int8 with scales, or of a GGUF type."""


def compute_dtype(
    config: ModelConfig, embedding: torch.Tensor, quant_types: Mapping[str, str] | None
) -> torch.dtype:
    """The dtype of the activations and the KV cache.

    Args:
        embedding: the checkpoint's embedding tensor.
        quant_types: the GGUF types of a GGUF checkpoint's tensors (None: not one). A GGUF model
            computes in its config's dtype (the reader's choice: bfloat16, or float32 when asked
            or when every matrix is F32), else in bfloat16 unless its embedding is a float tensor.
            Other checkpoints compute in their embedding's dtype, which their matrices share.
    """
    if quant_types is None:
        return embedding.dtype
    if config.dtype is not None:
        return getattr(torch, config.dtype)
    return embedding.dtype if embedding.is_floating_point() else torch.bfloat16


def model_matrix(
    tensor: torch.Tensor,
    name: str,
    dtype: torch.dtype,
    quant_types: Mapping[str, str] | None,
    int8_scales: torch.Tensor | None = None,
) -> Matrix:
    """The matrix ``name`` as the forward uses it, in place: a :class:`QuantWeight` for a name
    in ``quant_types`` or a float tensor of another dtype than ``dtype`` (a GGUF file's F16
    matrices in a bfloat16 model), an :class:`Int8Weight` when ``int8_scales`` are given, else
    the tensor.

    Raises:
        ValueError: the tensor does not hold its GGUF type's blocks (the message names it).
    """
    if quant_types is not None and name in quant_types:
        return QuantWeight.of(tensor, quant_types[name], name)
    if int8_scales is not None:
        return Int8Weight(tensor, int8_scales)
    if tensor.dtype != dtype and tensor.dtype in FLOAT_TYPES and tensor.dim() == 2:
        return QuantWeight.of(tensor, FLOAT_TYPES[tensor.dtype], name)
    return tensor


def matrix_tensors(matrix: Matrix) -> list[torch.Tensor]:
    """The tensors a matrix is made of."""
    return [matrix] if isinstance(matrix, torch.Tensor) else matrix.tensors()


def torch_linear(x: torch.Tensor, weight: Matrix) -> torch.Tensor:
    """``F.linear(x, weight)`` without native kernels: int8 and GGUF weights a block of rows
    dequantized at a time (:func:`int8_linear_chunked`, :func:`quant_linear_chunked`).

    Returns:
        [M, N] in the dtype of ``x``.
    """
    if isinstance(weight, Int8Weight):
        return int8_linear_chunked(x, weight)
    if isinstance(weight, QuantWeight):
        return quant_linear_chunked(x, weight)
    return F.linear(x, weight)


def embedding(
    table: torch.Tensor | QuantWeight,
    ids: torch.Tensor,
    dtype: torch.dtype,
    dequantize: Dequantize | None = None,
) -> torch.Tensor:
    """The rows ``ids`` of the embedding ``table`` in ``dtype``: of a GGUF table only those rows
    are dequantized (``dequantize``: the native kernel; None: the torch reference).

    Returns:
        [len(ids), hidden_size].
    """
    if isinstance(table, torch.Tensor):
        return F.embedding(ids, table)
    if dequantize is not None and ids.is_cpu and table.device.type == "cpu":
        return dequantize(table, dtype, ids)
    return dequantize_reference(table, dtype, ids)
