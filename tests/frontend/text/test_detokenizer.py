"""Tests for IncrementalDetokenizer: split UTF-8 characters, leading-space decoders, chunking."""

from __future__ import annotations

from pathlib import Path

import pytest
from factories import sentencepiece_like_tokenizer_json
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer

from zerolayer.checkpoints.byte_tokenizer import build_byte_level_tokenizer
from zerolayer.checkpoints.llama2c import build_tokenizer, read_tokenizer
from zerolayer.common.generation import FinishReason, RequestOutput, Usage
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.text.detokenizer import IncrementalDetokenizer
from zerolayer.frontend.text.stop_strings import StopStringMatcher
from zerolayer.frontend.text.tokenizer import TextTokenizer

BOS = 1
EOS = 2
WORDS = ["▁Hello", "▁world", "▁Hi", "!", "▁"]
HELLO, WORLD, HI, BANG, SPACE = 259, 260, 261, 262, 263
SPECIAL_STRINGS = ("<unk>", "<s>", "</s>")


def make_byte_tokenizer() -> TextTokenizer:
    return TextTokenizer.from_json(build_byte_level_tokenizer().to_str(), '{"bos_token": "<s>"}')


def make_sentencepiece_like() -> TextTokenizer:
    """Llama-like: byte-fallback tokens <0xNN> at 3 + NN, WORDS from 259, strips one space."""
    return TextTokenizer.from_json(
        tokenizer_json_of_sentencepiece_like(), '{"add_bos_token": true, "bos_token": "<s>"}'
    )


def tokenizer_json_of_sentencepiece_like() -> str:
    """The tokenizer.json of :func:`make_sentencepiece_like`."""
    return sentencepiece_like_tokenizer_json(WORDS)


def byte_ids(text: str) -> list[int]:
    return [byte + 3 for byte in text.encode("utf-8")]


def run_steps(detokenizer: IncrementalDetokenizer, chunks: list[list[int]]) -> list[str]:
    return [detokenizer.step(chunk) for chunk in chunks]


@pytest.mark.parametrize(
    ("char", "expected_pieces"),
    [
        ("é", ["", "é"]),
        ("日", ["", "", "日"]),
        ("😀", ["", "", "", "😀"]),
    ],
)
def test_multi_byte_character_is_held_until_complete(char: str, expected_pieces: list[str]) -> None:
    detokenizer = IncrementalDetokenizer(make_byte_tokenizer(), [BOS])
    assert run_steps(detokenizer, [[token_id] for token_id in byte_ids(char)]) == expected_pieces
    assert detokenizer.flush() == ""
    assert detokenizer.text == char


def test_text_in_the_same_step_as_a_split_character_is_held_with_it() -> None:
    detokenizer = IncrementalDetokenizer(make_byte_tokenizer(), byte_ids("ab"))
    e_bytes = byte_ids("é")
    assert detokenizer.step([byte_ids("x")[0], e_bytes[0]]) == ""
    assert detokenizer.step([e_bytes[1], *byte_ids("y")]) == "xéy"
    assert detokenizer.text == "xéy"


def test_prompt_bytes_are_never_emitted() -> None:
    tokenizer = make_byte_tokenizer()
    detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode("日本語 prompt", True))
    assert run_steps(detokenizer, [byte_ids("!"), byte_ids("語")]) == ["!", "語"]


def test_flush_returns_replacement_char_for_incomplete_tail() -> None:
    detokenizer = IncrementalDetokenizer(make_byte_tokenizer(), [BOS])
    assert detokenizer.step(byte_ids("a")) == "a"
    assert detokenizer.step(byte_ids("b") + byte_ids("日")[:2]) == ""
    assert detokenizer.flush() == "b\ufffd"
    assert detokenizer.text == "ab\ufffd"


def test_eos_and_empty_steps_emit_nothing() -> None:
    detokenizer = IncrementalDetokenizer(make_byte_tokenizer(), [BOS])
    assert run_steps(detokenizer, [byte_ids("hi"), [], [EOS]]) == ["hi", "", ""]
    assert detokenizer.flush() == ""
    assert detokenizer.text == "hi"


