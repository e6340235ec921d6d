"""The texts and bytes of logprob tokens (zerolayer.frontend.text.logprob_tokens): what each
token adds to the output in its place, joining to the detokenized text, on a byte-level (GPT-2
style) and a sentencepiece-like (byte fallback, ``▁``) vocabulary; and their bytes."""

from __future__ import annotations

import pytest
from frontend.text.test_detokenizer import (
    BOS,
    HELLO,
    WORLD,
    byte_ids,
    make_byte_tokenizer,
    make_sentencepiece_like,
)

from zerolayer.common.generation import PositionLogprobs, TokenLogprob
from zerolayer.frontend.text.detokenizer import IncrementalDetokenizer
from zerolayer.frontend.text.logprob_tokens import GeneratedTokenTexts, with_token_texts


def positions(ids: list[int], top: int = 0) -> list[PositionLogprobs]:
    """Logprob entries choosing ``ids``, each with ``top`` alternatives ``ids`` cycled."""
    return [
        PositionLogprobs(
            TokenLogprob(i, -1.0),
            1,
            tuple(TokenLogprob(ids[(k + j) % len(ids)], -2.0) for j in range(top)),
        )
        for k, i in enumerate(ids)
    ]


def test_byte_level_tokens_are_their_text_not_their_vocab_piece() -> None:
    tokenizer = make_byte_tokenizer()
    ids = byte_ids(" hi")
    named = GeneratedTokenTexts(tokenizer, [BOS]).named(positions(ids), final=True)
    assert [p.chosen.token for p in named] == ["Ġ", "h", "i"]
    assert [p.chosen.text for p in named] == [" ", "h", "i"]
    assert [p.chosen.token_bytes for p in named] == [b" ", b"h", b"i"]


@pytest.mark.parametrize("make", [make_byte_tokenizer, make_sentencepiece_like])
def test_a_character_split_over_tokens_comes_whole_with_its_last_token(make) -> None:
    tokenizer = make()
    ids = byte_ids("a€b") if make is make_byte_tokenizer else [HELLO, *byte_ids("€"), WORLD]
    texts = GeneratedTokenTexts(tokenizer, [BOS, HELLO])
    # Given in two pieces, as a stream gives them.
    named = [*texts.named(positions(ids[:2]), False), *texts.named(positions(ids[2:]), True)]
    detokenizer = IncrementalDetokenizer(tokenizer, [BOS, HELLO])
    output = detokenizer.step(ids) + detokenizer.flush()
    assert "".join(p.chosen.text for p in named) == output
    assert [p.chosen.text for p in named][1:4] == ["", "", "€"]
    joined = b"".join(p.chosen.token_bytes for p in named)
    assert joined.decode() == output


def test_an_alternative_is_the_text_it_would_have_added_in_the_chosen_ones_place() -> None:
    tokenizer = make_byte_tokenizer()
    euro = byte_ids("€")
    named = GeneratedTokenTexts(tokenizer, [BOS]).named(positions(euro, top=3), final=True)
    last = named[-1]
    assert last.chosen.text == "€" and last.top[0].text == "€"
    assert [t.text for t in named[0].top] == ["", "", ""]  # each ends inside a character


def test_an_incomplete_last_character_comes_as_the_output_does() -> None:
    tokenizer = make_byte_tokenizer()
    named = GeneratedTokenTexts(tokenizer, [BOS]).named(positions(byte_ids("€")[:2]), True)
    assert [p.chosen.text for p in named] == ["", "\ufffd"]


def test_prompt_tokens_are_named_out_of_context() -> None:
    tokenizer = make_sentencepiece_like()
    (named,) = with_token_texts(positions([HELLO]), tokenizer)
    assert (named.chosen.token, named.chosen.text, named.chosen.token_bytes) == (
        "▁Hello",
        " Hello",
        b" Hello",
    )
