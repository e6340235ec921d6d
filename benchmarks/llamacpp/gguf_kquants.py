"""A simple quantizer to GGUF's K-quants (Q4_K, Q5_K, Q6_K) for the GGUF files the tests and the
benchmarks write (:mod:`benchmarks.llamacpp.gguf_export`): gguf-py quantizes Q8_0, Q4_0, Q4_1,
Q5_0 and Q5_1 but no K-quant (``gguf.quants.quantize`` raises).

Not llama.cpp's quantizer (``make_qkx2_quants`` searches scales and mins that minimise the
error): here each sub-block's range is covered with scales and mins rounded up to the format's
steps, so every value lies within half a quantization step of its code. The block layouts are
ggml's (ggml-common.h); ``gguf.quants.dequantize`` reads them back
(tests/benchmarks/test_gguf_kquants.py). Not in the wheel: the product only reads GGUF files.
"""

from __future__ import annotations

import numpy as np

QK_K = 256


def _half_up(v: np.ndarray) -> np.ndarray:
    """``v`` (>= 0) rounded to float16, up: never below v (so scales cover their range)."""
    h = v.astype(np.float16)
    low = h.astype(np.float32) < v
    h[low] = np.nextafter(h[low], np.float16(np.inf))
    return h


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.divide(a, b, out=np.zeros(np.broadcast(a, b).shape, np.float32), where=b > 0)


def _scales_mins_k(values: np.ndarray, levels: int) -> tuple[np.ndarray, ...]:
    """Q4_K/Q5_K's scales for super-blocks [B, 8, 32] and ``levels`` codes: the float16 d and
    dmin [B], the 6-bit scales and mins [B, 8], so that value = d * sc * q - dmin * m covers
    each sub-block's [min(x, 0), max(x)]."""
    low = np.minimum(values.min(axis=-1), 0.0)
    high = values.max(axis=-1)
    dmin = _half_up((-low).max(axis=-1) / 63)
    mins = np.ceil(_divide(-low, dmin.astype(np.float32)[:, None])).clip(0, 63)
    offset = dmin.astype(np.float32)[:, None] * mins
    need = (high + offset) / (levels - 1)
    d = _half_up(need.max(axis=-1) / 63)
    scales = np.ceil(_divide(need, d.astype(np.float32)[:, None])).clip(0, 63)
    return d, dmin, scales.astype(np.uint8), mins.astype(np.uint8)


def _codes_k(
    values: np.ndarray,
    d: np.ndarray,
    dmin: np.ndarray,
    scales: np.ndarray,
    mins: np.ndarray,
    levels: int,
) -> np.ndarray:
    step = d.astype(np.float32)[:, None] * scales
    offset = dmin.astype(np.float32)[:, None] * mins
    q = np.rint(_divide(values + offset[..., None], step[..., None]))
    return q.clip(0, levels - 1).astype(np.uint8)


def _pack_scales(scales: np.ndarray, mins: np.ndarray) -> np.ndarray:
    """8 six-bit scales and mins [B, 8] into the 12 bytes get_scale_min_k4 unpacks."""
    out = np.zeros((scales.shape[0], 12), np.uint8)
    out[:, 0:4] = (scales[:, :4] & 63) | ((scales[:, 4:] >> 4) << 6)
    out[:, 4:8] = (mins[:, :4] & 63) | ((mins[:, 4:] >> 4) << 6)
    out[:, 8:12] = (scales[:, 4:] & 0xF) | ((mins[:, 4:] & 0xF) << 4)
    return out


def _pack_nibbles_k(q: np.ndarray) -> np.ndarray:
    """Codes [B, 8, 32] -> qs [B, 128]: sub-block 2c in the low nibbles of bytes 32c.., 2c + 1 in
    the high ones."""
    q = q.reshape(-1, 4, 2, 32)
    return ((q[:, :, 0] & 0xF) | ((q[:, :, 1] & 0xF) << 4)).reshape(-1, 128).astype(np.uint8)


