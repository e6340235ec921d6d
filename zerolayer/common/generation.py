"""Domain types of the generation API shared by the frontend and the scheduler."""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass

GREEDY_TEMPERATURE_EPS = 1e-5
"""Temperatures below this are treated as greedy."""


class FinishReason(enum.IntEnum):
    """Why a sequence stopped (mirrors zerolayer.v1.FinishReason)."""

    UNSPECIFIED = 0
    LENGTH = 1
    EOS = 2
    STOP = 3
    ABORT = 4


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the logits."""

    temperature: float = 0.0
    """0 (or below 1e-5, where dividing by it would overflow): greedy (argmax); otherwise logits
    are divided by it before softmax."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1] (Holtzman et al. 2019, arXiv:1904.09751); 1: off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0: off."""
    seed: int | None = None
    """Seed of the request's own generator; None: random."""

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax."""
        return self.temperature < GREEDY_TEMPERATURE_EPS


@dataclass(frozen=True)
class EngineRequest:
    """A tokenized request as the scheduler receives it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    ignore_eos: bool = False
    cache_salt: str = ""


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_cached_tokens: int

    @property
    def finished(self) -> bool:
        """True on the request's last output."""
        return self.finish_reason != FinishReason.UNSPECIFIED


@dataclass(frozen=True)
class GenerateParams:
    """A public Generate request as received, before validation (None: the field was unset)."""

    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    max_new_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    cache_salt: str = ""
    request_id: str = ""
    model: str = ""


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int


@dataclass(frozen=True)
class GenerationChunk:
    """One piece of a generation as the public API returns it."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason = FinishReason.UNSPECIFIED
    usage: Usage | None = None


def join_chunks(chunks: Sequence[GenerationChunk]) -> GenerationChunk:
    """A whole generation from its chunks, in order: the text and token ids concatenated, the
    request id and finish reason of the last chunk, the last usage given (an empty chunk for no
    chunks)."""
    usages = [c.usage for c in chunks if c.usage is not None]
    return GenerationChunk(
        request_id=chunks[-1].request_id if chunks else "",
        text="".join(c.text for c in chunks),
        token_ids=tuple(t for c in chunks for t in c.token_ids),
        finish_reason=chunks[-1].finish_reason if chunks else FinishReason.UNSPECIFIED,
        usage=usages[-1] if usages else None,
    )


@dataclass(frozen=True)
class TokenizeParams:
    """A public Tokenize request."""

    text: str
    add_special_tokens: bool = False
    """Add the BOS (and whatever else) the tokenizer config asks for."""
    model: str = ""
    """Empty: the served model."""


@dataclass(frozen=True)
class TokenizeResult:
    """Token ids of a text and the vocab piece of each."""

    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class ModelInfo:
    """The served model as ``GetModelInfo`` describes it."""

    model: str
    architecture: str
    vocab_size: int
    max_model_len: int
    """Context length in tokens."""
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    dtype: str
    """Torch name of the compute dtype, e.g. "bfloat16"."""
    num_parameters: int
    block_size: int
    """Tokens per KV block; 0 while the scheduler is unreachable."""
    fingerprint: str