def test_leading_space_stripped_after_bos_only_prompt() -> None:
    detokenizer = IncrementalDetokenizer(make_sentencepiece_like(), [BOS])
    assert run_steps(detokenizer, [[HELLO], [WORLD], [BANG]]) == ["Hello", " world", "!"]
    assert detokenizer.text == "Hello world!"


def test_leading_space_stripped_after_empty_prompt() -> None:
    detokenizer = IncrementalDetokenizer(make_sentencepiece_like(), [])
    assert run_steps(detokenizer, [[HELLO], [WORLD]]) == ["Hello", " world"]


def test_leading_space_kept_after_word_prompt() -> None:
    detokenizer = IncrementalDetokenizer(make_sentencepiece_like(), [BOS, HI])
    assert run_steps(detokenizer, [[WORLD], [BANG], [HELLO]]) == [" world", "!", " Hello"]


def test_leading_space_kept_after_long_prompt() -> None:
    prompt = [BOS, HI, HELLO, WORLD, BANG, HI, HELLO, WORLD]
    detokenizer = IncrementalDetokenizer(make_sentencepiece_like(), prompt)
    assert run_steps(detokenizer, [[HELLO], [BANG]]) == [" Hello", "!"]


def test_byte_fallback_character_after_space_token() -> None:
    detokenizer = IncrementalDetokenizer(make_sentencepiece_like(), [BOS, HI])
    pieces = run_steps(detokenizer, [[SPACE], *[[token_id] for token_id in byte_ids("日")]])
    assert pieces == [" ", "", "", "日"]
    assert detokenizer.text == " 日"


def test_id_past_the_tokenizer_vocab_decodes_to_nothing() -> None:
    # A model's vocab may be padded past the tokenizer's; such ids have no text.
    detokenizer = IncrementalDetokenizer(make_byte_tokenizer(), [BOS])
    assert detokenizer.step([999]) == ""
    assert detokenizer.step([107]) == "h"
    assert detokenizer.text == "h"


@st.composite
def chunked(draw: st.DrawFn, token_ids: list[int]) -> list[list[int]]:
    """Split ``token_ids`` into consecutive chunks of random sizes (0 to 5; never two empty ones
    in a row, so that the draws end: a long run of empty chunks made Hypothesis' data-too-large
    health check fail now and then)."""
    chunks: list[list[int]] = []
    start = 0
    while start < len(token_ids):
        smallest = 1 if chunks and not chunks[-1] else 0
        size = draw(st.integers(min_value=smallest, max_value=5))
        chunks.append(token_ids[start : start + size])
        start += size
    return chunks


TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\ufffd"), max_size=30)


@settings(max_examples=150, deadline=None)
@given(prompt_text=TEXT, text=TEXT, data=st.data())
def test_byte_tokens_in_random_chunks_reproduce_text(
    prompt_text: str, text: str, data: st.DataObject
) -> None:
    assume(not any(s in prompt_text + text for s in SPECIAL_STRINGS))
    tokenizer = make_byte_tokenizer()
    token_ids = tokenizer.encode(text, add_special_tokens=False)
    assert token_ids == byte_ids(text)
    for chunks in ([[token_id] for token_id in token_ids], data.draw(chunked(token_ids))):
        detokenizer = IncrementalDetokenizer(tokenizer, tokenizer.encode(prompt_text, True))
        pieces = [*run_steps(detokenizer, chunks), detokenizer.flush()]
        assert "".join(pieces) == text
        assert detokenizer.text == text
        assert not any("\ufffd" in piece for piece in pieces)
        assert pieces[-1] == ""


UNIT = st.one_of(
    st.sampled_from([[HELLO], [WORLD], [HI], [BANG], [SPACE]]),
    st.characters(codec="utf-8", exclude_characters="\ufffd").map(byte_ids),
)


@settings(max_examples=100, deadline=None)
@given(
    prompt_ids=st.lists(st.sampled_from([HELLO, WORLD, HI, BANG]), max_size=8),
    units=st.lists(UNIT, max_size=12),
    data=st.data(),
)
def test_sentencepiece_pieces_match_full_decode(
    prompt_ids: list[int], units: list[list[int]], data: st.DataObject
) -> None:
    tokenizer = make_sentencepiece_like()
    prompt = [BOS, *prompt_ids]
    generated = [token_id for unit in units for token_id in unit]
    expected = tokenizer.decode(prompt + generated)[len(tokenizer.decode(prompt)) :]
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [*run_steps(detokenizer, data.draw(chunked(generated))), detokenizer.flush()]
    assert "".join(pieces) == expected
    assert not any("\ufffd" in piece for piece in pieces)


