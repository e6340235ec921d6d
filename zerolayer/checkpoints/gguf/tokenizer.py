"""A GGUF file's tokenizer and chat template as the tokenizer.json and tokenizer_config.json
texts of a Hugging Face directory (what the frontend reads: zerolayer.frontend.text.tokenizer,
chat_template)."""

from __future__ import annotations

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.bpe_tokenizer import bpe_tokenizer
from zerolayer.checkpoints.gguf.metadata import Metadata
from zerolayer.checkpoints.gguf.spm_tokenizer import spm_tokenizer

TOKENIZER_MODELS = {"llama": spm_tokenizer, "gpt2": bpe_tokenizer}
"""``tokenizer.ggml.model`` -> its conversion."""


def tokenizer_files(meta: Metadata, model_max_length: int) -> tuple[str, str]:
    """(tokenizer.json, tokenizer_config.json) texts of the file's ``tokenizer.ggml.*`` and
    ``tokenizer.chat_template``.

    Args:
        model_max_length: the context length, tokens (tokenizer_config.json's).

    Raises:
        CheckpointError: one line naming the key: a tokenizer model other than "llama" and
            "gpt2", or a missing or malformed ``tokenizer.*`` key.
    """
    model = meta.string("tokenizer.ggml.model")
    convert = TOKENIZER_MODELS.get(model)
    if convert is None:
        raise CheckpointError(
            f"metadata key 'tokenizer.ggml.model' is {model!r}, a tokenizer zerolayer does not "
            f"serve (served: {', '.join(TOKENIZER_MODELS)})"
        )
    try:
        tokenizer, vocabulary = convert(meta)
    except Exception as exc:  # tokenizers raises a bare Exception on a bad vocabulary
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f"metadata key 'tokenizer.ggml.tokens': {exc}") from None
    template = meta.string("tokenizer.chat_template", "")
    return tokenizer.to_str(), vocabulary.tokenizer_config_json(template, model_max_length)
