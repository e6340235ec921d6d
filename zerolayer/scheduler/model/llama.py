"""The Llama decoder forward in torch, reading weights in place from mapped tensors.

Architecture: Touvron et al. 2023 (arXiv:2302.13971, 2307.09288): pre-norm RMSNorm (Zhang &
Sennrich 2019), rotary positions, grouped-query attention (Ainslie et al. 2023), SwiGLU MLP
(Shazeer 2020). Numerics follow transformers' LlamaForCausalLM: RMSNorm in float32 then cast back.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.attention import AttentionMetadata, paged_attention, write_kv
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.rope import RotaryEmbedding, apply_rotary


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights (views into the mapped checkpoint, never copies)."""

    input_norm: torch.Tensor
    q_proj: torch.Tensor
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    post_attention_norm: torch.Tensor
    gate_proj: torch.Tensor
    up_proj: torch.Tensor
    down_proj: torch.Tensor


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm of ``x`` [..., H]: normalized in float32, cast back, scaled by ``weight`` [H]."""
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(x.dtype)


class LlamaModel:
    """Forward of a Llama decoder over paged KV caches.

    Runs where its weights are (:attr:`device`: the CPU, or a CUDA device when the weights
    arrive as CUDA tensors); the inputs and KV caches handed to :meth:`forward` must be there too.

    Raises:
        KeyError: a weight is missing from ``weights``.
        ValueError: a weight's shape does not match the config, or the weights are on several
            devices.
    """

    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor]) -> None:
        self.config = config
        self.embed_tokens = weights["model.embed_tokens.weight"]
        self.dtype = self.embed_tokens.dtype
        self.device = self.embed_tokens.device
        self.norm = weights["model.norm.weight"]
        self.lm_head = (
            self.embed_tokens
            if config.tie_word_embeddings
            else weights.get("lm_head.weight", self.embed_tokens)
        )
        self.layers = [self._layer(weights, i) for i in range(config.num_hidden_layers)]
        self.rotary = RotaryEmbedding(
            config.rope, config.head_dim, config.max_position_embeddings, self.device
        )
        self.scale = config.head_dim**-0.5
        expected = (config.vocab_size, config.hidden_size)
        if tuple(self.embed_tokens.shape) != expected:
            raise ValueError(
                f"embed_tokens: shape {tuple(self.embed_tokens.shape)}, config says {expected}"
            )
        used = [
            self.norm,
            self.lm_head,
            *(t for layer in self.layers for t in vars(layer).values()),
        ]
        devices = {tensor.device for tensor in used} - {self.device}
        if devices:
            raise ValueError(
                f"weights on {sorted(map(str, devices))}, embed_tokens on {self.device}"
            )

    @staticmethod
    def _layer(weights: dict[str, torch.Tensor], i: int) -> LayerWeights:
        p = f"model.layers.{i}."
        return LayerWeights(
            input_norm=weights[p + "input_layernorm.weight"],
            q_proj=weights[p + "self_attn.q_proj.weight"],
            k_proj=weights[p + "self_attn.k_proj.weight"],
            v_proj=weights[p + "self_attn.v_proj.weight"],
            o_proj=weights[p + "self_attn.o_proj.weight"],
            post_attention_norm=weights[p + "post_attention_layernorm.weight"],
            gate_proj=weights[p + "mlp.gate_proj.weight"],
            up_proj=weights[p + "mlp.up_proj.weight"],
            down_proj=weights[p + "mlp.down_proj.weight"],
        )

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: list[tuple[torch.Tensor, torch.Tensor]],
        meta: AttentionMetadata,
        kernels: KernelLoader | None = None,
    ) -> torch.Tensor:
        """Runs all layers on one step's tokens, writing their K/V into the caches.

        Args:
            input_ids: int64 [T] token ids of the step (all sequences, flat).
            positions: int64 [T] absolute position of each token in its sequence.
            kv_caches: per layer (k_cache, v_cache), each [num_blocks, block_size, Hkv, D].
            meta: slot mapping and block tables of the step.
            kernels: native attention and decode GEMV when they load; None: pure torch.

        Returns:
            [T, hidden_size] final-norm hidden states in the model dtype.
        """
        cfg = self.config
        linear = kernels.linear if kernels is not None else F.linear
        h = F.embedding(input_ids, self.embed_tokens)
        cos, sin = self.rotary.tables(positions, self.dtype)
        num_tokens = input_ids.shape[0]
        for layer, (k_cache, v_cache) in zip(self.layers, kv_caches, strict=True):
            x = rms_norm(h, layer.input_norm, cfg.rms_norm_eps)
            q = linear(x, layer.q_proj).view(num_tokens, cfg.num_attention_heads, cfg.head_dim)
            k = linear(x, layer.k_proj).view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
            v = linear(x, layer.v_proj).view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
            q = apply_rotary(q, cos, sin)
            k = apply_rotary(k, cos, sin)
            write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            attn = paged_attention(q, k_cache, v_cache, meta, self.scale, kernels)
            h = h + linear(attn.reshape(num_tokens, -1), layer.o_proj)
            x = rms_norm(h, layer.post_attention_norm, cfg.rms_norm_eps)
            h = h + linear(
                F.silu(linear(x, layer.gate_proj)) * linear(x, layer.up_proj), layer.down_proj
            )
        return rms_norm(h, self.norm, cfg.rms_norm_eps)

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, kernels: KernelLoader | None = None
    ) -> torch.Tensor:
        """[B, hidden_size] hidden states -> float32 [B, vocab_size] logits.

        ``kernels``: the native GEMV for small batches (see :meth:`KernelLoader.linear`).
        """
        linear = kernels.linear if kernels is not None else F.linear
        return linear(hidden, self.lm_head).float()