def make_stories_tokenizer(stories_dir: Path) -> TextTokenizer:
    """stories260K's llama2.c tokenizer (512 pieces, byte fallback) as the converter builds it."""
    tokenizer = build_tokenizer(*read_tokenizer(stories_dir / "tok512.bin", 512))
    return TextTokenizer.from_json(
        tokenizer.to_str(), '{"add_bos_token": true, "bos_token": "<s>"}'
    )


def byte_piece_ids(data: bytes) -> list[int]:
    """Ids of the byte tokens <0xNN> of ``data`` (3 + NN in both Llama-like vocabs)."""
    return [byte + 3 for byte in data]


def test_invalid_bytes_decode_to_one_replacement_char_per_maximal_subpart() -> None:
    tokenizer = make_sentencepiece_like()
    for data in [b"h\xe6", b"\xe6\x97h", b"\xff\xfeab", b"\xed\xa0\x80", b"a\xe6\x97\xa5"]:
        text = data.decode("utf-8", errors="replace")
        assert tokenizer.decode(byte_piece_ids(data)) == text
        assert tokenizer.decode([BOS, HI, *byte_piece_ids(data), WORLD]) == f"Hi{text} world"


def test_stories260k_stream_of_byte_tokens_equals_the_full_decode(stories_dir: Path) -> None:
    # The case of the issue: "h" then the first byte of a 3-byte character, as byte tokens.
    tokenizer = make_stories_tokenizer(stories_dir)
    generated = byte_piece_ids(b"h\xe6")
    detokenizer = IncrementalDetokenizer(tokenizer, [BOS])
    pieces = [*run_steps(detokenizer, [[token_id] for token_id in generated]), detokenizer.flush()]
    assert pieces == ["h", "", "\ufffd"]
    assert tokenizer.decode(generated) == "h\ufffd"


def any_ids(vocab_size: int) -> st.SearchStrategy[list[int]]:
    """Random generated ids: mostly byte tokens (ids 3..258), any id of the vocab (specials
    included), and ids just past it (a padded model vocab)."""
    return st.lists(
        st.one_of(
            st.integers(3, 258),
            st.integers(3, 258),
            st.integers(0, vocab_size + 2),
        ),
        max_size=24,
    )


def assert_stream_equals_full_decode(
    tokenizer: TextTokenizer, prompt: list[int], generated: list[int], chunks: list[list[int]]
) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer, prompt)
    pieces = [*run_steps(detokenizer, chunks), detokenizer.flush()]
    full = tokenizer.decode(prompt + generated)
    assert "".join(pieces) == full[len(tokenizer.decode(prompt)) :]
    if prompt == [BOS]:
        assert "".join(pieces) == tokenizer.decode(generated)


PROMPTS = st.one_of(
    st.just([BOS]),
    st.lists(st.sampled_from([HELLO, WORLD, HI, BANG]), max_size=6).map(lambda ids: [BOS, *ids]),
)


@settings(max_examples=300, deadline=None)
@given(prompt=PROMPTS, generated=any_ids(264), data=st.data())
def test_any_ids_stream_as_the_full_decode_sentencepiece(
    prompt: list[int], generated: list[int], data: st.DataObject
) -> None:
    chunks = data.draw(chunked(generated))
    assert_stream_equals_full_decode(make_sentencepiece_like(), prompt, generated, chunks)


@settings(max_examples=200, deadline=None)
@given(prompt_text=TEXT, generated=any_ids(259), data=st.data())
def test_any_ids_stream_as_the_full_decode_byte_level(
    prompt_text: str, generated: list[int], data: st.DataObject
) -> None:
    tokenizer = make_byte_tokenizer()
    prompt = tokenizer.encode(prompt_text, add_special_tokens=True)
    chunks = data.draw(chunked(generated))
    assert_stream_equals_full_decode(tokenizer, prompt, generated, chunks)


