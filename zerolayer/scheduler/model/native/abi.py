"""The C ABI of ``csrc/api.h`` for ctypes: the signatures (one table, kept in step with the
header: a change there bumps ``ZL_ABI_VERSION`` and :data:`ABI_VERSION` here), the dtype codes,
and how arrays of tensors and errors cross it."""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import torch

ABI_VERSION = 3
"""``ZL_ABI_VERSION`` of the header these signatures follow."""
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1}
"""``ZL_FLOAT32``, ``ZL_BFLOAT16``."""

_P, _I32, _I64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
_F32, _F64, _STR = ctypes.c_float, ctypes.c_double, ctypes.c_char_p

SIGNATURES: dict[str, tuple[type | None, tuple[type, ...]]] = {
    "zl_abi_version": (_I32, ()),
    "zl_last_error": (_STR, ()),
    "zl_isa_cap": (_STR, ()),
    "zl_isa_level": (_STR, ()),
    "zl_max_skinny_rows": (_I32, ()),
    "zl_has_bf16_dot": (_I32, ()),
    "zl_skinny_linear_isa": (_STR, (_I32,)),
    "zl_int8_linear_isa": (_STR, (_I64,)),
    # dtype, q, out, T, Hq, D, k_cache, v_cache, num_blocks, block_size, Hkv, k strides (3),
    # v strides (3), query_start_loc, seq_lens, B, block_tables, max_blocks, scale, isa, threads
    "zl_paged_attention": (
        _I32,
        (_I32, _P, _P, _I64, _I64, _I64, _P, _P, _I64, _I64, _I64)
        + (_I64,) * 6
        + (_P, _P, _I64, _P, _I64, _F32, _STR, _I32),
    ),
    "zl_paged_attention_isa": (_STR, ()),
    # x, w, y, m, k, n, isa, threads
    "zl_skinny_linear": (_I32, (_P, _P, _P, _I64, _I64, _I64, _STR, _I32)),
    # x, m, k, count, ws, ns, ys, threads
    "zl_skinny_linear_multi": (_I32, (_P, _I64, _I64, _I64, _P, _P, _P, _I32)),
    # x, w, y, m, k, n, threads
    "zl_bf16_gemm": (_I32, (_P, _P, _P, _I64, _I64, _I64, _I32)),
    "zl_bf16_gemm_isa": (_STR, ()),
    # dtype, x, w, y, m, k, n, threads
    "zl_invariant_linear": (_I32, (_I32, _P, _P, _P, _I64, _I64, _I64, _I32)),
    # x dtype, x, m, k, group size, count, wqs, wss, ns, ys, isa, threads
    "zl_int8_linear": (_I32, (_I32, _P, _I64, _I64, _I64, _I64, _P, _P, _P, _P, _STR, _I32)),
    "zl_gguf_isa": (_STR, ()),
    # x dtype, x, m, k, count, types, ws, ns, ys, isa, threads
    "zl_gguf_linear": (_I32, (_I32, _P, _I64, _I64, _I64, _P, _P, _P, _P, _STR, _I32)),
    # type, w, n, k, ids, count, out dtype, out, isa, threads
    "zl_gguf_dequantize": (_I32, (_I32, _P, _I64, _I64, _P, _I64, _I32, _P, _STR, _I32)),
    # x, w, w dtype, y, rows, n, eps, threads
    "zl_rms_norm": (_I32, (_P, _P, _I32, _P, _I64, _I64, _F64, _I32)),
    # h, d, w, w dtype, s, y, rows, n, eps, threads
    "zl_add_rms_norm": (_I32, (_P, _P, _P, _I32, _P, _P, _I64, _I64, _F64, _I32)),
    # x, cos, sin, y, t, heads, dim, threads
    "zl_rotary": (_I32, (_P, _P, _P, _P, _I64, _I64, _I64, _I32)),
    # layers, layer pointers, scale pointers, matrix types, final norm, hidden, intermediate,
    # heads, kv heads, head dim, group size, eps, scale, q/k rows interleaved
    "zl_decode_forward_create": (_P, (_I64, _P, _P, _P, _P) + (_I64,) * 6 + (_F64, _F64, _I32)),
    "zl_decode_forward_destroy": (None, (_P,)),
    # handle, h, m, k caches, v caches, num_blocks, block_size, slot_mapping, block_tables,
    # table width, seq_lens, cos, sin, out, threads, max threads
    "zl_decode_forward_run": (
        _I32,
        (_P, _P, _I64, _P, _P, _I64, _I64, _P, _P, _I64, _P, _P, _P, _P, _I32, _I32),
    ),
}


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Sets every function's ``restype`` and ``argtypes`` on ``lib`` (a CDLL or PyDLL of the
    library); returns it.

    Raises:
        AttributeError: the library lacks one of them.
    """
    for name, (restype, argtypes) in SIGNATURES.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def refuse(message: str) -> None:
    """Raises RuntimeError(``message``): an input a kernel does not take."""
    raise RuntimeError(message)


def pointers(tensors: Sequence[torch.Tensor]) -> ctypes.Array:
    """A C array of the tensors' data pointers (``void* const*``), for one call."""
    return (ctypes.c_void_p * len(tensors))(*[t.data_ptr() for t in tensors])


def check_call(lib: ctypes.CDLL, rc: int) -> None:
    """Raises RuntimeError with the library's reason (``zl_last_error``) when ``rc`` is not 0."""
    if rc != 0:
        raise RuntimeError(lib.zl_last_error().decode(errors="replace"))
