"""Tests for zerolayer.checkpoints.llama2c against the stories260K llama2.c test data.

The reference outputs come from outside this repo: ``shared/models/stories260K`` holds llama2.c's
greedy output for the checkpoint (checked against llama2.c's own ``test_all.py``), and the
encoder below is a line-by-line port of ``encode()`` in llama2.c's ``run.c``.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np
import pytest
from checkpoints.model_modes import MODEL_MODES, modes
from safetensors import safe_open
from tokenizers import Tokenizer

from zerolayer.checkpoints.llama2c import convert_llama2c, permute_rope_rows

MODEL_DIR = Path(__file__).resolve().parents[2] / ".." / "shared" / "models" / "stories260K"
CHECKPOINT = MODEL_DIR / "stories260K.bin"
TOKENIZER = MODEL_DIR / "tok512.bin"

pytestmark = pytest.mark.skipif(
    not CHECKPOINT.exists(), reason=f"stories260K test data not found at {MODEL_DIR.resolve()}"
)

ENCODE_TEXTS = [
    "Once upon a time, there was a little girl named Lily.",
    " leading space",
    "trailing space ",
    "double  spaces   and more",
    "   ",
    'Wow! "Stop," said Tim. What? (yes) - 3+4=7; 50% & more...',
    "line one\nline two\n\nend\n",
    "\ttab",
    "café naïve résumé",
    "日本",
    "emoji 🙂 here 👍🏽",
    "\u201cHi,\u201d she said\u2026 it\u2019s",
    "a",
    "",
]


def read_llama2c_vocab(path: Path, vocab_size: int = 512) -> tuple[list[bytes], list[float]]:
    """Pieces (raw bytes, as run.c holds them) and scores from a llama2.c tokenizer.bin."""
    raw = path.read_bytes()
    pieces, scores, offset = [], [], 4
    for _ in range(vocab_size):
        score, length = struct.unpack_from("<fi", raw, offset)
        pieces.append(raw[offset + 8 : offset + 8 + length])
        scores.append(score)
        offset += 8 + length
    return pieces, scores


def llama2c_encode(text: str, pieces: list[bytes], scores: list[float]) -> list[int]:
    """Port of run.c ``encode(t, text, bos=0, eos=0, ...)``."""
    lookup = {piece: i for i, piece in enumerate(pieces)}
    data = text.encode("utf-8")
    token_ids = [lookup[b" "]] if data else []  # the dummy prefix
    start = 0
    while start < len(data):
        end = start + 1
        while end < len(data) and data[end] & 0xC0 == 0x80 and end - start < 4:
            end += 1
        char = data[start:end]
        token_ids.extend([lookup[char]] if char in lookup else [b + 3 for b in char])
        start = end
    while True:
        best_score, best_id, best_idx = -1e10, -1, -1
        for i in range(len(token_ids) - 1):
            merged = lookup.get(pieces[token_ids[i]] + pieces[token_ids[i + 1]], -1)
            if merged != -1 and scores[merged] > best_score:
                best_score, best_id, best_idx = scores[merged], merged, i
        if best_idx == -1:
            return token_ids
        token_ids[best_idx : best_idx + 2] = [best_id]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out_dir = tmp_path_factory.mktemp("stories260K_hf") / "model"
    convert_llama2c(CHECKPOINT, TOKENIZER, out_dir)
    return out_dir


@pytest.mark.usefixtures("strict_umask")
def test_converted_model_is_readable_by_every_user(tmp_path: Path) -> None:
    convert_llama2c(CHECKPOINT, TOKENIZER, tmp_path / "new" / "model")
    assert modes(tmp_path / "new" / "model") == MODEL_MODES
    assert modes(tmp_path / "new")["."] == 0o755


@pytest.fixture(scope="module")
def expected_ids() -> list[int]:
    return json.loads((MODEL_DIR / "expected_greedy_200_ids.json").read_text())


@pytest.fixture(scope="module")
def expected_text() -> str:
    return (MODEL_DIR / "expected_greedy_200.txt").read_bytes().decode("utf-8")


@pytest.mark.parametrize("text", ENCODE_TEXTS)
def test_encode_matches_llama2c(hf_dir: Path, text: str) -> None:
    pieces, scores = read_llama2c_vocab(TOKENIZER)
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    assert tokenizer.encode(text, add_special_tokens=False).ids == llama2c_encode(
        text, pieces, scores
    )


def test_encode_exact_ids_and_bos(hf_dir: Path, expected_text: str) -> None:
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    pieces, scores = read_llama2c_vocab(TOKENIZER)
    assert tokenizer.encode("Once upon a time").ids == [1, 403, 407, 261, 378]
    assert tokenizer.encode("日").ids == [1, 410, 233, 154, 168]  # " " then bytes e6 97 a5
    assert tokenizer.encode("").ids == [1]
    long_ids = tokenizer.encode(expected_text, add_special_tokens=False).ids
    assert long_ids == llama2c_encode(expected_text, pieces, scores)


def test_decode_matches_expected_text(
    hf_dir: Path, expected_ids: list[int], expected_text: str
) -> None:
    tokenizer = Tokenizer.from_file(str(hf_dir / "tokenizer.json"))
    assert tokenizer.decode(expected_ids) == expected_text
    assert tokenizer.decode([1, *expected_ids], skip_special_tokens=True) == expected_text
    assert tokenizer.decode([410, 233, 154, 168, 410, 436]) == '日 "'


def test_hf_greedy_generation_matches_llama2c(hf_dir: Path, expected_ids: list[int]) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32)
    output = model.generate(torch.tensor([[1]]), max_new_tokens=200, do_sample=False)
    assert output[0].tolist() == [1, *expected_ids]
    tokenizer = transformers.AutoTokenizer.from_pretrained(hf_dir)
    assert tokenizer("Once upon a time").input_ids == [1, 403, 407, 261, 378]


def test_config_and_tensor_names(hf_dir: Path) -> None:
    config = json.loads((hf_dir / "config.json").read_text())
    assert {k: config[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers")} == {
        "hidden_size": 64,
        "intermediate_size": 172,
        "num_hidden_layers": 5,
    }
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (8, 4)
    assert (config["vocab_size"], config["max_position_embeddings"]) == (512, 512)
    assert config["tie_word_embeddings"] is True
    assert json.loads((hf_dir / "generation_config.json").read_text()) == {
        "bos_token_id": 1,
        "eos_token_id": [2, 1],  # llama2.c's run.c stops at BOS too
    }
    with safe_open(hf_dir / "model.safetensors", framework="np") as f:
        assert f.metadata() == {"format": "pt"}
        names = set(f.keys())
        assert f.get_tensor("model.layers.0.self_attn.k_proj.weight").shape == (32, 64)
        assert f.get_tensor("model.layers.4.mlp.down_proj.weight").dtype == np.float32
    assert len(names) == 47
    assert "lm_head.weight" not in names


def test_permute_rope_rows_moves_even_rows_first() -> None:
    weight = np.arange(16, dtype=np.float32).reshape(8, 2)
    permuted = permute_rope_rows(weight, num_heads=2)
    assert permuted[:, 0].tolist() == [0, 4, 2, 6, 8, 12, 10, 14]
    assert permuted[:, 1].tolist() == [1, 5, 3, 7, 9, 13, 11, 15]


def test_untied_classifier_is_read_after_rope_tables(
    tmp_path: Path, expected_ids: list[int]
) -> None:
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    raw = CHECKPOINT.read_bytes()
    embedding = raw[28 : 28 + 512 * 64 * 4]
    untied = raw[:20] + struct.pack("<i", -512) + raw[24:] + embedding
    (tmp_path / "untied.bin").write_bytes(untied)
    convert_llama2c(tmp_path / "untied.bin", TOKENIZER, tmp_path / "hf")
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["tie_word_embeddings"] is False
    with safe_open(tmp_path / "hf" / "model.safetensors", framework="np") as f:
        assert f.get_tensor("lm_head.weight").tobytes() == embedding
    model = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf", dtype=torch.float32)
    output = model.generate(torch.tensor([[1]]), max_new_tokens=20, do_sample=False)
    assert output[0, 1:].tolist() == expected_ids[:20]


@pytest.mark.parametrize(
    ("num_bytes", "message"),
    [(10, "truncated"), (28, "implies"), (-4, "implies")],
)
def test_truncated_checkpoint_raises(tmp_path: Path, num_bytes: int, message: str) -> None:
    (tmp_path / "bad.bin").write_bytes(CHECKPOINT.read_bytes()[:num_bytes])
    with pytest.raises(ValueError, match=message):
        convert_llama2c(tmp_path / "bad.bin", TOKENIZER, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_truncated_or_mismatched_tokenizer_raises(tmp_path: Path) -> None:
    raw = TOKENIZER.read_bytes()
    (tmp_path / "short.bin").write_bytes(raw[:-3])
    with pytest.raises(ValueError, match="truncated at piece 511"):
        convert_llama2c(CHECKPOINT, tmp_path / "short.bin", tmp_path / "out")
    (tmp_path / "long.bin").write_bytes(raw + struct.pack("<fi", 0.0, 1) + b"x")
    with pytest.raises(ValueError, match="9 bytes after 512 pieces"):
        convert_llama2c(CHECKPOINT, tmp_path / "long.bin", tmp_path / "out")
    assert not (tmp_path / "out").exists()
