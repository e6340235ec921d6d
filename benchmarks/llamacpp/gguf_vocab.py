"""A checkpoint's tokenizer as GGUF vocabulary metadata (``tokenizer.ggml.*``), of both kinds
zerolayer reads back (:mod:`zerolayer.checkpoints.gguf.vocabulary`): "gpt2" (a byte-level BPE:
tokens and merges) and "llama" (a SentencePiece vocabulary: tokens, scores and types).

Source: llama.cpp's converter (``TextModel._set_vocab_gpt2``, ``_set_vocab_sentencepiece``,
``gguf.SpecialVocab``), read, not copied.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

SENTENCEPIECE_SPACE = "\u2581"


@dataclass(frozen=True)
class SentencePieceVocab:
    """A SentencePiece-style vocabulary (llama2.c's, with spaces as ``▁``) and its special ids."""

    pieces: Sequence[str]
    scores: Sequence[float]
    types: Sequence[int]
    """Per id, a ``gguf.TokenType``."""
    bos_token_id: int
    eos_token_id: int
    unk_token_id: int


def add_bpe_tokenizer(
    writer: object,
    tokenizer_json: str,
    tokenizer_config_json: str,
    vocab_size: int,
    pre: str = "default",
) -> None:
    """The "gpt2" vocabulary of a ``tokenizers`` BPE (tokenizer.json text): its tokens in id
    order, ids past them up to ``vocab_size`` as unused ``[PADn]`` tokens (as llama.cpp's
    converter pads), special added tokens as CONTROL and the others USER_DEFINED, its merges
    (or, for a BPE without any, one that can never apply: llama.cpp needs the key and
    ``GGUFWriter`` refuses an empty array; BPE symbols start as single characters and no merge
    makes the two special tokens' texts), BOS/EOS/UNK and add-BOS from tokenizer_config.json,
    and the pre-tokenizer name ``pre``.

    Raises:
        ValueError: not a BPE, or more tokens than ``vocab_size``.
    """
    import gguf

    spec = json.loads(tokenizer_json)
    if spec["model"]["type"] != "BPE":
        raise ValueError(f"tokenizer model {spec['model']['type']!r}: only BPE is exported")
    by_id = {i: text for text, i in spec["model"]["vocab"].items()}
    added = {t["id"]: t for t in spec.get("added_tokens", [])}
    by_id.update({i: t["content"] for i, t in added.items()})
    if max(by_id) >= vocab_size:
        raise ValueError(f"tokenizer has id {max(by_id)} >= vocab_size {vocab_size}")
    tokens, types = [], []
    for i in range(vocab_size):
        tokens.append(by_id.get(i, f"[PAD{i}]"))
        if i in added:
            special = added[i].get("special")
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            types.append(gguf.TokenType.NORMAL if i in by_id else gguf.TokenType.UNUSED)
    merges = [" ".join(m) if isinstance(m, list) else m for m in spec["model"].get("merges", [])]
    config = json.loads(tokenizer_config_json)
    ids = {text: i for i, text in by_id.items()}
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    writer.add_token_merges(merges or [f"{config['bos_token']} {config['eos_token']}"])
    writer.add_bos_token_id(ids[config["bos_token"]])
    writer.add_eos_token_id(ids[config["eos_token"]])
    if config.get("unk_token") in ids:
        writer.add_unk_token_id(ids[config["unk_token"]])
    writer.add_add_bos_token(bool(config.get("add_bos_token", False)))
    if config.get("chat_template"):
        writer.add_chat_template(config["chat_template"])


def add_sentencepiece_tokenizer(writer: object, vocab: SentencePieceVocab, vocab_size: int) -> None:
    """The "llama" vocabulary of ``vocab``: pieces with spaces written as ``▁``, scores, types,
    BOS/EOS/UNK, add-BOS (llama.cpp's default for it) and the space prefix.

    Raises:
        ValueError: the vocabulary has another size than ``vocab_size``.
    """
    if len(vocab.pieces) != vocab_size:
        raise ValueError(f"{len(vocab.pieces)} pieces for vocab_size {vocab_size}")
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list([p.replace(" ", SENTENCEPIECE_SPACE) for p in vocab.pieces])
    writer.add_token_scores([float(s) for s in vocab.scores])
    writer.add_token_types(list(vocab.types))
    writer.add_bos_token_id(vocab.bos_token_id)
    writer.add_eos_token_id(vocab.eos_token_id)
    writer.add_unk_token_id(vocab.unk_token_id)
    writer.add_add_bos_token(True)
    writer.add_add_space_prefix(True)


def llama2c_vocab(pieces: Sequence[str], scores: Sequence[float]) -> SentencePieceVocab:
    """llama2.c's vocabulary (:func:`zerolayer.checkpoints.llama2c.read_tokenizer`) with the
    types its ``run.c`` gives its ids: 0 ``<unk>`` UNKNOWN, 1 and 2 CONTROL, 3 to 258 the byte
    pieces BYTE, the rest NORMAL."""
    import gguf

    from zerolayer.checkpoints.llama2c import BYTE_PIECE_OFFSET, NUM_BYTE_PIECES

    def kind(i: int) -> int:
        if i == 0:
            return gguf.TokenType.UNKNOWN
        if i < BYTE_PIECE_OFFSET:
            return gguf.TokenType.CONTROL
        if i < BYTE_PIECE_OFFSET + NUM_BYTE_PIECES:
            return gguf.TokenType.BYTE
        return gguf.TokenType.NORMAL

    return SentencePieceVocab(pieces, scores, [kind(i) for i in range(len(pieces))], 1, 2, 0)
