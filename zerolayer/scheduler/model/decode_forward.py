"""The whole decode step in one native call (``csrc/decode_forward.cpp``), where it applies.

A decode step of a small model at batch 1 is bound by reading the weights, but the Python forward
adds about twenty calls per layer and a parallel region (with a thread wake-up, since the
scheduler keeps libgomp's spin short) per GEMV. The native step runs all layers in one region
with a spinning barrier between phases. It covers the standard Llama layer in bfloat16 on the CPU
(no biases, no q/k norms, SiLU, RMSNorm, no sliding window or soft-capping, separate q/k/v and
gate/up projections; bfloat16 weights, the int8 ones of ``zerolayer quantize``, or a GGUF file's,
each matrix of its own type, q/k rows in llama.cpp's layout mapped back in the step):
:func:`unsupported_reason` says why another model keeps the Python forward, and
:meth:`FusedDecode.applies` which steps take it (decode only: one new token per sequence, at most
``max_skinny_rows`` sequences).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.scheduler.model.attention import AttentionMetadata
from zerolayer.scheduler.model.gguf.quant_weight import QuantWeight
from zerolayer.scheduler.model.int8_linear import Int8Weight
from zerolayer.scheduler.model.layer_ops import rms_norm
from zerolayer.scheduler.model.native.library import NativeKernels


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
        elif all(
            isinstance(w, QuantWeight)
            or (isinstance(w, torch.Tensor) and w.dtype == torch.bfloat16)
            for w in matrices
        ):
            weights = [w for w in matrices if isinstance(w, torch.Tensor)]
            tensors = [
                t for w in matrices for t in ([w] if isinstance(w, torch.Tensor) else w.tensors())
            ]
        else:
            return "weights neither all bfloat16 or GGUF nor all int8"
        if not all(t.is_contiguous() for t in tensors):
            return "non-contiguous weights"
        if any(w.shape[1] % 16 for w in weights):
            return "a projection's input size is not a multiple of 16"
    return None


@dataclass
class ThreadChoice:
    """How many threads a fused step runs with: all of torch's, or one.

    The threads of a fused step work in lockstep, so while another process holds a core (a busy
    neighbour on a small machine) each phase waits for the thread that is not running; one thread
    alone is then faster. Measured through the services on the `small` preset at batch 1: beside
    one busy process 1 thread gave 61.3 tok/s and 2 threads 44.3-49.1; quiet, 49.9 and 90-108.
    So the choice follows measured step times: a moving average per count (weight ``alpha`` for
    the newest step), the faster count used, the other tried once every ``explore_every`` steps.
    """

    all_threads: int
    """torch's thread count (the scheduler's ``--num-threads``)."""
    explore_every: int = 128
    alpha: float = 0.25
    mean_s: dict[int, float] = field(default_factory=dict)
    """Moving average of the step time in seconds, per thread count."""
    steps: int = 0

    def next(self) -> int:
        """The thread count of the next step (>= 1)."""
        if self.all_threads <= 1:
            return 1
        counts = (self.all_threads, 1)
        for count in counts:
            if count not in self.mean_s:
                return count
        self.steps += 1
        best = min(counts, key=self.mean_s.__getitem__)
        if self.steps % self.explore_every == 0:
            return 1 if best == self.all_threads else self.all_threads
        return best

    def record(self, count: int, seconds: float) -> None:
        """A step with ``count`` threads took ``seconds``."""
        old = self.mean_s.get(count)
        self.mean_s[count] = seconds if old is None else old + self.alpha * (seconds - old)


class FusedDecode:
    """The native decode step over one model's weights (held by reference, not copied)."""

    def __init__(
        self,
        native: NativeKernels,
        config: ModelConfig,
        layers: list,
        final_norm: torch.Tensor,
        scale: float,
        qk_rows_interleaved: bool | None = None,
    ) -> None:
        """
        Args:
            native: the loaded kernels (``KernelLoader.load()``).
            config, layers, final_norm: the model's, checked by :func:`unsupported_reason`.
            scale: the attention's score scale.
            qk_rows_interleaved: q/k rows in llama.cpp's layout; None: the config's
                ``qk_rows_interleaved``.

        Raises:
            RuntimeError: a weight of an unexpected shape or dtype (the kernel's check).
        """
        self.max_rows = native.max_skinny_rows
        self.threads: dict[int, ThreadChoice] = {}
        """The thread choice per number of sequences in a step."""
        matrices = [(*x.qkv, x.o_proj, *x.gate_up, x.down_proj) for x in layers]
        int8 = isinstance(matrices[0][0], Int8Weight)
        if qk_rows_interleaved is None:
            qk_rows_interleaved = config.qk_rows_interleaved
        self._step = native.decode_forward(
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
            qk_rows_interleaved,
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
        all_threads = torch.get_num_threads()
        choice = self.threads.get(h.shape[0])
        if choice is None or choice.all_threads != all_threads:
            choice = self.threads[h.shape[0]] = ThreadChoice(all_threads)
        count = choice.next()
        start = time.perf_counter()
        hidden = self._step.forward(
            h,
            [k for k, _ in caches],
            [v for _, v in caches],
            meta.slot_mapping,
            meta.block_tables,
            meta.seq_lens,
            cos,
            sin,
            count,
        )
        choice.record(count, time.perf_counter() - start)
        return hidden
