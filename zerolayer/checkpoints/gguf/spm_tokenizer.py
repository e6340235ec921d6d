"""``tokenizer.ggml.model`` "llama": a SentencePiece vocabulary (tokens, scores, types) as a
``tokenizers`` BPE that tokenizes as llama.cpp's ``llm_tokenizer_spm`` does.

llama.cpp: a space is put before the text and after each special token (``add_space_prefix``,
default true), spaces become ``▁``, then symbols (UTF-8 characters) are merged pair by pair, the
pair whose concatenation is the token of highest score first (:mod:`~zerolayer.checkpoints.
score_merges`), and a symbol left without a token becomes its bytes' ``<0xNN>`` tokens (BYTE
type). Decoding undoes it: ``▁`` to space, byte tokens to bytes, and the space put first is
dropped. Only NORMAL tokens take part in merges.
"""

from __future__ import annotations

from gguf import TokenType
from tokenizers import Tokenizer, decoders, models, normalizers

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.metadata import Metadata
from zerolayer.checkpoints.gguf.vocabulary import Vocabulary
from zerolayer.checkpoints.score_merges import merges_by_score

SPACE = "\u2581"
"""``▁``, SentencePiece's space."""
DEFAULT_SPECIAL_IDS = {"bos": 1, "eos": 2, "unk": 0}
"""llama.cpp's special ids of a "llama" vocabulary whose keys are absent."""


def spm_tokenizer(meta: Metadata) -> tuple[Tokenizer, Vocabulary]:
    """The tokenizer of a "llama" (SentencePiece) GGUF vocabulary, and the vocabulary.

    Raises:
        CheckpointError: a missing or mistyped key (the message names it), scores of another
            length than the tokens, or ``tokenizer.ggml.remove_extra_whitespaces`` (not served).
    """
    vocabulary = Vocabulary.read(meta, True, DEFAULT_SPECIAL_IDS)
    tokens, types = vocabulary.tokens, vocabulary.types
    scores = meta.array("tokenizer.ggml.scores", (int, float), [0.0] * len(tokens))
    if len(scores) != len(tokens):
        raise CheckpointError(
            f"metadata key 'tokenizer.ggml.scores' has {len(scores)} items for {len(tokens)} tokens"
        )
    if meta.boolean("tokenizer.ggml.remove_extra_whitespaces", False):
        raise CheckpointError("metadata key 'tokenizer.ggml.remove_extra_whitespaces': not served")
    space_prefix = meta.boolean("tokenizer.ggml.add_space_prefix", True)
    unk = vocabulary.unk_token_id
    merges = merges_by_score(tokens, scores, lambda i: types[i] == TokenType.NORMAL)
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocabulary.vocab(),
            merges=merges,
            unk_token=tokens[unk] if unk is not None else None,
            byte_fallback=TokenType.BYTE in types,
            ignore_merges=False,
        )
    )
    replace = normalizers.Replace(" ", SPACE)
    steps = [normalizers.Prepend(SPACE), replace] if space_prefix else [replace]
    tokenizer.normalizer = normalizers.Sequence(steps)
    decode = [decoders.Replace(SPACE, " "), decoders.ByteFallback(), decoders.Fuse()]
    if space_prefix:
        decode.append(decoders.Strip(content=" ", left=1, right=0))
    tokenizer.decoder = decoders.Sequence(decode)
    vocabulary.add_tokens_to(tokenizer)
    post = vocabulary.post_processor()
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer, vocabulary
