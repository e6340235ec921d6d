"""The tokenizer of a GGUF file, of both kinds, token for token against the tokenizer it was
written from, on a varied text: stories260K's SentencePiece vocabulary ("llama": tokens, scores,
types) against its llama2.c conversion, and byte-level BPEs with real merges ("gpt2") under each
served pre-tokenizer against the Hugging Face tokenizer they came from."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from gguf_files import stories_gguf
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from benchmarks.llamacpp.gguf_vocab import add_bpe_tokenizer
from zerolayer.checkpoints.checkpoint import read_checkpoint
from zerolayer.checkpoints.gguf.bpe_tokenizer import LLAMA3_SPLIT, QWEN2_SPLIT
from zerolayer.checkpoints.gguf.metadata import Metadata
from zerolayer.checkpoints.gguf.reader import read_gguf_file
from zerolayer.checkpoints.gguf.tokenizer import tokenizer_files
from zerolayer.frontend.text.tokenizer import TextTokenizer

TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    "  leading spaces,   runs of   spaces\tand\ttabs\n\nnew lines\r\n",
    "digits 0 12 345 6789 3.14159 1,000,000",
    "unicode: café naïve Ωμέγα 日本語 🙂 emoji 👩‍👩‍👧",
    "specials <s> inside </s> text<unk>and glued<s>",
    "it's don't we'll I'M THEY'RE",
    "",
    " ",
]
"""Varied text: words, whitespace runs, digits, unicode the vocabulary lacks, special tokens."""


@pytest.fixture(scope="module")
def stories(stories_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return stories_gguf(stories_dir, tmp_path_factory.mktemp("stories"))


def text_tokenizer(model: Path) -> TextTokenizer:
    manifest = read_checkpoint(model)
    return TextTokenizer.from_json(manifest.tokenizer_json, manifest.tokenizer_config_json)


def test_a_sentencepiece_vocabulary_tokenizes_as_its_llama2c_conversion(
    stories: tuple[Path, Path],
) -> None:
    converted, path = stories
    source, ours = text_tokenizer(converted), text_tokenizer(path)
    for text in TEXTS:
        for special in (True, False):
            expected = source.encode(text, add_special_tokens=special)
            assert ours.encode(text, add_special_tokens=special) == expected, (text, special)
            assert ours.decode(expected) == source.decode(expected), text
    assert ours.encode("Once upon a time", add_special_tokens=True) == [1, 403, 407, 261, 378]
    config = json.loads(read_checkpoint(path).tokenizer_config_json)
    assert (config["bos_token"], config["eos_token"], config["unk_token"]) == (
        "<s>",
        "</s>",
        "<unk>",
    )
    assert config["add_bos_token"] is True


CORPUS = [
    "The quick brown fox jumps over the lazy dog. It's 12:45 and 2024 has 366 days!",
    "Once upon a time there was a little girl named Lily who liked to play outside.",
    "café naïve résumé Ωμέγα 日本語 12345 67890 don't we'll THEY'RE    spaces\n\nlines",
] * 20


def source_bpe(pre: str) -> Tokenizer:
    """A byte-level BPE with real merges, trained here, split as ``pre`` names, with two
    special tokens and one user-defined one."""
    split = {"llama-bpe": LLAMA3_SPLIT, "qwen2": QWEN2_SPLIT}.get(pre)
    tokenizer = Tokenizer(models.BPE(ignore_merges=pre == "llama-bpe"))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=split is None)
    tokenizer.pre_tokenizer = (
        byte_level
        if split is None
        else pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"), byte_level]
        )
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|end|>", "<|start|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    tokenizer.add_tokens(["<think>"])
    if pre == "llama-bpe":
        tokenizer.post_processor = processors.TemplateProcessing(
            single="<|start|> $A", special_tokens=[("<|start|>", 1)]
        )
    return tokenizer


@pytest.mark.parametrize("pre", ["gpt-2", "llama-bpe", "qwen2"])
def test_a_byte_level_bpe_tokenizes_as_its_source(pre: str, tmp_path: Path) -> None:
    source = source_bpe(pre)
    config = {
        "bos_token": "<|start|>",
        "eos_token": "<|end|>",
        "add_bos_token": pre == "llama-bpe",
        "chat_template": "{{ messages[0].content }}",
    }
    writer = gguf.GGUFWriter(str(tmp_path / "v.gguf"), "llama")
    add_bpe_tokenizer(writer, source.to_str(), json.dumps(config), source.get_vocab_size(), pre)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    tokenizer_json, config_json = tokenizer_files(
        Metadata(read_gguf_file(tmp_path / "v.gguf").metadata), 256
    )
    ours = TextTokenizer.from_json(tokenizer_json, config_json)
    reference = TextTokenizer.from_json(source.to_str(), json.dumps(config))
    texts = [*TEXTS, "<|start|>glued<|end|> and <think>reasoning</think>", *CORPUS[:3]]
    for text in texts:
        expected = reference.encode(text, add_special_tokens=True)
        assert ours.encode(text, add_special_tokens=True) == expected, text
        assert ours.decode(expected, skip_special_tokens=False) == reference.decode(
            expected, skip_special_tokens=False
        )
    assert len(source.encode(CORPUS[0]).ids) < len(CORPUS[0].encode()) / 2  # merges applied
    loaded = json.loads(config_json)
    assert loaded["chat_template"] == "{{ messages[0].content }}"
    assert loaded["add_bos_token"] is (pre == "llama-bpe")
    assert ours.special_token_ids(["<|end|>", "<think>"]) == {0}
