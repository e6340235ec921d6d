"""llama.cpp in this process, through llama-cpp-python's bindings of its C API.

Prompts go in as token ids (never text), several sequences share each ``llama_decode`` call (as
llama.cpp's ``llama-batched-bench`` runs them), and the next token of each sequence is the argmax
of its logits: greedy, no EOS, so every sequence yields exactly ``max_new_tokens`` tokens.
``llama_cpp`` (the ``llama-cpp-python`` package of the ``bench`` extra) is imported when a model is
opened, not when the bench command line is built.

Source: llama.h (``llama_batch``, ``llama_decode``, ``llama_get_logits``) of the llama.cpp that
llama-cpp-python vendors.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from zerolayer.bench.streams import TokenTimes

CONTEXT_ALIGN = 256
"""Each sequence's context is rounded up to a multiple of this many tokens."""


@dataclass(frozen=True)
class LlamaCppConfig:
    """How a GGUF model is opened."""

    num_threads: int
    """llama.cpp threads for both prompt and generation batches."""
    max_num_seqs: int
    """Sequences one run may hold at once."""
    max_seq_tokens: int
    """Prompt plus generated tokens of one sequence, at most."""
    max_batch_tokens: int = 2048
    """Tokens one ``llama_decode`` call takes (llama.cpp's ``n_batch``, its default)."""
    extra_buffer_types: bool = True
    """Weights may be repacked into the CPU backend's extra buffer types (AMX, interleaved
    blocks), llama.cpp's default; False is llama-server's ``--no-repack``."""


@dataclass(frozen=True)
class GreedyRun:
    """What one :meth:`LlamaCppModel.greedy` call produced."""

    token_times: list[TokenTimes]
    """Per sequence: when the run started and when each generated token was chosen."""
    token_ids: list[list[int]]
    """Per sequence: the generated ids."""
    first_seq_logits: np.ndarray | None
    """float32 ``[max_new_tokens, vocab]``: the logits each of the first sequence's tokens was
    chosen from (when asked for)."""


