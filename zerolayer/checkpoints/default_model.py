"""The default model: llama2.c's trained stories260K, shipped in the package, converted once.

``zerolayer up`` without ``--model`` serves it. The package holds the llama2.c files unchanged
(``data/stories260K/``: ``stories260K.bin``, ``tok512.bin``, MIT ``LICENSE``, provenance
``README.md``); the first use converts them (:func:`zerolayer.checkpoints.llama2c.convert_llama2c`)
into the user's cache. Source: Andrej Karpathy's llama2.c "tinyllamas" (TinyStories), MIT.
"""

from __future__ import annotations

from contextlib import ExitStack
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from zerolayer.checkpoints.llama2c import convert_llama2c
from zerolayer.checkpoints.model_cache import ensure_cached_model

DEFAULT_MODEL_NAME = "stories260K"
"""The default model's name (its folder under the package's ``data/``)."""
FORMAT_VERSION = 1
"""Bumped when the conversion's output changes, so cached copies are rewritten."""
CHECKPOINT_FILE = "stories260K.bin"
"""The llama2.c checkpoint (legacy version 0 format, float32)."""
TOKENIZER_FILE = "tok512.bin"
"""The llama2.c tokenizer of the checkpoint (512 pieces)."""


def embedded_files() -> Traversable:
    """The package folder holding the default model's llama2.c files, licence and provenance."""
    return resources.files("zerolayer.checkpoints") / "data" / DEFAULT_MODEL_NAME


def write_default_model(out_dir: Path) -> Path:
    """Converts the embedded llama2.c files into a Hugging Face directory ``out_dir``
    (files of :func:`zerolayer.checkpoints.llama2c.convert_llama2c`). Returns ``out_dir``.

    Raises:
        FileNotFoundError: the package lacks its data files (a broken install).
    """
    data = embedded_files()
    with ExitStack() as stack:  # a real file even for a package imported from a zip
        checkpoint = stack.enter_context(resources.as_file(data / CHECKPOINT_FILE))
        tokenizer = stack.enter_context(resources.as_file(data / TOKENIZER_FILE))
        convert_llama2c(checkpoint, tokenizer, out_dir)
    return out_dir


def ensure_default_model(cache_dir: Path | None = None) -> Path:
    """Returns the directory of the converted default model in the cache, converting it once.

    ``<cache_dir>/models/stories260K-v<FORMAT_VERSION>``; written into a temporary sibling and
    renamed into place, so concurrent first runs never see a half-written directory
    (:func:`zerolayer.checkpoints.model_cache.ensure_cached_model`).

    Args:
        cache_dir: None: ``$XDG_CACHE_HOME/zerolayer`` or ``~/.cache/zerolayer``.

    Raises:
        OSError: the cache cannot be written, or the package lacks its data files.
    """
    return ensure_cached_model(
        f"{DEFAULT_MODEL_NAME}-v{FORMAT_VERSION}", write_default_model, cache_dir
    )
