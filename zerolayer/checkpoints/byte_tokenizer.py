"""Byte-level tokenizer for the dummy models: one token per UTF-8 byte, no merges.

Ids: 0 ``<unk>``, 1 ``<s>`` (BOS), 2 ``</s>`` (EOS), then id ``byte + 3`` for every byte value
0..255. A multi-byte character is therefore split across 2-4 tokens, which is what the incremental
detokenizer has to cope with.

The model is a BPE over the GPT-2 byte-to-unicode alphabet with an empty merge list, so the
``tokenizers`` ByteLevel pre-tokenizer/decoder pair round-trips every byte string exactly.
Source: GPT-2 ``encoder.py`` (``bytes_to_unicode``), and the ``tokenizers`` ByteLevel components.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = (UNK_TOKEN, BOS_TOKEN, EOS_TOKEN)
NUM_SPECIAL_TOKENS = len(SPECIAL_TOKENS)
BOS_TOKEN_ID = 1
EOS_TOKEN_ID = 2
BYTE_VOCAB_SIZE = NUM_SPECIAL_TOKENS + 256


def bytes_to_unicode() -> dict[int, str]:
    """Return GPT-2's reversible map from each byte value (0..255) to a printable character.

    Printable Latin-1 bytes map to themselves; the other 68 bytes map to ``chr(256 + n)`` in
    byte order. Source: openai/gpt-2 ``src/encoder.py``.
    """
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    mapping = {byte: chr(byte) for byte in printable}
    num_shifted = 0
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(256 + num_shifted)
            num_shifted += 1
    return mapping


def build_byte_level_tokenizer() -> Tokenizer:
    """Build the dummy model's tokenizer (vocab size :data:`BYTE_VOCAB_SIZE`, 259).

    ``encode(text, add_special_tokens=True)`` prepends ``<s>`` (id 1) via a TemplateProcessing
    post-processor; ``decode`` maps ids back to bytes and decodes them as UTF-8, replacing an
    incomplete or invalid sequence with U+FFFD. Special-token strings that appear literally in
    the text (e.g. ``"</s>"``) are matched as the special token, as in every HF tokenizer.
    """
    vocab = {token: token_id for token_id, token in enumerate(SPECIAL_TOKENS)}
    for byte, char in bytes_to_unicode().items():
        vocab[char] = byte + NUM_SPECIAL_TOKENS
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
        special_tokens=[(BOS_TOKEN, BOS_TOKEN_ID)],
    )
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def write_byte_level_tokenizer(out_dir: Path, model_max_length: int) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` for the byte tokenizer to ``out_dir``.

    Creates ``out_dir`` if needed and overwrites existing files. ``model_max_length`` is the
    context length in tokens recorded in the config. The pair loads with
    ``transformers.PreTrainedTokenizerFast`` and with
    :class:`zerolayer.frontend.text.tokenizer.TextTokenizer`.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    build_byte_level_tokenizer().save(str(out_dir / "tokenizer.json"))
    config = {
        "add_bos_token": True,
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "unk_token": UNK_TOKEN,
        "model_max_length": model_max_length,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
