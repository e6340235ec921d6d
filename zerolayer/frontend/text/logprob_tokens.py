"""Token texts of the logprobs the scheduler returns (ids only): each id's vocab piece, the text
it stands for and its bytes."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from zerolayer.common.generation import PositionLogprobs, TokenLogprob
from zerolayer.frontend.text.detokenizer import IncrementalDetokenizer
from zerolayer.frontend.text.tokenizer import TextTokenizer


class GeneratedTokenTexts:
    """Names the logprobs of one sample's generated tokens, in order, each in its place.

    ``token`` is the id's vocab piece (``"Ġthe"``); ``text`` is what the token adds to the
    output there, decoded with the tokens before it as the output's text is
    (:class:`IncrementalDetokenizer`): the chosen tokens' texts join to the detokenized output
    (before stop strings cut it), a token that ends inside a character has "" and the one that
    completes it the whole character, a special token "". An alternative's ``text`` is what it
    would have added in the chosen token's place. ``token_bytes`` is the token's own bytes
    (:meth:`TextTokenizer.token_bytes`): the chosen tokens' bytes join to the output's UTF-8.
    """

    def __init__(self, tokenizer: TextTokenizer, prompt_token_ids: Sequence[int]) -> None:
        self._tokenizer = tokenizer
        self._detokenizer = IncrementalDetokenizer(tokenizer, prompt_token_ids)

    def named(
        self, entries: Sequence[PositionLogprobs], final: bool
    ) -> tuple[PositionLogprobs, ...]:
        """``entries`` (the next positions of the sample) with their tokens named; ``final``:
        the sample ends with them (an incomplete last character comes as U+FFFD, as in the
        output)."""
        out = []
        for e in entries:
            top = tuple(self._name(t, self._detokenizer.peek(t.token_id)) for t in e.top)
            chosen = self._name(e.chosen, self._detokenizer.step([e.chosen.token_id]))
            out.append(replace(e, chosen=chosen, top=top))
        if final and out and (tail := self._detokenizer.flush()):
            last = out[-1]
            out[-1] = replace(last, chosen=replace(last.chosen, text=last.chosen.text + tail))
        return tuple(out)

    def _name(self, t: TokenLogprob, text: str) -> TokenLogprob:
        return replace(
            t,
            token=_piece(self._tokenizer, t),
            text=text,
            token_bytes=self._tokenizer.token_bytes(t.token_id),
        )


def with_token_texts(
    entries: Sequence[PositionLogprobs], tokenizer: TextTokenizer
) -> tuple[PositionLogprobs, ...]:
    """``entries`` (of prompt positions) with their tokens named out of context: ``token`` the
    id's vocab piece (:meth:`TextTokenizer.pieces`, e.g. ``"▁the"``; "" for an id the tokenizer
    does not know: a model's vocabulary can be padded past the tokenizer's), ``token_bytes``
    its bytes and ``text`` those decoded (an incomplete character as U+FFFD)."""

    def named(t: TokenLogprob) -> TokenLogprob:
        data = tokenizer.token_bytes(t.token_id)
        text = data.decode("utf-8", errors="replace") if data else ""
        return replace(t, token=_piece(tokenizer, t), text=text, token_bytes=data)

    return tuple(
        replace(e, chosen=named(e.chosen), top=tuple(named(t) for t in e.top)) for e in entries
    )


def _piece(tokenizer: TextTokenizer, t: TokenLogprob) -> str:
    try:
        return tokenizer.pieces([t.token_id])[0]
    except ValueError:
        return ""
