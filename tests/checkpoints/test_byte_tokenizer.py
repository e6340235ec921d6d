"""Tests for the dummy model's byte-level tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from tokenizers import Tokenizer, pre_tokenizers

from zerolayer.checkpoints.byte_tokenizer import (
    BYTE_VOCAB_SIZE,
    build_byte_level_tokenizer,
    bytes_to_unicode,
    write_byte_level_tokenizer,
)


def make_tokenizer() -> Tokenizer:
    return build_byte_level_tokenizer()


def byte_ids(text: str) -> list[int]:
    """The reference encoding: one id per UTF-8 byte, id = byte + 3."""
    return [byte + 3 for byte in text.encode("utf-8")]


def test_vocab_size_is_259() -> None:
    assert BYTE_VOCAB_SIZE == 259
    assert make_tokenizer().get_vocab_size(with_added_tokens=True) == 259


def test_special_token_ids() -> None:
    tokenizer = make_tokenizer()
    assert [tokenizer.token_to_id(t) for t in ("<unk>", "<s>", "</s>")] == [0, 1, 2]


def test_byte_alphabet_matches_tokenizers_byte_level() -> None:
    mapping = bytes_to_unicode()
    assert sorted(mapping) == list(range(256))
    assert sorted(mapping.values()) == sorted(pre_tokenizers.ByteLevel.alphabet())
    assert mapping[ord("h")] == "h"
    assert mapping[ord(" ")] == "Ġ"


def test_every_byte_value_has_its_own_token() -> None:
    tokenizer = make_tokenizer()
    mapping = bytes_to_unicode()
    assert [tokenizer.token_to_id(mapping[byte]) for byte in range(256)] == list(range(3, 259))


def test_hi_ids_exact() -> None:
    tokenizer = make_tokenizer()
    assert tokenizer.encode("hi", add_special_tokens=False).ids == [107, 108]
    assert tokenizer.encode("hi", add_special_tokens=True).ids == [1, 107, 108]


@pytest.mark.parametrize(
    "text",
    [
        "hello, world!",
        " leading and trailing ",
        "tab\tnew\nline\x00nul",
        "é",
        "日本語",
        "😀🎉",
        "aé日😀",
    ],
)
def test_round_trip_and_one_token_per_byte(text: str) -> None:
    tokenizer = make_tokenizer()
    ids = tokenizer.encode(text, add_special_tokens=False).ids
    assert ids == byte_ids(text)
    assert tokenizer.decode(ids) == text


def test_multi_byte_ids_exact() -> None:
    tokenizer = make_tokenizer()
    # é = C3 A9, 日 = E6 97 A5, 😀 = F0 9F 98 80
    assert tokenizer.encode("é", add_special_tokens=False).ids == [0xC3 + 3, 0xA9 + 3]
    assert tokenizer.encode("日", add_special_tokens=False).ids == [0xE6 + 3, 0x97 + 3, 0xA5 + 3]
    assert tokenizer.encode("😀", add_special_tokens=False).ids == [243, 162, 155, 131]


def test_incomplete_character_decodes_to_replacement_char() -> None:
    tokenizer = make_tokenizer()
    assert tokenizer.decode([0xE6 + 3, 0x97 + 3]) == "\ufffd"
    assert tokenizer.decode([107, 0xE6 + 3]) == "h\ufffd"


def test_decode_skips_bos_and_eos() -> None:
    tokenizer = make_tokenizer()
    assert tokenizer.decode([1, 107, 108, 2]) == "hi"
    assert tokenizer.decode([1, 107, 108, 2], skip_special_tokens=False) == "<s>hi</s>"


def test_write_files_exact_config(tmp_path: Path) -> None:
    write_byte_level_tokenizer(tmp_path, model_max_length=256)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config == {
        "add_bos_token": True,
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "model_max_length": 256,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    loaded = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    assert loaded.encode("日本", add_special_tokens=True).ids == [1, *byte_ids("日本")]


def test_transformers_loads_written_tokenizer(tmp_path: Path) -> None:
    write_byte_level_tokenizer(tmp_path, model_max_length=64)
    hf = transformers.PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    assert hf("hi").input_ids == [1, 107, 108]
    assert hf("é日😀", add_special_tokens=False).input_ids == byte_ids("é日😀")
    assert hf.decode(byte_ids("é日😀")) == "é日😀"
    assert len(hf) == 259


def test_transformers_auto_tokenizer_reads_config(tmp_path: Path) -> None:
    write_byte_level_tokenizer(tmp_path, model_max_length=64)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    assert (hf.bos_token_id, hf.eos_token_id, hf.unk_token_id) == (1, 2, 0)
    assert hf.model_max_length == 64
    assert hf("hi").input_ids == [1, 107, 108]
