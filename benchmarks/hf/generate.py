"""The baseline: Hugging Face transformers ``generate`` in this process, on the same checkpoint.

The model is loaded in the dtype it is stored in (as zerolayer computes), greedy, with EOS off so
that every request yields exactly ``max_new_tokens`` tokens like zerolayer's ``ignore_eos``.
transformers is imported when a function runs, not when the bench command line is built.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from zerolayer.bench.streams import TokenTimes

PAD_TOKEN_ID = 0
"""Left padding of batched prompts (masked out by the attention mask)."""


def load_hf(model_dir: Path, device: str = "cpu") -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained`` in the checkpoint's dtype on ``device``, eval
    mode, EOS off."""
    import transformers

    dtype = json.loads((model_dir / "config.json").read_text()).get("torch_dtype", "float32")
    model = transformers.AutoModelForCausalLM.from_pretrained(
        model_dir, dtype=getattr(torch, dtype)
    )
    model.to(device)
    model.eval()
    # NOTE: no EOS, so generation never stops early (zerolayer's ignore_eos keeps even an EOS
    # argmax; transformers' min_new_tokens would instead suppress EOS and change the tokens).
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = PAD_TOKEN_ID
    return model


def _token_clock() -> object:
    """A ``generate`` streamer that records when each new token is produced."""
    from transformers.generation.streamers import BaseStreamer

    class TokenClock(BaseStreamer):
        def __init__(self) -> None:
            self.arrivals: list[float] = []
            self._prompt_seen = False

        def put(self, value: torch.Tensor) -> None:
            now = time.perf_counter()
            if not self._prompt_seen:  # generate pushes the prompt first
                self._prompt_seen = True
                return
            self.arrivals.extend([now] * value.numel())

        def end(self) -> None:
            pass

    return TokenClock()


@torch.inference_mode()
def hf_token_times(
    model: torch.nn.Module, prompt: Sequence[int], max_new_tokens: int
) -> TokenTimes:
    """Batch-1 ``generate`` of one prompt, timing each token (TTFT, ITL) with a streamer.

    Raises:
        RuntimeError: fewer than ``max_new_tokens`` tokens came out.
    """
    clock = _token_clock()
    input_ids = torch.tensor([list(prompt)], device=model.device)
    send = time.perf_counter()
    model.generate(
        input_ids,
        attention_mask=torch.ones_like(input_ids),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        streamer=clock,
    )
    arrivals = tuple(clock.arrivals)  # type: ignore[attr-defined]
    if len(arrivals) != max_new_tokens:
        raise RuntimeError(f"transformers generated {len(arrivals)} of {max_new_tokens} tokens")
    return TokenTimes(send, arrivals)


@torch.inference_mode()
def hf_generate_batch(
    model: torch.nn.Module, prompts: Sequence[Sequence[int]], max_new_tokens: int
) -> float:
    """One left-padded static-batch ``generate`` of all ``prompts``; returns its seconds.

    Raises:
        RuntimeError: the output is not ``max_new_tokens`` longer than the padded prompts.
    """
    width = max(len(p) for p in prompts)
    device = model.device
    input_ids = torch.tensor(
        [[PAD_TOKEN_ID] * (width - len(p)) + list(p) for p in prompts], device=device
    )
    attention_mask = torch.tensor(
        [[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device
    )
    _synchronize(device)
    start = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
    )
    _synchronize(device)
    seconds = time.perf_counter() - start
    if out.shape[1] != width + max_new_tokens:
        raise RuntimeError(f"transformers generated {out.shape[1] - width} of {max_new_tokens}")
    return seconds


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
