"""The whole decode step in one native call (``csrc/decode_forward.cpp``), where it applies.

A decode step of a small model at batch 1 is bound by reading the weights, but the Python forward
adds about twenty calls per layer and a parallel region (with a thread wake-up, since the
scheduler keeps libgomp's spin short) per GEMV. ``DecodeForward`` runs all layers in one region
with a spinning barrier between phases. It covers the standard Llama layer in bfloat16 on the CPU
(no biases, no q/k norms, SiLU, RMSNorm, no sliding window or soft-capping, separate q/k/v and
gate/up projections; bfloat16 weights, or the int8 ones of ``zerolayer quantize``):
:func:`unsupported_reason` says why another model keeps the Python forward, and
:meth:`FusedDecode.applies` which steps take it (decode only: one new token per sequence, at most
``max_skinny_rows`` sequences).
"""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType

import torch
import torch.nn.functional as F

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.attention import AttentionMetadata
from zerolayer.scheduler.model.int8_linear import Int8Weight
from zerolayer.scheduler.model.layer_ops import rms_norm


def unsupported_reason(
    config: ModelConfig,
    layers: list,
    dtype: torch.dtype,
    device: torch.device,
    act: Callable,
    norm: Callable,
) -> str | None:
    """Why the fused decode step does not apply to a model; None when it does.

    Args:
        config: the model's config.
        layers: its :class:`~zerolayer.scheduler.model.llama.LayerWeights`.
        dtype, device: of its weights.
        act, norm: the forward's activation and norm functions.
    """
    if device.type != "cpu" or dtype != torch.bfloat16:
        return "not a bfloat16 model on the CPU"
    if act is not F.silu or norm is not rms_norm:
        return "not SiLU and RMSNorm"
    if config.window_layers or config.attn_logit_softcapping is not None:
        return "sliding-window layers or logit soft-capping"
    if config.head_dim % 2 or config.head_dim > 1024:
        return f"head_dim {config.head_dim}"
    for layer in layers:
        if len(layer.qkv) != 3 or len(layer.gate_up) != 2:
            return "fused projections"
        if any(
            x is not None
            for x in (
                layer.qkv_bias,
                layer.o_bias,
                layer.gate_up_bias,
                layer.down_bias,
                layer.q_norm,
                layer.k_norm,
                layer.pre_feedforward_norm,
                layer.post_feedforward_norm,
            )
        ):
            return "biases or extra norms"
        matrices = (*layer.qkv, layer.o_proj, *layer.gate_up, layer.down_proj)
        if all(isinstance(w, Int8Weight) for w in matrices):
            if len({w.group_size for w in matrices}) != 1:
                return "int8 weights of several group sizes"
            weights = [w.qweight for w in matrices]
            tensors = [t for w in matrices for t in w.tensors()]
        elif all(isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16 for w in matrices):
            weights = tensors = list(matrices)
        else:
            return "weights neither all bfloat16 nor all int8"
        if not all(t.is_contiguous() for t in tensors):
            return "non-contiguous weights"
        if any(w.shape[1] % 16 for w in weights):
            return "a projection's input size is not a multiple of 16"
    return None


class FusedDecode:
    """The native decode step over one model's weights (held by reference, not copied)."""

    def __init__(
        self,
        native: ModuleType,
        config: ModelConfig,
        layers: list,
        final_norm: torch.Tensor,
        scale: float,
    ) -> None:
        """
        Args:
            native: the loaded kernel module (``KernelLoader.load()``).
            config, layers, final_norm: the model's, checked by :func:`unsupported_reason`.
            scale: the attention's score scale.

        Raises:
            RuntimeError: a weight of an unexpected shape or dtype (the kernel's check).
        """
        self.max_rows = native.max_skinny_rows
        matrices = [(*x.qkv, x.o_proj, *x.gate_up, x.down_proj) for x in layers]
        int8 = isinstance(matrices[0][0], Int8Weight)
        self._step = native.DecodeForward(
            [
                [
                    layer.input_norm,
                    *[w.qweight if int8 else w for w in ms[:3]],
                    ms[3].qweight if int8 else ms[3],
                    layer.post_attention_norm,
                    *[w.qweight if int8 else w for w in ms[4:]],
                ]
                for layer, ms in zip(layers, matrices, strict=True)
            ],
            [[w.scales for w in ms] for ms in matrices] if int8 else [],
            final_norm,
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
            config.rms_norm_eps,
            scale,
        )

    def applies(self, num_tokens: int, meta: AttentionMetadata, caches: list) -> bool:
        """Whether a step takes the fused path: every sequence is fed one token (a decode, or a
        one-token chunk of a prompt), at most ``max_rows`` of them, over contiguous bfloat16 CPU
        caches."""
        k_cache = caches[0][0]
        return (
            1 <= num_tokens <= self.max_rows
            and meta.seq_lens.shape[0] == num_tokens
            and k_cache.dtype == torch.bfloat16
            and k_cache.is_cpu
            and k_cache.is_contiguous()
        )

    def __call__(
        self,
        h: torch.Tensor,
        caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        cos: torch.Tensor,
        sin: torch.Tensor,
    ) -> torch.Tensor:
        """[M, H] embeddings -> [M, H] final-norm hidden states (bfloat16); writes each layer's
        K and V at ``meta.slot_mapping``.

        Raises:
            RuntimeError: inputs the kernel refuses (shapes, out-of-range blocks or slots),
                checked before anything is written.
        """
        return self._step.forward(
            h,
            [k for k, _ in caches],
            [v for _, v in caches],
            meta.slot_mapping,
            meta.block_tables,
            meta.seq_lens,
            cos,
            sin,
        )