def test_any_ids_stream_as_the_full_decode_stories260k(stories_dir: Path) -> None:
    tokenizer = make_stories_tokenizer(stories_dir)

    @settings(max_examples=200, deadline=None)
    @given(generated=any_ids(512), data=st.data())
    def check(generated: list[int], data: st.DataObject) -> None:
        prompt = data.draw(st.sampled_from([[BOS], tokenizer.encode("Once upon a time", True)]))
        chunks = data.draw(chunked(generated))
        assert_stream_equals_full_decode(tokenizer, prompt, generated, chunks)

    check()


# NOTE: assume() rejects most draws (invalid UTF-8), which hypothesis's health checks count
# against the test at random: they are not what this test is about.
@settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.data_too_large, HealthCheck.filter_too_much],
)
@given(generated=any_ids(264))
def test_decode_is_the_tokenizers_decode_when_the_bytes_are_valid(generated: list[int]) -> None:
    tokenizer = make_sentencepiece_like()
    reference = Tokenizer.from_str(tokenizer_json_of_sentencepiece_like())
    expected = reference.decode([i for i in generated if i < 264], skip_special_tokens=True)
    assume("\ufffd" not in expected)
    assert tokenizer.decode(generated) == expected


@settings(max_examples=200, deadline=None)
@given(generated=any_ids(264), stop=st.text("HWlo! \ufffd", min_size=1, max_size=3), data=st.data())
def test_stream_chunks_truncate_at_a_stop_string_as_the_full_decode(
    generated: list[int], stop: str, data: st.DataObject
) -> None:
    # What the unary Generate answers is the concatenation of these same chunks.
    tokenizer = make_sentencepiece_like()
    full = tokenizer.decode(generated)
    expected = full[: full.find(stop)] if stop in full else full
    detokenizer = IncrementalDetokenizer(tokenizer, [BOS])
    stops = StopStringMatcher([stop])
    chunks = [*data.draw(chunked(generated)), [EOS]]
    texts = []
    for i, chunk in enumerate(chunks):
        reason = FinishReason.LENGTH if i == len(chunks) - 1 else FinishReason.UNSPECIFIED
        output = RequestOutput("r", tuple(chunk), reason, 1, 0)
        result = TextGenerator._chunk("r", output, Usage(1, 1, 0), detokenizer, stops)
        texts.append(result.text)
        if result.finish_reason != FinishReason.UNSPECIFIED:
            break
    assert "".join(texts) == expected


@pytest.mark.parametrize("byte_fallback", [False, True])
def test_kept_special_tokens_are_output_and_the_others_dropped(byte_fallback: bool) -> None:
    """A tool-call format's marker that is a special token (Mistral's ``[TOOL_CALLS]``) is text
    for its parser; EOS stays dropped."""
    if byte_fallback:
        raw = Tokenizer.from_str(tokenizer_json_of_sentencepiece_like())
    else:
        raw = build_byte_level_tokenizer()
    raw.add_special_tokens(["[TOOL_CALLS]"])
    tokenizer = TextTokenizer.from_json(raw.to_str(), '{"bos_token": "<s>"}')
    marker = raw.token_to_id("[TOOL_CALLS]")
    assert tokenizer.special_token_ids(["[TOOL_CALLS]", "<tool_call>"]) == {marker}
    ids = [HELLO, WORLD] if byte_fallback else tokenizer.encode("ab", add_special_tokens=False)
    text = tokenizer.decode(ids)
    output = [*ids, marker, *ids, EOS]
    kept = IncrementalDetokenizer(tokenizer, [BOS], frozenset({marker}))
    joined = "".join(kept.step([i]) for i in output) + kept.flush()
    assert joined == tokenizer.decode(output, keep_special_ids=frozenset({marker}))
    assert joined.startswith(text) and "[TOOL_CALLS]" in joined and "</s>" not in joined
    dropped = IncrementalDetokenizer(tokenizer, [BOS])
    assert "".join(dropped.step([i]) for i in output) + dropped.flush() == tokenizer.decode(output)
    assert "[TOOL_CALLS]" not in tokenizer.decode(output)
