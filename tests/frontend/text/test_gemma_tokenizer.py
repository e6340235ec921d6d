"""Gemma's special-token rules, as its published tokenizer_config.json sets them: BOS ``<bos>``
(id 2) added once (tokenizer.json's template adds it, ``add_bos_token: true``), EOS ``<eos>`` (id 1)
never added, ``<start_of_turn>``/``<end_of_turn>`` (106/107) special. zerolayer's ids must be the
ones transformers' GemmaTokenizer gives for the same files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, processors

from zerolayer.frontend.text.tokenizer import TextTokenizer

SPECIALS = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<unk>": 3, "<start_of_turn>": 106}
SPECIALS["<end_of_turn>"] = 107
TOKENIZER_CONFIG = {
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<bos>",
    "eos_token": "<eos>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "tokenizer_class": "GemmaTokenizer",
}


def write_gemma_like_tokenizer(out_dir: Path) -> Path:
    """A word-level tokenizer.json with Gemma's special ids and its "<bos> $A" template."""
    vocab = {**SPECIALS, "hello": 4, "world": 5}
    vocab.update({f"<unused{i}>": i for i in range(6, 106)})
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<bos> $A", pair="<bos> $A <bos> $B", special_tokens=[("<bos>", 2)]
    )
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIALS])
    tokenizer.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps(TOKENIZER_CONFIG))
    return out_dir


@pytest.fixture(scope="module")
def gemma_tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gemma_like_tokenizer(tmp_path_factory.mktemp("gemma-tokenizer"))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<start_of_turn>", [2, 106]),
        # A prompt that starts with <bos> keeps it once more, as transformers does.
        ("<bos><start_of_turn>", [2, 2, 106]),
        ("<end_of_turn><eos>", [2, 107, 1]),
    ],
)
def test_gemma_special_tokens_match_transformers(
    gemma_tokenizer_dir: Path, text: str, expected: list[int]
) -> None:
    tokenizer = TextTokenizer.from_json(
        (gemma_tokenizer_dir / "tokenizer.json").read_text(),
        (gemma_tokenizer_dir / "tokenizer_config.json").read_text(),
    )
    reference = transformers.AutoTokenizer.from_pretrained(gemma_tokenizer_dir)
    assert type(reference).__name__ == "GemmaTokenizer"
    assert reference(text)["input_ids"] == expected
    assert tokenizer.encode(text, add_special_tokens=True) == expected
    assert tokenizer.bos_token_id == 2
    assert tokenizer.encode(text, add_special_tokens=False) == expected[1:]
    assert tokenizer.decode(expected) == ""