class LlamaCppModel:
    """One GGUF model and one llama.cpp context, freed by :meth:`close` (or ``with``)."""

    def __init__(self, gguf_path: Path, config: LlamaCppConfig) -> None:
        """Loads the model (mapped) and makes a context for ``config``.

        Raises:
            ImportError: llama-cpp-python is not installed.
            RuntimeError: llama.cpp could not load the model or make the context.
        """
        import llama_cpp

        self._ll = llama_cpp
        self.config = config
        # NOTE: llama.cpp logs every load to stderr; the callback must outlive the model.
        self._log = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(self._log, ctypes.c_void_p(0))
        llama_cpp.llama_backend_init()
        model_params = llama_cpp.llama_model_default_params()
        model_params.use_extra_bufts = config.extra_buffer_types
        self._model = llama_cpp.llama_model_load_from_file(str(gguf_path).encode(), model_params)
        if not self._model:
            raise RuntimeError(f"llama.cpp could not load {gguf_path}")
        params = llama_cpp.llama_context_default_params()
        per_seq = -(-config.max_seq_tokens // CONTEXT_ALIGN) * CONTEXT_ALIGN
        params.n_ctx = per_seq * config.max_num_seqs
        params.n_seq_max = config.max_num_seqs
        params.n_batch = config.max_batch_tokens
        params.n_threads = params.n_threads_batch = config.num_threads
        self._ctx = llama_cpp.llama_init_from_model(self._model, params)
        if not self._ctx:
            raise RuntimeError("llama.cpp could not make a context")
        vocab = llama_cpp.llama_model_get_vocab(self._model)
        self.vocab_size = llama_cpp.llama_vocab_n_tokens(vocab)
        self._batch = llama_cpp.llama_batch_init(
            max(config.max_batch_tokens, config.max_num_seqs), 0, 1
        )

    def __enter__(self) -> LlamaCppModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Frees the batch, the context and the model (idempotent)."""
        if self._ctx:
            self._ll.llama_batch_free(self._batch)
            self._ll.llama_free(self._ctx)
            self._ll.llama_model_free(self._model)
            self._ctx = self._model = None

    def _decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> np.ndarray:
        """One ``llama_decode`` of (token id, position, sequence, wants logits) entries; returns
        the logits of the entries that asked for them, in order, as float32 ``[n, vocab]``.

        Raises:
            RuntimeError: llama_decode failed (no KV slot, or an error).
        """
        b = self._batch
        for i, (token_id, pos, seq, logits) in enumerate(entries):
            b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = token_id, pos, 1, logits
            b.seq_id[i][0] = seq
        b.n_tokens = len(entries)
        rc = self._ll.llama_decode(self._ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")
        num_out = sum(1 for e in entries if e[3])
        pointer = self._ll.llama_get_logits(self._ctx)
        return np.ctypeslib.as_array(pointer, shape=(num_out, self.vocab_size))

    def prompt_logits(self, prompt: Sequence[int]) -> np.ndarray:
        """float32 ``[len(prompt), vocab]``: the logits at every position of ``prompt`` (row i
        predicts token i + 1), from an empty KV cache, in batches of ``max_batch_tokens``.

        Raises:
            ValueError: a prompt longer than ``max_seq_tokens``.
            RuntimeError: see :meth:`_decode`.
        """
        if len(prompt) > self.config.max_seq_tokens:
            raise ValueError("a longer prompt than the context was made for")
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self._ctx), True)
        entries = [(t, pos, 0, True) for pos, t in enumerate(prompt)]
        step = self.config.max_batch_tokens
        return np.concatenate(
            [self._decode(entries[i : i + step]).copy() for i in range(0, len(entries), step)]
        )

    def greedy(
        self, prompts: Sequence[Sequence[int]], max_new_tokens: int, keep_logits: bool = False
    ) -> GreedyRun:
        """Generates ``max_new_tokens`` greedy tokens for every prompt at once, from an empty KV
        cache: the prompts are prefilled together in batches of ``max_batch_tokens`` tokens,
        then every step decodes one token of each sequence in one call.

        Raises:
            ValueError: more prompts than ``max_num_seqs`` or a sequence longer than
                ``max_seq_tokens``.
            RuntimeError: see :meth:`_decode`.
        """
        cfg = self.config
        if len(prompts) > cfg.max_num_seqs or any(
            len(p) + max_new_tokens > cfg.max_seq_tokens for p in prompts
        ):
            raise ValueError("more sequences or tokens than the context was made for")
        self._ll.llama_memory_clear(self._ll.llama_get_memory(self._ctx), True)
        kept: list[np.ndarray] = []
        arrivals: list[list[float]] = [[] for _ in prompts]
        ids: list[list[int]] = [[] for _ in prompts]

        def choose(seqs: Sequence[int], logits: np.ndarray) -> None:
            picks = logits.argmax(axis=1)
            now = time.perf_counter()
            for seq, token_id in zip(seqs, picks.tolist(), strict=True):
                ids[seq].append(token_id)
                arrivals[seq].append(now)
            if keep_logits and seqs and seqs[0] == 0:
                kept.append(logits[0].copy())

        start = time.perf_counter()
        prefill = [
            (t, pos, seq, pos == len(p) - 1)
            for seq, p in enumerate(prompts)
            for pos, t in enumerate(p)
        ]
        for i in range(0, len(prefill), cfg.max_batch_tokens):
            chunk = prefill[i : i + cfg.max_batch_tokens]
            logits = self._decode(chunk)
            choose([seq for _, _, seq, last in chunk if last], logits)
        for step in range(1, max_new_tokens):
            seqs = range(len(prompts))
            logits = self._decode([(ids[s][-1], len(prompts[s]) + step - 1, s, True) for s in seqs])
            choose(list(seqs), logits)
        return GreedyRun(
            [TokenTimes(start, tuple(a)) for a in arrivals],
            ids,
            np.stack(kept) if keep_logits else None,
        )
