"""The Llama decoder forward in torch, reading weights in place from mapped tensors.

Architecture: Touvron et al. 2023 (arXiv:2302.13971, 2307.09288): pre-norm RMSNorm (Zhang &
Sennrich 2019), rotary positions, grouped-query attention (Ainslie et al. 2023), SwiGLU MLP
(Shazeer 2020). Numerics follow transformers' LlamaForCausalLM: RMSNorm in float32 then cast back.
The Llama-like families differ only in options of the same forward: q/k/v biases (Qwen2), per-head
q/k RMSNorm (Qwen3), fused qkv and gate_up matrices (Phi-3), tied embeddings (SmolLM2, Llama 3.2),
Gemma's scaled embedding and (1 + w) RMSNorm, Gemma 2's extra norms and soft-caps (gemma.py).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial

import torch
import torch.nn.functional as F

from zerolayer.checkpoints.int8_format import scale_name
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.attention import AttentionMetadata, paged_attention, write_kv
from zerolayer.scheduler.model.decode_forward import FusedDecode, unsupported_reason
from zerolayer.scheduler.model.gemma import (
    gemma_rms_norm,
    gemma_rms_norm_offset_stored,
    scale_embeddings,
    soft_cap,
)
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.kernels import KernelLoader
from zerolayer.scheduler.model.layer_ops import LayerOps, rms_norm
from zerolayer.scheduler.model.matrices import (
    Matrix,
    compute_dtype,
    embedding,
    matrix_tensors,
    model_matrix,
    torch_linear,
)
from zerolayer.scheduler.model.rope import RotaryEmbedding

log = logging.getLogger(__name__)

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "silu": F.silu,
    "gelu": F.gelu,
    "gelu_pytorch_tanh": partial(F.gelu, approximate="tanh"),
    "relu": F.relu,
}
"""transformers' ACT2FN entries for the config_fields.HIDDEN_ACTS names."""


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's weights (views into the mapped checkpoint, never copies).

    Projections are :class:`Int8Weight` in an int8 checkpoint (``zerolayer quantize``) and
    :class:`QuantWeight` of their GGUF type in a GGUF checkpoint (matrices.py).
    ``qkv`` is (q_proj, k_proj, v_proj), or (qkv_proj,) for fused checkpoints (Phi-3);
    ``gate_up`` is (gate_proj, up_proj) or (gate_up_proj,). Biases and q/k norms are None when
    the family has none, and so are the feed-forward norms outside Gemma 2 (whose
    ``post_attention_norm`` normalizes the attention output, not the MLP input).
    """

    input_norm: torch.Tensor
    qkv: tuple[Matrix, ...]
    qkv_bias: tuple[torch.Tensor, ...] | None
    o_proj: Matrix
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    post_attention_norm: torch.Tensor
    gate_up: tuple[Matrix, ...]
    gate_up_bias: tuple[torch.Tensor, ...] | None
    down_proj: Matrix
    down_bias: torch.Tensor | None
    pre_feedforward_norm: torch.Tensor | None = None
    post_feedforward_norm: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor of the layer (both of an int8 weight)."""
        out: list[torch.Tensor] = []
        for value in vars(self).values():
            if value is not None:
                for item in value if isinstance(value, tuple) else (value,):
                    out.extend(matrix_tensors(item))
        return out


def biased_linear(linear: Callable, fuse_bias: bool) -> Callable:
    """``linear(x, weight)`` extended to ``(x, weight, bias=None)``.

    Args:
        linear: :func:`torch_linear` or :meth:`KernelLoader.linear` (no bias argument).
        fuse_bias: add a bias inside the matmul (``F.linear(x, w, b)``: one rounding to the
            model dtype, as transformers' ``nn.Linear`` does; rounding the product first and
            adding the bias after moved bfloat16 logits by about 0.07); False adds it after
            ``linear`` (keeps a batch-invariant ``linear`` in charge of the matmul).

    Returns:
        A callable giving [M, N] in the dtype of ``x``; a bias is cast to it first (a float32
        bias of a bfloat16 checkpoint, as transformers casts it at load).
    """

    def call(x: torch.Tensor, weight: Matrix, bias: torch.Tensor | None = None) -> torch.Tensor:
        if bias is None:
            return linear(x, weight)
        if fuse_bias and isinstance(weight, torch.Tensor):
            return F.linear(x, weight, bias.to(x.dtype))
        return linear(x, weight) + bias.to(x.dtype)

    return call


