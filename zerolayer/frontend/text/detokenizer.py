"""Incremental detokenization of generated token ids into text pieces for streaming."""

from __future__ import annotations

from collections.abc import Sequence

from zerolayer.frontend.text.tokenizer import REPLACEMENT_CHAR, TextTokenizer

NUM_PREFIX_CONTEXT_TOKENS = 5
"""How many trailing prompt tokens are decoded as left context for the first generated tokens."""


class IncrementalDetokenizer:
    """Turns a growing list of generated token ids into text pieces without ever emitting a
    broken UTF-8 sequence.

    Method (prefix_offset/read_offset), as in text-generation-inference
    (``server/text_generation_server/models/model.py``, ``Model.decode_token``) and vLLM
    (``vllm/transformers_utils/detokenizer_utils.py``, ``detokenize_incrementally``):
    ``ids[prefix_offset:read_offset]`` is text already emitted, kept as left context so that
    decoders which strip a leading space (sentencepiece/Llama ``Strip``) or depend on neighbours
    decode the new tokens with the right spacing. Each step decodes ``ids[prefix_offset:]`` and
    emits what it adds past ``decode(ids[prefix_offset:read_offset])``; while the decoded text ends
    with U+FFFD (the last character's bytes are incomplete) nothing is emitted and the offsets
    stay, so the tokens are decoded again with the next ones.

    Decoding skips special tokens, so after a BOS-only prompt the first word has no leading space
    (the decoder strips it, as ``tokenizer.decode(generated_ids)`` would).

    The text, for any generated ids (special tokens, ids past the vocab, invalid UTF-8 bytes):
    the concatenation of all pieces, :meth:`flush` included, is
    ``decode(context + ids)[len(decode(context)):]`` where ``context`` is the last
    :data:`NUM_PREFIX_CONTEXT_TOKENS` prompt tokens and ``decode`` is
    :meth:`TextTokenizer.decode` (one U+FFFD per maximal invalid byte subpart); after a
    BOS-only or empty prompt that is ``decode(ids)``. This holds because that decode never
    changes text it decoded before except a trailing U+FFFD (an incomplete character), which is
    held here.

    Edge cases: a generated text that really contains U+FFFD at the end of a step is held until
    the next non-U+FFFD character or :meth:`flush`. A prompt whose last tokens end inside a UTF-8
    character (only possible for prompts given as ids) is treated as prompt text: the completed
    character is not emitted.
    """

    def __init__(
        self,
        tokenizer: TextTokenizer,
        prompt_token_ids: Sequence[int],
        keep_special_ids: frozenset[int] = frozenset(),
    ) -> None:
        """Start after ``prompt_token_ids`` (may be empty); does not modify either argument.

        ``keep_special_ids``: special tokens whose text is output (see
        :meth:`TextTokenizer.decode`); the others are dropped.
        """
        self._tokenizer = tokenizer
        self._keep_special_ids = keep_special_ids
        self._token_ids = list(prompt_token_ids[-NUM_PREFIX_CONTEXT_TOKENS:])
        self._read_offset = len(self._token_ids)
        self._prefix_offset = 0
        self._pieces: list[str] = []

    def step(self, new_token_ids: Sequence[int]) -> str:
        """Append ``new_token_ids`` (any number, including 0) and return the text now complete.

        Returns "" while the decoded tail is an incomplete character (or the new tokens decode to
        nothing, e.g. skipped special tokens).

        Raises:
            ValueError: an id is not in the tokenizer's vocab (see :meth:`TextTokenizer.decode`).
        """
        self._token_ids.extend(new_token_ids)
        return self._emit(allow_incomplete=False)

    def peek(self, token_id: int) -> str:
        """What ``step([token_id])`` would return now, without appending it (the text a token
        the model did not choose would have added here)."""
        window = self._token_ids[self._prefix_offset :]
        prefix_text = self._tokenizer.decode(window[: self._read_offset - self._prefix_offset])
        full_text = self._tokenizer.decode([*window, token_id])
        if len(full_text) <= len(prefix_text) or full_text.endswith(REPLACEMENT_CHAR):
            return ""
        return full_text[len(prefix_text) :]

    def flush(self) -> str:
        """Return whatever is still held at the end: "" normally, U+FFFD for an incomplete tail."""
        return self._emit(allow_incomplete=True)

    @property
    def text(self) -> str:
        """All text emitted so far: the concatenation of every :meth:`step`/:meth:`flush` result."""
        return "".join(self._pieces)

    def _emit(self, allow_incomplete: bool) -> str:
        keep = self._keep_special_ids
        prefix_text = self._tokenizer.decode(
            self._token_ids[self._prefix_offset : self._read_offset], keep_special_ids=keep
        )
        full_text = self._tokenizer.decode(
            self._token_ids[self._prefix_offset :], keep_special_ids=keep
        )
        if len(full_text) <= len(prefix_text):
            return ""
        if full_text.endswith(REPLACEMENT_CHAR) and not allow_incomplete:
            return ""
        piece = full_text[len(prefix_text) :]
        # NOTE: only ids from prefix_offset on are ever decoded again; drop the rest so the list
        # (and the decode cost) stays bounded for long generations.
        del self._token_ids[: self._read_offset]
        self._prefix_offset = 0
        self._read_offset = len(self._token_ids)
        self._pieces.append(piece)
        return piece
