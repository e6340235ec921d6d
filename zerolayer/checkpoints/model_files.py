"""Permissions of the model directories zerolayer writes (``convert-llama2c``, the dummy model).

A model is read by other users too: the compose containers run as uid 10001 and mount the
directory read-only. Files are therefore 0644 and directories this process creates 0755, whatever
the umask (and although safetensors writes 0600 files and ``mkdtemp`` makes 0700 directories).
"""

from __future__ import annotations

import os
from pathlib import Path

MODEL_FILE_NAMES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
)
"""The files of a model directory zerolayer writes."""
MODEL_FILE_MODE = 0o644
"""Mode of every file of a written model."""
MODEL_DIR_MODE = 0o755
"""Mode of every directory created for a written model."""


def make_model_dir(path: Path) -> None:
    """Creates ``path`` and its missing parents with ``MODEL_DIR_MODE``; directories that already
    exist keep their mode (``path`` may be a shared one such as ``/tmp``)."""
    missing = []
    parent = path
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    path.mkdir(parents=True, exist_ok=True)
    for directory in missing:
        os.chmod(directory, MODEL_DIR_MODE)


def share_model_files(model_dir: Path, names: tuple[str, ...] = MODEL_FILE_NAMES) -> None:
    """Gives the named files of ``model_dir`` ``MODEL_FILE_MODE``."""
    for name in names:
        os.chmod(model_dir / name, MODEL_FILE_MODE)