def grouped_linear(linear: Callable, kernels: KernelLoader | None) -> Callable:
    """``linear`` (from :func:`biased_linear`) over several weights that share one input.

    Returns:
        A callable ``(x, weights, biases=None)`` giving ``[linear(x, w, b) ...]``; without
        biases and with ``kernels``, one :meth:`KernelLoader.linears` call (one parallel region
        for all the weights in the native decode GEMV).
    """

    def call(
        x: torch.Tensor,
        weights: tuple[torch.Tensor, ...],
        biases: tuple[torch.Tensor, ...] | None = None,
    ) -> list[torch.Tensor]:
        if biases is None and kernels is not None:
            return kernels.linears(x, weights)
        biases = biases or (None,) * len(weights)
        return [linear(x, w, b) for w, b in zip(weights, biases, strict=True)]

    return call


def rotate_half_layout(x: torch.Tensor) -> torch.Tensor:
    """q or k ``x`` [T, heads, D] projected by rows in llama.cpp's interleaved rotary layout
    (a GGUF ``llama`` file's: dimension pairs (2i, 2i + 1) adjacent, convert_hf_to_gguf's
    ``LlamaModel.permute``) in the rotate-half layout instead (pairs (i, i + D/2)), so that RoPE,
    the KV cache and attention are as for a Hugging Face checkpoint. A copy of the output; the
    weights are used in place."""
    num_tokens, heads, head_dim = x.shape
    return x.view(num_tokens, heads, head_dim // 2, 2).transpose(-1, -2).reshape(x.shape)


def _optional(
    weights: dict[str, torch.Tensor], names: list[str]
) -> tuple[torch.Tensor, ...] | None:
    if names[0] not in weights:
        return None
    return tuple(weights[name] for name in names)


class LlamaModel:
    """Forward of a Llama decoder over paged KV caches.

    Runs where its weights are (:attr:`device`: the CPU, or a CUDA device when the weights
    arrive as CUDA tensors); the inputs and KV caches handed to :meth:`forward` must be there too.

    Raises:
        KeyError: a weight is missing from ``weights``.
        ValueError: a weight's shape does not match the config, or the weights are on several
            devices.
    """

    def __init__(
        self,
        config: ModelConfig,
        weights: dict[str, torch.Tensor],
        quant_types: Mapping[str, str] | None = None,
    ) -> None:
        """
        Args:
            quant_types: a GGUF checkpoint's tensor types by name (``MappedWeights.quant_types``):
                those matrices, the embedding included, are used in their blocks
                (:class:`~zerolayer.scheduler.model.gguf.quant_weight.QuantWeight`); None for
                other checkpoints.
        """
        self.config = config
        embed = weights["model.embed_tokens.weight"]
        self._quant_types = quant_types
        self.dtype = compute_dtype(config, embed, quant_types)
        self.device = embed.device
        self.embed_tokens: torch.Tensor | QuantWeight = model_matrix(
            embed, "model.embed_tokens.weight", self.dtype, quant_types
        )
        self.norm = weights["model.norm.weight"]
        # NOTE: with tie_word_embeddings, an lm_head.weight the checkpoint holds anyway is used
        # as transformers 5 uses it: equal to the embedding it changes nothing; different, it
        # "will NOT tie them" and computes the logits with lm_head.weight.
        self._int8 = config.int8_group_size is not None
        self.lm_head = (
            self._matrix(weights, "lm_head.weight")
            if "lm_head.weight" in weights or not config.tie_word_embeddings
            else self.embed_tokens
        )
        self.act = ACTIVATIONS[config.hidden_act]
        self.layers = [self._layer(weights, i) for i in range(config.num_hidden_layers)]
        self.rotary = RotaryEmbedding(
            config.rope, config.head_dim, config.max_position_embeddings, self.device
        )
        self.scale = (config.query_pre_attn_scalar or config.head_dim) ** -0.5
        self.norm_fn = rms_norm
        if config.gemma_norms:
            stored = config.gemma_norm_offset_stored
            self.norm_fn = gemma_rms_norm_offset_stored if stored else gemma_rms_norm
        self._fused_decode: FusedDecode | None = None
        self._fused_decode_checked = False
        if config.sandwich_norms and any(x.post_feedforward_norm is None for x in self.layers):
            raise KeyError("pre/post_feedforward_layernorm.weight (Gemma 2's extra norms)")
        expected = (config.vocab_size, config.hidden_size)
        if tuple(self.embed_tokens.shape) != expected:
            raise ValueError(
                f"embed_tokens: shape {tuple(self.embed_tokens.shape)}, config says {expected}"
            )
        used = [
            self.norm,
            *matrix_tensors(self.lm_head),
            *(t for layer in self.layers for t in layer.tensors()),
        ]
        devices = {tensor.device for tensor in used} - {self.device}
        if devices:
            raise ValueError(
                f"weights on {sorted(map(str, devices))}, embed_tokens on {self.device}"
            )

    def _matrix(self, weights: dict[str, torch.Tensor], name: str) -> Matrix:
        """The linear weight ``name`` in place (:func:`model_matrix`): the tensor, in an int8
        checkpoint the int8 tensor with its ``<name>_scale`` scales, in a GGUF one its blocks."""
        scales = weights[scale_name(name)] if self._int8 else None
        return model_matrix(weights[name], name, self.dtype, self._quant_types, scales)

    def _layer(self, weights: dict[str, torch.Tensor], i: int) -> LayerWeights:
        """Layer ``i``'s tensors by their transformers names; the config's biases, norms and
        fusion decide which exist (checked before start-up by ``weight_check``)."""
        p = f"model.layers.{i}."
        attn, mlp = p + "self_attn.", p + "mlp."
        fused = attn + "qkv_proj.weight" in weights
        qkv = ["qkv_proj"] if fused else ["q_proj", "k_proj", "v_proj"]
        gate_up = ["gate_up_proj"] if fused else ["gate_proj", "up_proj"]
        return LayerWeights(
            input_norm=weights[p + "input_layernorm.weight"],
            qkv=tuple(self._matrix(weights, f"{attn}{n}.weight") for n in qkv),
            qkv_bias=_optional(weights, [f"{attn}{n}.bias" for n in qkv]),
            o_proj=self._matrix(weights, attn + "o_proj.weight"),
            o_bias=weights.get(attn + "o_proj.bias"),
            q_norm=weights.get(attn + "q_norm.weight"),
            k_norm=weights.get(attn + "k_norm.weight"),
            post_attention_norm=weights[p + "post_attention_layernorm.weight"],
            gate_up=tuple(self._matrix(weights, f"{mlp}{n}.weight") for n in gate_up),
            gate_up_bias=_optional(weights, [f"{mlp}{n}.bias" for n in gate_up]),
            down_proj=self._matrix(weights, mlp + "down_proj.weight"),
            down_bias=weights.get(mlp + "down_proj.bias"),
            pre_feedforward_norm=weights.get(p + "pre_feedforward_layernorm.weight"),
            post_feedforward_norm=weights.get(p + "post_feedforward_layernorm.weight"),
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
        linear = biased_linear(
            kernels.linear if kernels is not None else torch_linear,
            fuse_bias=kernels is None or not kernels.batch_invariant,
        )
        linears = grouped_linear(linear, kernels)
        module = kernels.load() if kernels is not None else None
        ops = LayerOps(self.norm_fn, module)
        eps = cfg.rms_norm_eps
        h = embedding(
            self.embed_tokens,
            input_ids,
            self.dtype,
            module.gguf_dequantize if module is not None else None,
        )
        if cfg.scale_embeddings:
            h = scale_embeddings(h, cfg.hidden_size)
        cos, sin = self.rotary.tables(positions, self.dtype)
        num_tokens = input_ids.shape[0]
        fused = self._fused_decode_for(kernels)
        if fused is not None and fused.applies(num_tokens, meta, kv_caches):
            return fused(h, kv_caches, meta, cos, sin)
        # NOTE: a layer's MLP output is added to the residual stream by the next norm
        # (ops.add_norm: one native call for the add and the norm), so ``pending`` carries it.
        pending: torch.Tensor | None = None
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.layers, kv_caches, strict=True)):
            h, x = ops.add_norm(h, pending, layer.input_norm, eps)
            q, k, v = self._qkv(x, layer, linears, ops)
            q = ops.rotary(q, cos, sin)
            k = ops.rotary(k, cos, sin)
            write_kv(k_cache, v_cache, k, v, meta.slot_mapping)
            window = cfg.sliding_window if i in cfg.window_layers else None
            attn = paged_attention(
                q, k_cache, v_cache, meta, self.scale, kernels, cfg.attn_logit_softcapping, window
            )
            out = linear(attn.reshape(num_tokens, -1), layer.o_proj, layer.o_bias)
            h, pending = self._residual_mlp(h, out, layer, linear, linears, ops)
        return ops.add_norm(h, pending, self.norm, eps)[1]

    def _fused_decode_for(self, kernels: KernelLoader | None) -> FusedDecode | None:
        """The native whole-step decode (:mod:`~zerolayer.scheduler.model.decode_forward`) for
        this model, built on the first call with loaded kernels; None where it does not apply
        (the reason is logged once)."""
        if self._fused_decode_checked or kernels is None:
            return self._fused_decode
        self._fused_decode_checked = True
        module = kernels.load()
        if module is None:
            reason = f"no native kernels: {kernels.unavailable_reason}"
        elif kernels.batch_invariant:
            reason = "--batch-invariant"
        else:
            reason = unsupported_reason(
                self.config, self.layers, self.dtype, self.device, self.act, self.norm_fn
            )
        if reason is None and module is not None:
            self._fused_decode = FusedDecode(
                module, self.config, self.layers, self.norm, self.scale
            )
            log.info("decode steps of up to %d sequences run fused", self._fused_decode.max_rows)
        else:
            log.info("decode steps run layer by layer (%s)", reason)
        return self._fused_decode

    def _residual_mlp(
        self,
        h: torch.Tensor,
        attn_out: torch.Tensor,
        layer: LayerWeights,
        linear: Callable,
        linears: Callable,
        ops: LayerOps,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The rest of a layer after attention: the residual add of the attention output and
        the MLP, with Gemma 2's sandwich norms (post-attention, pre- and post-feed-forward).

        Returns:
            (h, pending): the residual stream and the MLP output still to be added to it (None
            when it was added here).
        """
        eps = self.config.rms_norm_eps
        if layer.pre_feedforward_norm is None or layer.post_feedforward_norm is None:
            h, x = ops.add_norm(h, attn_out, layer.post_attention_norm, eps)
            return h, self._mlp(x, layer, linear, linears)
        norm = ops.model_norm
        h = h + norm(attn_out, layer.post_attention_norm, eps)
        mlp_out = self._mlp(norm(h, layer.pre_feedforward_norm, eps), layer, linear, linears)
        return h + norm(mlp_out, layer.post_feedforward_norm, eps), None

    def _qkv(
        self, x: torch.Tensor, layer: LayerWeights, linears: Callable, ops: LayerOps
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q [T, H, D], k and v [T, Hkv, D]: projections (fused ones split after the matmul),
        biases, and Qwen3's per-head RMSNorm of q and k (before RoPE, as transformers)."""
        cfg = self.config
        outs = linears(x, layer.qkv, layer.qkv_bias)
        if len(outs) == 1:
            q_dim = cfg.num_attention_heads * cfg.head_dim
            outs = list(outs[0].split([q_dim, cfg.kv_dim, cfg.kv_dim], dim=-1))
        num_tokens = x.shape[0]
        q = outs[0].view(num_tokens, cfg.num_attention_heads, cfg.head_dim)
        k = outs[1].view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        if cfg.qk_rows_interleaved:
            q, k = rotate_half_layout(q), rotate_half_layout(k)
        v = outs[2].view(num_tokens, cfg.num_key_value_heads, cfg.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            q = ops.rms_norm(q, layer.q_norm, cfg.rms_norm_eps)
            k = ops.rms_norm(k, layer.k_norm, cfg.rms_norm_eps)
        return q, k, v

    def _mlp(
        self, x: torch.Tensor, layer: LayerWeights, linear: Callable, linears: Callable
    ) -> torch.Tensor:
        """The gated MLP: down(act(gate(x)) * up(x)); Phi-3's gate_up output is [gate | up]."""
        outs = linears(x, layer.gate_up, layer.gate_up_bias)
        gate, up = outs if len(outs) == 2 else outs[0].chunk(2, dim=-1)
        return linear(self.act(gate) * up, layer.down_proj, layer.down_bias)

    @torch.inference_mode()
    def compute_logits(
        self, hidden: torch.Tensor, kernels: KernelLoader | None = None
    ) -> torch.Tensor:
        """[B, hidden_size] hidden states -> float32 [B, vocab_size] logits.

        ``kernels``: the native GEMV for small batches (see :meth:`KernelLoader.linear`). Gemma 2's
        final soft-cap applies in the model dtype, then the cast, as transformers computes it.
        """
        linear = kernels.linear if kernels is not None else torch_linear
        logits = linear(hidden, self.lm_head)
        cap = self.config.final_logit_softcapping
        return (logits if cap is None else soft_cap(logits, cap)).float()