def _quantize_q45_k(rows: np.ndarray, five: bool) -> np.ndarray:
    values = rows.astype(np.float32).reshape(-1, 8, 32)
    levels = 32 if five else 16
    d, dmin, scales, mins = _scales_mins_k(values, levels)
    q = _codes_k(values, d, dmin, scales, mins, levels)
    parts = [d.reshape(-1, 1).view(np.uint8), dmin.reshape(-1, 1).view(np.uint8)]
    parts.append(_pack_scales(scales, mins))
    if five:
        bits = (q >> 4) & 1  # [B, 8, 32]: bit j of qh[l] is code l of sub-block j
        parts.append(
            (bits << np.arange(8, dtype=np.uint8)[None, :, None]).sum(axis=1).astype(np.uint8)
        )
    parts.append(_pack_nibbles_k(q))
    return np.concatenate(parts, axis=-1)


def _quantize_q6_k(rows: np.ndarray) -> np.ndarray:
    values = rows.astype(np.float32).reshape(-1, 16, 16)
    need = np.abs(values).max(axis=-1) / 31  # codes -32..31 around 0; -32 unused
    d = _half_up(need.max(axis=-1) / 127)
    scales = np.ceil(_divide(need, d.astype(np.float32)[:, None])).clip(0, 127)
    step = d.astype(np.float32)[:, None] * scales
    q = (np.rint(_divide(values, step[..., None])).clip(-32, 31) + 32).astype(np.uint8)
    q = q.reshape(-1, 2, 4, 32)  # half, quarter, l
    ql = np.concatenate(
        [
            (q[:, :, 0] & 0xF) | ((q[:, :, 2] & 0xF) << 4),
            (q[:, :, 1] & 0xF) | ((q[:, :, 3] & 0xF) << 4),
        ],
        axis=-1,
    ).reshape(-1, 128)
    qh = (
        (q[:, :, 0] >> 4)
        | ((q[:, :, 1] >> 4) << 2)
        | ((q[:, :, 2] >> 4) << 4)
        | ((q[:, :, 3] >> 4) << 6)
    )
    parts = [ql.astype(np.uint8), qh.reshape(-1, 64).astype(np.uint8)]
    parts += [scales.astype(np.int8).view(np.uint8), d.reshape(-1, 1).view(np.uint8)]
    return np.concatenate(parts, axis=-1)


def quantize_k(data: np.ndarray, type_name: str) -> np.ndarray:
    """``data`` [N, K] (K a multiple of 256) as the uint8 blocks [N, K / 256 * type_size] of
    ``type_name`` ("Q4_K", "Q5_K" or "Q6_K").

    Raises:
        ValueError: another type, or K not a multiple of 256.
    """
    n, k = data.shape
    if k % QK_K:
        raise ValueError(f"{type_name}: K = {k} is not a multiple of {QK_K}")
    blocks = data.reshape(-1, QK_K)
    if type_name == "Q6_K":
        out = _quantize_q6_k(blocks)
    elif type_name in ("Q4_K", "Q5_K"):
        out = _quantize_q45_k(blocks, five=type_name == "Q5_K")
    else:
        raise ValueError(f"no K-quant quantizer for {type_name}")
    return out.reshape(n, -1)


def quantize(data: np.ndarray, type_name: str) -> np.ndarray:
    """``data`` [N, K] as the GGUF blocks of ``type_name``: the K-quants here, the other types
    through ``gguf.quants.quantize`` (F32, F16; BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1), all as uint8
    [N, row_bytes]."""
    if type_name in ("Q4_K", "Q5_K", "Q6_K"):
        return quantize_k(data, type_name)
    import gguf

    qtype = gguf.GGMLQuantizationType[type_name]
    out = gguf.quants.quantize(data.astype(np.float32), qtype)
    return np.ascontiguousarray(out).view(np.uint8).reshape(data.shape[0], -1)
