"""A GGUF file's vocabulary (``tokenizer.ggml.*``) and what both tokenizer kinds build from it:
the added tokens, the BOS/EOS post-processor and tokenizer_config.json.

Token types are llama.cpp's (``llama_token_type``, gguf-py's ``TokenType``): CONTROL (``<s>``,
``<|im_end|>``) and UNKNOWN tokens become special added tokens, USER_DEFINED ones added tokens
that are not special, as transformers' tokenizers hold them; both are matched in the text before
the model splits it, as llama.cpp's ``tokenizer_st_partition`` does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from gguf import TokenType
from tokenizers import AddedToken, Tokenizer, processors

from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.gguf.metadata import Metadata

SPECIAL_TYPES = (TokenType.CONTROL, TokenType.UNKNOWN)
"""Token types added as special tokens."""


@dataclass(frozen=True)
class Vocabulary:
    """The tokens of a GGUF file, by id, and the special-token rules."""

    tokens: list[str]
    types: list[int]
    """Per id, a ``TokenType`` (NORMAL when the file has no ``tokenizer.ggml.token_type``)."""
    bos_token_id: int | None
    eos_token_id: int | None
    unk_token_id: int | None
    pad_token_id: int | None
    add_bos: bool
    add_eos: bool

    @classmethod
    def read(
        cls, meta: Metadata, add_bos_default: bool, special_defaults: dict[str, int]
    ) -> Vocabulary:
        """The vocabulary of ``meta``.

        Args:
            add_bos_default: whether BOS is added when ``tokenizer.ggml.add_bos_token`` is absent
                (llama.cpp's default of the tokenizer kind).
            special_defaults: ids of "bos", "eos", "unk" when their keys are absent.

        Raises:
            CheckpointError: a missing or mistyped key, types of another length than the
                tokens, or a special id outside the vocabulary (the message names the key).
        """
        tokens = meta.array("tokenizer.ggml.tokens", str)
        types = meta.array("tokenizer.ggml.token_type", int, [TokenType.NORMAL] * len(tokens))
        if len(types) != len(tokens):
            raise CheckpointError(
                f"metadata key 'tokenizer.ggml.token_type' has {len(types)} items for "
                f"{len(tokens)} tokens"
            )
        ids = {}
        for kind in ("bos", "eos", "unknown", "padding"):
            key = f"tokenizer.ggml.{kind}_token_id"
            token_id = meta.integer(key, special_defaults.get(kind[:3]))
            if token_id is not None and not 0 <= token_id < len(tokens):
                raise CheckpointError(f"metadata key {key!r} is {token_id}, not a token id")
            ids[kind] = token_id
        return cls(
            tokens,
            types,
            ids["bos"],
            ids["eos"],
            ids["unknown"],
            ids["padding"],
            meta.boolean("tokenizer.ggml.add_bos_token", add_bos_default),
            meta.boolean("tokenizer.ggml.add_eos_token", False),
        )

    def vocab(self) -> dict[str, int]:
        """Token text -> id (the first id of a text that appears twice)."""
        vocab: dict[str, int] = {}
        for i, token in enumerate(self.tokens):
            vocab.setdefault(token, i)
        return vocab

    def add_tokens_to(self, tokenizer: Tokenizer) -> None:
        """Adds the CONTROL, UNKNOWN (special) and USER_DEFINED (not special) tokens, their text
        taken as it is (not normalized)."""
        added = [
            AddedToken(token, special=kind in SPECIAL_TYPES, normalized=False)
            for token, kind in zip(self.tokens, self.types, strict=True)
            if kind in (*SPECIAL_TYPES, TokenType.USER_DEFINED)
        ]
        tokenizer.add_tokens(added)

    def post_processor(self) -> processors.TemplateProcessing | None:
        """BOS before and EOS after the text, as ``add_bos``/``add_eos`` say; None: neither."""
        before = [self.bos_token_id] if self.add_bos and self.bos_token_id is not None else []
        after = [self.eos_token_id] if self.add_eos and self.eos_token_id is not None else []
        if not before and not after:
            return None
        ids = before + after
        single = " ".join(
            [*(self.tokens[i] for i in before), "$A", *(self.tokens[i] for i in after)]
        )
        pair = f"{single} {single.replace('$A', '$B:1')}"
        return processors.TemplateProcessing(
            single=single,
            pair=pair,
            special_tokens=[(self.tokens[i], i) for i in dict.fromkeys(ids)],
        )

    def tokenizer_config_json(self, chat_template: str, model_max_length: int) -> str:
        """tokenizer_config.json as the frontend reads it: the BOS/EOS rules, the special tokens
        by text and the chat template."""
        config: dict = {
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "model_max_length": model_max_length,
            "tokenizer_class": "PreTrainedTokenizerFast",
            "clean_up_tokenization_spaces": False,
        }
        for name, token_id in (
            ("bos_token", self.bos_token_id),
            ("eos_token", self.eos_token_id),
            ("unk_token", self.unk_token_id),
            ("pad_token", self.pad_token_id),
        ):
            if token_id is not None:
                config[name] = self.tokens[token_id]
        if chat_template:
            config["chat_template"] = chat_template
        return json.dumps(config, indent=2, ensure_ascii=False) + "\n"
