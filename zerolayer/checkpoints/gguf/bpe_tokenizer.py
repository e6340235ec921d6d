"""``tokenizer.ggml.model`` "gpt2": a byte-level BPE vocabulary (tokens and merges) as a
``tokenizers`` tokenizer, its text split first as ``tokenizer.ggml.pre`` names.

Each pre-tokenizer is the split of the Hugging Face tokenizer llama.cpp's converter recognises
under that name (``convert_hf_to_gguf_update.py``; llama.cpp's ``llm_tokenizer_bpe`` writes the
same patterns in its own regex dialect), and ``default`` is llama.cpp's own cascade of splits for
files without a known one. Llama 3 ("llama-bpe") looks a whole word up before merging
(``ignore_merges``) and adds BOS by default, as llama.cpp does.
"""

from __future__ import annotations

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.metadata import Metadata
from zerolayer.checkpoints.gguf.vocabulary import Vocabulary

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Llama 3's word split (its tokenizer.json)."""
QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
"""Qwen2's word split (its tokenizer.json): digits one by one."""
DEFAULT_SPLITS = (
    r"[\p{P}\$\+<=>\^~\|]+",
    r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
    r"\p{N}+",
    r"[0-9][0-9][0-9]",
)
"""llama.cpp's ``LLAMA_VOCAB_PRE_TYPE_DEFAULT`` splits, each applied to the pieces of the one
before."""
LLAMA3_NAMES = ("llama-bpe", "llama3", "llama-v3")
PRE_TOKENIZERS = ("default", "gpt-2", *LLAMA3_NAMES, "qwen2")
"""The ``tokenizer.ggml.pre`` values served."""
DEFAULT_SPECIAL_IDS = {"bos": 11, "eos": 11}
"""llama.cpp's special ids of a "gpt2" vocabulary whose keys are absent."""


def _pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The word split of ``pre``, then the bytes as GPT-2's printable characters."""
    if pre == "gpt-2":
        return pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in LLAMA3_NAMES or pre == "qwen2":
        patterns: tuple[str, ...] = (LLAMA3_SPLIT if pre != "qwen2" else QWEN2_SPLIT,)
    else:
        patterns = DEFAULT_SPLITS
    splits = [pre_tokenizers.Split(Regex(p), behavior="isolated", invert=False) for p in patterns]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )


def _merges(meta: Metadata, vocab: dict[str, int]) -> list[tuple[str, str]]:
    """``tokenizer.ggml.merges``: "left right" each, split at the first space after the first
    character (as llama.cpp splits them); those whose parts or result are not tokens are left
    out (``tokenizers`` refuses them; llama.cpp would fall back to the result's bytes).

    Raises:
        CheckpointError: missing, or an item with no such space.
    """
    merges = []
    for i, merge in enumerate(meta.array("tokenizer.ggml.merges", str)):
        cut = merge.find(" ", 1)
        if cut < 0:
            raise CheckpointError(f"metadata key 'tokenizer.ggml.merges': item {i} is {merge!r}")
        left, right = merge[:cut], merge[cut + 1 :]
        if left in vocab and right in vocab and left + right in vocab:
            merges.append((left, right))
    return merges


def bpe_tokenizer(meta: Metadata) -> tuple[Tokenizer, Vocabulary]:
    """The tokenizer of a "gpt2" (byte-level BPE) GGUF vocabulary, and the vocabulary.

    Raises:
        CheckpointError: a missing or mistyped key, or a ``tokenizer.ggml.pre`` not served (the
            message names the key; a file without one gets llama.cpp's "default").
    """
    pre = meta.string("tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise CheckpointError(
            f"metadata key 'tokenizer.ggml.pre' is {pre!r}, a pre-tokenizer zerolayer does not "
            f"serve (served: {', '.join(PRE_TOKENIZERS)})"
        )
    vocabulary = Vocabulary.read(meta, pre in LLAMA3_NAMES, DEFAULT_SPECIAL_IDS)
    vocab = vocabulary.vocab()
    tokenizer = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=_merges(meta, vocab),
            ignore_merges=pre in LLAMA3_NAMES,
        )
    )
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()
    vocabulary.add_tokens_to(tokenizer)
    post = vocabulary.post_processor()
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer, vocabulary
