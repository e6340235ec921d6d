"""Tests for TextTokenizer: BOS rules, decode, pieces, errors."""

from __future__ import annotations

import json

import pytest
from factories import sentencepiece_like_tokenizer_json

from zerolayer.checkpoints.byte_tokenizer import build_byte_level_tokenizer
from zerolayer.frontend.text.tokenizer import TextTokenizer

WORDS = ["▁Hello", "▁world", "▁Hi", "!"]


def make_config_json(**fields: object) -> str:
    return json.dumps(fields)


def make_byte_tokenizer(config_json: str = "") -> TextTokenizer:
    """The dummy model's byte tokenizer: its post-processor adds <s>."""
    return TextTokenizer.from_json(build_byte_level_tokenizer().to_str(), config_json)


def make_sentencepiece_like_json() -> str:
    """Llama-like tokenizer.json without a post-processor: <unk> <s> </s>, 256 byte tokens, WORDS.

    "▁Hello" is id 259, "▁world" 260, "▁Hi" 261, "!" 262.
    """
    return sentencepiece_like_tokenizer_json(WORDS)


def make_sentencepiece_like(config_json: str = "") -> TextTokenizer:
    return TextTokenizer.from_json(make_sentencepiece_like_json(), config_json)


BYTE_CONFIG = make_config_json(add_bos_token=True, bos_token="<s>", eos_token="</s>")


def test_byte_tokenizer_encode_exact_ids() -> None:
    tokenizer = make_byte_tokenizer(BYTE_CONFIG)
    assert tokenizer.encode("hi", add_special_tokens=True) == [1, 107, 108]
    assert tokenizer.encode("hi", add_special_tokens=False) == [107, 108]
    assert tokenizer.encode("", add_special_tokens=True) == [1]
    assert tokenizer.encode("", add_special_tokens=False) == []


def test_byte_tokenizer_properties() -> None:
    tokenizer = make_byte_tokenizer(BYTE_CONFIG)
    assert tokenizer.vocab_size == 259
    assert tokenizer.bos_token_id == 1


def test_post_processor_bos_is_not_doubled() -> None:
    tokenizer = make_byte_tokenizer(BYTE_CONFIG)
    assert tokenizer.encode("é", add_special_tokens=True) == [1, 198, 172]


def test_without_config_post_processor_still_adds_bos() -> None:
    tokenizer = make_byte_tokenizer()
    assert tokenizer.encode("hi", add_special_tokens=True) == [1, 107, 108]
    assert tokenizer.bos_token_id is None


def test_add_bos_token_false_trusts_post_processor() -> None:
    tokenizer = make_byte_tokenizer(make_config_json(add_bos_token=False, bos_token="<s>"))
    assert tokenizer.encode("hi", add_special_tokens=True) == [1, 107, 108]
    assert tokenizer.bos_token_id == 1


def test_config_add_bos_token_prepends_when_post_processor_missing() -> None:
    config = make_config_json(add_bos_token=True, bos_token={"content": "<s>", "lstrip": False})
    tokenizer = make_sentencepiece_like(config)
    assert tokenizer.bos_token_id == 1
    assert tokenizer.encode("Hello world", add_special_tokens=True) == [1, 259, 260]
    assert tokenizer.encode("Hello world", add_special_tokens=False) == [259, 260]
    assert tokenizer.encode("", add_special_tokens=True) == [1]


def test_no_bos_without_config_rule() -> None:
    assert make_sentencepiece_like().encode("Hello world", add_special_tokens=True) == [259, 260]
    config = make_config_json(add_bos_token=False, bos_token="<s>")
    tokenizer = make_sentencepiece_like(config)
    assert tokenizer.encode("Hello world", add_special_tokens=True) == [259, 260]


def test_bos_token_missing_from_vocab_is_none() -> None:
    tokenizer = make_sentencepiece_like(make_config_json(add_bos_token=True, bos_token="<bos>"))
    assert tokenizer.bos_token_id is None
    assert tokenizer.encode("Hi", add_special_tokens=True) == [261]


