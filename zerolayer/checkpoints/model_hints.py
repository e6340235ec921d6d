"""What to do about a ``--model`` that is not a Hugging Face model directory: the hint that ends
the one-line error of :func:`zerolayer.checkpoints.checkpoint.read_checkpoint`.

Three mistakes get one: a llama2.c checkpoint (a ``.bin`` file, or a folder of them), which
``zerolayer convert-llama2c`` turns into a directory; a Hugging Face hub id (``owner/name``),
which zerolayer does not download; and a hub cache folder (``models--owner--name``), whose model
directory is one of its ``snapshots/<commit>``.
"""

from __future__ import annotations

import re
from pathlib import Path

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
"""``owner/name`` as the Hugging Face hub spells a repository id."""
CONVERT = "zerolayer convert-llama2c MODEL.bin TOKENIZER.bin OUT_DIR, then --model OUT_DIR"


def model_dir_hint(given: str | Path) -> str:
    """The hint for a ``--model`` that is missing or holds no ``config.json``: ``" (...)"`` to
    append to the error line, or "" when none applies.

    Args:
        given: the path as the user wrote it (before it is made absolute: a hub id is told by its
            spelling).
    """
    path = Path(given)
    if path.is_file() and path.suffix == ".bin" or path.is_dir() and any(path.glob("*.bin")):
        return f" (a llama2.c checkpoint? convert it first: {CONVERT})"
    if path.is_dir() and (path / "snapshots").is_dir():
        return f" (a Hugging Face cache folder: give one of its snapshots, {path}/snapshots/COMMIT)"
    text = str(given)
    if not path.exists() and not text.startswith((".", "/", "~")) and HUB_ID.fullmatch(text):
        return (
            f" (zerolayer does not download models; to serve the hub's {text}, fetch it first: "
            f"hf download {text} --local-dir DIR (huggingface_hub's CLI; older: "
            f"huggingface-cli download), then --model DIR)"
        )
    return ""
