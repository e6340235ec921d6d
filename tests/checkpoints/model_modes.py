"""The modes a written model directory must have (checked by the writers' tests)."""

from __future__ import annotations

import stat
from pathlib import Path


def modes(model_dir: Path) -> dict[str, int]:
    """Permission bits of the directory (key ".") and of each of its files."""
    entries = {".": model_dir, **{p.name: p for p in model_dir.iterdir()}}
    return {name: stat.S_IMODE(path.stat().st_mode) for name, path in entries.items()}


MODEL_MODES = {
    ".": 0o755,
    "config.json": 0o644,
    "generation_config.json": 0o644,
    "model.safetensors": 0o644,
    "tokenizer.json": 0o644,
    "tokenizer_config.json": 0o644,
}
"""A written model directory: readable by every user (the compose containers' uid 10001)."""
