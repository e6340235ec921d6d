"""Token texts of the logprobs the scheduler returns (ids only): each id's vocab piece."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from zerolayer.common.generation import PositionLogprobs, TokenLogprob
from zerolayer.frontend.text.tokenizer import TextTokenizer


def with_token_texts(
    entries: Sequence[PositionLogprobs], tokenizer: TextTokenizer
) -> tuple[PositionLogprobs, ...]:
    """``entries`` with ``token`` set on the chosen and top tokens: the id's vocab piece
    (:meth:`TextTokenizer.pieces`, e.g. ``"▁the"``); "" for an id the tokenizer does not know
    (a model's vocabulary can be padded past the tokenizer's)."""

    def named(t: TokenLogprob) -> TokenLogprob:
        try:
            piece = tokenizer.pieces([t.token_id])[0]
        except ValueError:
            piece = ""
        return replace(t, token=piece)

    return tuple(
        replace(e, chosen=named(e.chosen), top=tuple(named(t) for t in e.top)) for e in entries
    )
