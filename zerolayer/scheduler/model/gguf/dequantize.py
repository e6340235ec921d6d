"""GGUF blocks dequantized in torch, bit-exact with ``gguf.quants.dequantize`` (gguf-py's
``dequantize_blocks``: the same float32 products and sums in the same order; ggml-quants.c's
``dequantize_row_*`` compute the same values). The reference of ``csrc/gguf_dequant.h`` and the
forward's path where the native kernels do not load.
"""

from __future__ import annotations

import torch

from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight


def _half(blocks: torch.Tensor, offset: int) -> torch.Tensor:
    """The float16 at byte ``offset`` of each block, as float32 [B, 1]."""
    return blocks[:, offset : offset + 2].contiguous().view(torch.float16).float()


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """[B, 16] bytes -> [B, 32] codes: the low nibbles, then the high ones."""
    return torch.cat([qs & 0x0F, qs >> 4], dim=-1)


def _fifth_bits(qh: torch.Tensor) -> torch.Tensor:
    """[B, 4] bytes (a little-endian uint32) -> [B, 32] bits: bit j is value j's fifth bit."""
    bits = (qh.long().unsqueeze(-1) >> torch.arange(8, device=qh.device)) & 1
    return bits.reshape(qh.shape[0], 32)


def _q4_0(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * (_nibbles(b[:, 2:]).to(torch.int8) - 8).float()


def _q4_1(b: torch.Tensor) -> torch.Tensor:
    return _half(b, 0) * _nibbles(b[:, 4:]).float() + _half(b, 2)


def _q5_0(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 6:]).long() | (_fifth_bits(b[:, 2:6]) << 4)
    return _half(b, 0) * (q - 16).float()


def _q5_1(b: torch.Tensor) -> torch.Tensor:
    q = _nibbles(b[:, 8:]).long() | (_fifth_bits(b[:, 4:8]) << 4)
    return _half(b, 0) * q.float() + _half(b, 2)


def _q8_0(b: torch.Tensor) -> torch.Tensor:
    return b[:, 2:].contiguous().view(torch.int8).float() * _half(b, 0)


def _scales_mins(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 packed bytes [B, 12] -> 6-bit scales and mins [B, 8] (get_scale_min_k4)."""
    d, m, md = packed.reshape(-1, 3, 4).unbind(dim=1)
    scales = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mins = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return scales, mins


def _q45_k(b: torch.Tensor, five: bool) -> torch.Tensor:
    scales, mins = _scales_mins(b[:, 4:16])
    d = (_half(b, 0) * scales.float()).unsqueeze(-1)
    dm = (_half(b, 2) * mins.float()).unsqueeze(-1)
    qs = b[:, 48:] if five else b[:, 16:]
    q = torch.stack([qs.reshape(-1, 4, 32) & 0x0F, qs.reshape(-1, 4, 32) >> 4], dim=2)
    q = q.reshape(-1, 8, 32).long()
    if five:
        shifts = torch.arange(8, device=b.device).view(1, 8, 1)
        q = q | (((b[:, 16:48].long().unsqueeze(1) >> shifts) & 1) << 4)
    return (d * q.float() - dm).reshape(-1, 256)


def _q6_k(b: torch.Tensor) -> torch.Tensor:
    scales = b[:, 192:208].contiguous().view(torch.int8).float()
    d = (_half(b, 208) * scales).reshape(-1, 16, 1)
    shifts = torch.tensor([0, 4, 0, 2, 4, 6], dtype=torch.uint8, device=b.device)
    ql = b[:, :128].reshape(-1, 2, 1, 64) >> shifts[:2].view(1, 1, 2, 1)
    ql = (ql & 0x0F).reshape(-1, 8, 32)
    qh = b[:, 128:192].reshape(-1, 2, 1, 32) >> shifts[2:].view(1, 1, 4, 1)
    qh = (qh & 0x03).reshape(-1, 8, 32)
    q = ((ql | (qh << 4)).to(torch.int8) - 32).reshape(-1, 16, 16).float()
    return (d * q).reshape(-1, 256)


_BLOCKS = {
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q8_0": _q8_0,
    "Q4_K": lambda b: _q45_k(b, five=False),
    "Q5_K": lambda b: _q45_k(b, five=True),
    "Q6_K": _q6_k,
}
_FLOATS = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}


def dequantize_reference(
    weight: QuantWeight, dtype: torch.dtype = torch.float32, ids: torch.Tensor | None = None
) -> torch.Tensor:
    """The weight's values (the rows ``ids`` only, when given) in ``dtype``: computed in float32
    exactly as gguf-py, then rounded once (to nearest even) to ``dtype``.

    Returns:
        [N or len(ids), K] in ``dtype``.
    """
    data = weight.data if ids is None else weight.data.index_select(0, ids.to(torch.long))
    rows, k = data.shape[0], weight.shape[1]
    name = weight.qtype.name
    if name in _FLOATS:
        return data.contiguous().view(_FLOATS[name]).to(dtype)
    blocks = data.reshape(-1, weight.qtype.type_size)
    return _BLOCKS[name](blocks).reshape(rows, k).to(dtype)
