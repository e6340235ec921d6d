"""The fused decode step's handle (``csrc/decode_forward.cpp``): the library holds pointers to one
model's weights, which this object keeps alive."""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Sequence

import torch

from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.native.abi import check_call, pointers, refuse

BFLOAT16 = torch.bfloat16
DENSE_BF16, INT8 = -1, -2
"""The matrix type codes of ``zl_decode_forward_create`` besides the GGUF type ids."""


class DecodeForward:
    """A whole decode step of a standard Llama layer stack in one native call."""

    def __init__(
        self,
        lib: ctypes.CDLL,
        max_rows: int,
        layers: Sequence[Sequence[torch.Tensor | QuantWeight]],
        scales: Sequence[Sequence[torch.Tensor]],
        final_norm: torch.Tensor,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        eps: float,
        scale: float,
        qk_rows_interleaved: bool = False,
    ) -> None:
        """
        Args:
            lib: the library (declared, GIL released).
            max_rows: most sequences of a step (``max_skinny_rows``).
            layers: per layer [input_norm [H], q [Hq*D, H], k [Hkv*D, H], v [Hkv*D, H],
                o [H, Hq*D], post_attention_norm [H], gate [I, H], up [I, H], down [H, I]]:
                matrices contiguous bfloat16 or int8 tensors, or GGUF weights of any types
                (read in place, held here), norms bfloat16 or float32 (rounded to bfloat16
                copies).
            scales: empty unless the matrices are int8 (``zerolayer quantize``): then per
                layer the float32 [N, K / G] scales of q, k, v, o, gate, up, down (one G).
            final_norm: [H], bfloat16 or float32.
            num_heads, num_kv_heads, head_dim, eps, scale: the attention's and norms'.
            qk_rows_interleaved: q and k rows in llama.cpp's interleaved rotary layout (a GGUF
                llama file); their outputs are mapped to rotate-half before RoPE.

        Raises:
            RuntimeError: a weight of an unexpected shape or dtype.
        """
        if not layers:
            refuse("DecodeForward: no layers")
        if any(len(layer) != 9 for layer in layers):
            refuse("DecodeForward: a layer is [input_norm, q, k, v, o, post_norm, gate, up, down]")
        if scales and len(scales) != len(layers):
            refuse("DecodeForward: int8 scales for every layer or none")
        self._lib, self.max_rows = lib, max_rows
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.hidden, self.intermediate = layers[0][0].shape[0], layers[0][6].shape[0]
        q_dim, kv_dim = num_heads * head_dim, num_kv_heads * head_dim
        shapes = {1: (q_dim, self.hidden), 2: (kv_dim, self.hidden), 3: (kv_dim, self.hidden)}
        shapes |= {4: (self.hidden, q_dim), 6: (self.intermediate, self.hidden)}
        shapes |= {7: (self.intermediate, self.hidden), 8: (self.hidden, self.intermediate)}
        weight_dtype = torch.int8 if scales else BFLOAT16
        self._held: list[torch.Tensor] = []
        """Every tensor the library points into."""
        types: list[int] = []
        if scales and any(len(s) != 7 for s in scales):
            refuse("DecodeForward: 7 scale tensors per layer expected")
        group_sizes = set()
        for i, layer in enumerate(layers):
            for j, t in enumerate(layer):
                if j in shapes:
                    held, code = self._matrix(t, shapes[j], weight_dtype)
                    self._held.append(held)
                    types.append(code)
                else:
                    self._held.append(self._norm(t))
            if scales:
                matrices = [layer[j] for j in (1, 2, 3, 4, 6, 7, 8)]
                group_sizes |= {
                    self._scales(w, s) for w, s in zip(matrices, scales[i], strict=True)
                }
        if len(group_sizes) > 1:
            refuse("DecodeForward: one group size expected")
        self._final_norm = self._norm(final_norm)
        self._scales_held = [s for per_layer in scales for s in per_layer]
        handle = lib.zl_decode_forward_create(
            len(layers),
            pointers(self._held),
            pointers(self._scales_held) if scales else None,
            (ctypes.c_int32 * len(types))(*types),
            self._final_norm.data_ptr(),
            self.hidden,
            self.intermediate,
            num_heads,
            num_kv_heads,
            head_dim,
            group_sizes.pop() if scales else 0,
            eps,
            scale,
            qk_rows_interleaved,
        )
        if not handle:
            raise RuntimeError(lib.zl_last_error().decode(errors="replace"))
        self._handle = handle
        weakref.finalize(self, lib.zl_decode_forward_destroy, handle)

    def _matrix(
        self, t: torch.Tensor | QuantWeight, shape: tuple[int, int], dtype: torch.dtype
    ) -> tuple[torch.Tensor, int]:
        """The tensor the library reads for one matrix, and its type code."""
        if isinstance(t, QuantWeight):
            if not (
                t.shape == shape
                and t.data.dtype == torch.uint8
                and t.data.is_cpu
                and t.data.is_contiguous()
                and shape[1] % t.qtype.block_size == 0
            ):
                refuse(
                    f"DecodeForward: a contiguous {t.qtype.name} {list(shape)} matrix expected, "
                    f"got {list(t.shape)}"
                )
            return t.data, t.qtype.ggml_type
        if not (
            t.dtype == dtype
            and t.dim() == 2
            and t.is_cpu
            and t.is_contiguous()
            and tuple(t.shape) == shape
            and shape[1] % 16 == 0
        ):
            kind = "int8" if dtype == torch.int8 else "bfloat16"
            refuse(
                f"DecodeForward: a contiguous {kind} [{shape[0]}, {shape[1]}] matrix (columns a "
                f"multiple of 16) expected, got {list(t.shape)}"
            )
        return t, INT8 if dtype == torch.int8 else DENSE_BF16

    def _norm(self, t: torch.Tensor) -> torch.Tensor:
        if t.dim() != 1 or t.shape[0] != self.hidden or not t.is_cpu:
            refuse(f"DecodeForward: norms of [{self.hidden}] expected")
        return t.to(BFLOAT16).contiguous()

    @staticmethod
    def _scales(w: torch.Tensor, s: torch.Tensor) -> int:
        """Checks int8 scales [N, K / G]; returns G."""
        if not (
            s.dtype == torch.float32
            and s.dim() == 2
            and s.is_cpu
            and s.is_contiguous()
            and s.shape[0] == w.shape[0]
            and s.shape[1] >= 1
            and w.shape[1] % s.shape[1] == 0
        ):
            refuse(f"DecodeForward: float32 scales [N, K / G] expected, got {list(s.shape)}")
        return w.shape[1] // s.shape[1]

    def forward(
        self,
        h: torch.Tensor,
        k_caches: Sequence[torch.Tensor],
        v_caches: Sequence[torch.Tensor],
        slot_mapping: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        num_threads: int = 0,
    ) -> torch.Tensor:
        """One decode step of M <= ``max_rows`` sequences, one token each.

        Args:
            h: [M, H] bfloat16 token embeddings.
            k_caches, v_caches: per layer [num_blocks, block_size, Hkv, D] bfloat16, contiguous;
                written at the slots.
            slot_mapping: int64 [M]; block_tables: int64 [M, N]; seq_lens: int64 [M] (after
                this step).
            cos, sin: [M, 1, D] bfloat16.
            num_threads: threads of the step's region, at most torch's count (0: all).

        Returns:
            The final-norm hidden states [M, H] in bfloat16.

        Raises:
            RuntimeError: inputs of the wrong shape or dtype, or indices out of range (a slot,
                a block id, the new token's slot not at the sequence's last position), checked
                before anything is written.
        """
        m = h.shape[0] if h.dim() == 2 else 0
        if not (
            1 <= m <= self.max_rows
            and h.dtype == BFLOAT16
            and h.shape[1] == self.hidden
            and h.is_contiguous()
            and h.is_cpu
        ):
            refuse(
                f"decode_forward: h must be a contiguous bfloat16 [M, {self.hidden}] with "
                f"1 <= M <= {self.max_rows}"
            )
        num_layers = len(self._held) // 9
        if len(k_caches) != num_layers or len(v_caches) != num_layers:
            refuse("decode_forward: one K and one V cache per layer expected")
        shape = (*k_caches[0].shape[:2], self.num_kv_heads, self.head_dim)
        for c in (*k_caches, *v_caches):
            if not (c.dtype == BFLOAT16 and c.is_cpu and c.is_contiguous() and c.shape == shape):
                refuse(
                    "decode_forward: caches must be contiguous bfloat16 [num_blocks, block_size, "
                    f"{self.num_kv_heads}, {self.head_dim}]"
                )
        indices = (slot_mapping, seq_lens, block_tables)
        if not (
            all(t.dtype == torch.int64 and t.is_cpu for t in indices)
            and slot_mapping.numel() == m
            and seq_lens.numel() == m
            and block_tables.dim() == 2
            and block_tables.shape[0] == m
        ):
            refuse("decode_forward: int64 slot_mapping [M], seq_lens [M], block_tables [M, N]")
        size = m * self.head_dim
        if not (
            cos.dtype == sin.dtype == BFLOAT16
            and cos.numel() == sin.numel() == size
            and cos.is_cpu
            and sin.is_cpu
        ):
            refuse(f"decode_forward: bfloat16 cos and sin of [M, 1, {self.head_dim}] expected")
        slots, lens = slot_mapping.contiguous(), seq_lens.contiguous()
        tables, c, s = block_tables.contiguous(), cos.contiguous(), sin.contiguous()
        out = torch.empty((m, self.hidden), dtype=BFLOAT16)
        rc = self._lib.zl_decode_forward_run(
            self._handle,
            h.data_ptr(),
            m,
            pointers(k_caches),
            pointers(v_caches),
            shape[0],
            shape[1],
            slots.data_ptr(),
            tables.data_ptr(),
            tables.shape[1],
            lens.data_ptr(),
            c.data_ptr(),
            s.data_ptr(),
            out.data_ptr(),
            num_threads,
            torch.get_num_threads(),
        )
        check_call(self._lib, rc)
        return out
