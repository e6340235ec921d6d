"""The systems the llama.cpp comparison measures, behind one interface.

Each system takes the same prompts (token ids) and answers three measurements: batch-1 decode
tok/s, the time to the first token of one prompt, and the output tok/s of a batch of prompts
sent at once including their prefill. zerolayer is measured through its four services (gRPC
streams), llama.cpp in this process (:mod:`benchmarks.llamacpp.engine`), transformers in
this process (:mod:`benchmarks.hf.generate`).
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from zerolayer.bench.common import stub_for
from zerolayer.bench.streams import (
    TokenTimes,
    decode_tok_s,
    generate_request,
    run_streams,
    stream_token_times,
)


def batch_output_tok_s(runs: Sequence[TokenTimes]) -> float:
    """Generated tokens of requests sent together, per second from the first send to the last
    token (prefill included)."""
    span = max(r.arrivals_s[-1] for r in runs) - min(r.send_s for r in runs)
    return sum(len(r.arrivals_s) for r in runs) / span


class System(Protocol):
    """One side of the comparison."""

    name: str

    def decode_tok_s(self, prompt: Sequence[int], max_new_tokens: int) -> float:
        """Batch-1 decode rate (:func:`zerolayer.bench.streams.decode_tok_s`)."""

    def ttft_s(self, prompt: Sequence[int]) -> float:
        """Seconds from sending ``prompt`` alone to its first token."""

    def batch_output_tok_s(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> float:
        """:func:`batch_output_tok_s` of every prompt sent at once."""


@dataclass(frozen=True)
class ZerolayerVariant:
    """A zerolayer configuration to compare (the list grows: an int8 checkpoint, ...)."""

    name: str
    checkpoint: Callable[[Path, Path], Path] = lambda model_dir, out_dir: model_dir
    """(the benchmark's checkpoint, the results directory) -> the checkpoint this variant
    serves (a converted copy may be written under the results directory)."""
    stack_overrides: dict[str, object] = field(default_factory=dict)
    """StackConfig fields that differ from ``zerolayer up``'s defaults."""


def int8_checkpoint(model_dir: Path, out_dir: Path) -> Path:
    """``zerolayer quantize`` of the checkpoint (groups of 32, as llama.cpp's Q8_0) under
    ``out_dir``."""
    from zerolayer.bench.int8 import quantized_copy

    return quantized_copy(model_dir, out_dir, 32)


ZEROLAYER_VARIANTS = (
    ZerolayerVariant("zerolayer"),
    ZerolayerVariant("zerolayer int8", int8_checkpoint),
)
"""Every zerolayer variant ``--zerolayer-variants`` may name; the default measures all."""


@dataclass
class ZerolayerSystem:
    """A running stack, through its frontend at ``address``."""

    name: str
    address: str

    def decode_tok_s(self, prompt: Sequence[int], max_new_tokens: int) -> float:
        return decode_tok_s(
            run_streams(self.address, [generate_request(prompt, max_new_tokens)], [0.0])
        )

    def ttft_s(self, prompt: Sequence[int]) -> float:
        return stream_token_times(stub_for(self.address), generate_request(prompt, 1)).ttft_s

    def batch_output_tok_s(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> float:
        requests = [generate_request(p, max_new_tokens) for p in prompts]
        return batch_output_tok_s(run_streams(self.address, requests, [0.0] * len(prompts)))


@dataclass
class LlamaCppSystem:
    """A GGUF model in this process: one context for single prompts, one for batches."""

    name: str
    single: object
    """:class:`benchmarks.llamacpp.engine.LlamaCppModel` of one sequence."""
    batched: object
    """The same model with a context of ``max_num_seqs`` sequences."""

    def decode_tok_s(self, prompt: Sequence[int], max_new_tokens: int) -> float:
        return decode_tok_s(self.single.greedy([prompt], max_new_tokens).token_times)

    def ttft_s(self, prompt: Sequence[int]) -> float:
        return self.single.greedy([prompt], 1).token_times[0].ttft_s

    def batch_output_tok_s(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> float:
        return batch_output_tok_s(self.batched.greedy(prompts, max_new_tokens).token_times)

    def close(self) -> None:
        self.single.close()
        self.batched.close()


@dataclass
class HfSystem:
    """transformers ``generate`` in this process, in the checkpoint's dtype."""

    name: str
    model: object

    def decode_tok_s(self, prompt: Sequence[int], max_new_tokens: int) -> float:
        from benchmarks.hf.generate import hf_token_times

        return decode_tok_s([hf_token_times(self.model, prompt, max_new_tokens)])

    def ttft_s(self, prompt: Sequence[int]) -> float:
        from benchmarks.hf.generate import hf_token_times

        return hf_token_times(self.model, prompt, 1).ttft_s

    def batch_output_tok_s(self, prompts: Sequence[Sequence[int]], max_new_tokens: int) -> float:
        from benchmarks.hf.generate import hf_generate_batch

        return (
            len(prompts) * max_new_tokens / hf_generate_batch(self.model, prompts, max_new_tokens)
        )

    def close(self) -> None:
        self.model = None
        gc.collect()
