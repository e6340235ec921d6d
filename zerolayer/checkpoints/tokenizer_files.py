"""The model directory's tokenizer files checked as the frontend will read them, so that
``zerolayer up`` refuses a broken one in one line before any layer starts (the frontend builds
its tokenizer from the same text: zerolayer.frontend.text.tokenizer)."""

from __future__ import annotations

import json
from typing import Any

from zerolayer.checkpoints.errors import CheckpointError


def check_tokenizer_files(tokenizer_json: str, tokenizer_config_json: str = "") -> None:
    """Checks the text of tokenizer.json (JSON that Hugging Face ``tokenizers`` builds a
    tokenizer from) and of tokenizer_config.json (a JSON object, when present).

    Raises:
        CheckpointError: which file, and why.
    """
    from tokenizers import Tokenizer  # NOTE: here: up imports it only for this check

    try:
        json.loads(tokenizer_json)
        Tokenizer.from_str(tokenizer_json)
    except Exception as exc:  # tokenizers raises a bare Exception on a bad schema
        raise CheckpointError(f"tokenizer.json: not a valid tokenizer: {exc}") from None
    try:
        parse_tokenizer_config(tokenizer_config_json)
    except ValueError as exc:
        message = str(exc).replace("tokenizer_config_json", "tokenizer_config.json")
        raise CheckpointError(message) from None


def parse_tokenizer_config(tokenizer_config_json: str) -> dict[str, Any]:
    """tokenizer_config.json's object ({} for empty text).

    Raises:
        ValueError: not valid JSON, or not a JSON object.
    """
    if not tokenizer_config_json.strip():
        return {}
    try:
        config = json.loads(tokenizer_config_json)
    except json.JSONDecodeError as exc:
        raise ValueError(f"tokenizer_config_json: invalid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise ValueError("tokenizer_config_json: must be a JSON object")
    return config