def test_decode_skips_special_tokens_by_default() -> None:
    tokenizer = make_sentencepiece_like()
    assert tokenizer.decode([1, 259, 260, 262, 2]) == "Hello world!"
    assert tokenizer.decode([1, 259, 2], skip_special_tokens=False) == "<s> Hello</s>"


def test_decode_incomplete_utf8_gives_replacement_char() -> None:
    tokenizer = make_byte_tokenizer()
    assert tokenizer.decode([107, 0xE6 + 3, 0x97 + 3]) == "h\ufffd"
    assert tokenizer.decode([0xE6 + 3, 0x97 + 3, 0xA5 + 3]) == "日"


def test_pieces_exact() -> None:
    assert make_byte_tokenizer().pieces([1, 107, 35, 2]) == ["<s>", "h", "Ġ", "</s>"]
    assert make_sentencepiece_like().pieces([259, 3 + 0xE6]) == ["▁Hello", "<0xE6>"]


@pytest.mark.parametrize("bad_id", [-1, 259, 10_000])
def test_out_of_vocab_ids_decode_to_nothing_and_have_no_piece(bad_id: int) -> None:
    tokenizer = make_byte_tokenizer()
    assert tokenizer.decode([107, bad_id, 108]) == "hi"
    with pytest.raises(ValueError, match=f"id {bad_id} "):
        tokenizer.pieces([bad_id])


@pytest.mark.parametrize(
    ("tokenizer_json", "config_json", "message"),
    [
        ("{not json", "", "tokenizer_json: invalid JSON"),
        ('{"model": 3}', "", "tokenizer_json: not a valid tokenizer"),
        (None, "{bad", "tokenizer_config_json: invalid JSON"),
        (None, "[1, 2]", "tokenizer_config_json: must be a JSON object"),
        (None, '{"add_bos_token": "yes"}', "tokenizer_config_json: add_bos_token must be a bool"),
    ],
)
def test_invalid_json_raises_value_error(
    tokenizer_json: str | None, config_json: str, message: str
) -> None:
    tokenizer_json = tokenizer_json or build_byte_level_tokenizer().to_str()
    with pytest.raises(ValueError, match=message):
        TextTokenizer.from_json(tokenizer_json, config_json)


def test_truncation_and_padding_in_tokenizer_json_are_ignored() -> None:
    raw = build_byte_level_tokenizer()
    raw.enable_truncation(max_length=2)
    raw.enable_padding(length=8, pad_id=0)
    tokenizer = TextTokenizer.from_json(raw.to_str(), BYTE_CONFIG)
    assert tokenizer.encode("hello", add_special_tokens=True) == [1, 107, 104, 111, 111, 114]


@pytest.mark.parametrize(
    ("family", "config", "tokenizer_json", "expected"),
    [
        # Qwen2/Qwen2.5/Qwen3: "bos_token": null, no add_bos_token, no BOS in the post-processor.
        ("qwen", {"bos_token": None, "eos_token": "</s>"}, "sentencepiece", [259, 260]),
        # SmolLM2: a bos_token string but no add_bos_token and no BOS template.
        ("smollm2", {"bos_token": "<s>", "eos_token": "</s>"}, "sentencepiece", [259, 260]),
        # Llama 3/3.2: no add_bos_token; the tokenizer.json template adds the BOS, once.
        ("llama3", {"bos_token": "<s>", "eos_token": "</s>"}, "byte", [1, 107, 108]),
    ],
)
def test_family_tokenizer_config_bos_rules(
    family: str, config: dict, tokenizer_json: str, expected: list[int]
) -> None:
    text = "Hello world" if tokenizer_json == "sentencepiece" else "hi"
    source = (
        make_sentencepiece_like_json()
        if tokenizer_json == "sentencepiece"
        else build_byte_level_tokenizer().to_str()
    )
    tokenizer = TextTokenizer.from_json(source, json.dumps(config))
    assert tokenizer.encode(text, add_special_tokens=True) == expected
