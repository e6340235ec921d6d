"""GGUF files quantized by llama.cpp's own quantizer (``llama_model_quantize``, what the
``llama-quantize`` tool runs), through llama-cpp-python's binding: the Q8_0 and Q4_K_M files people
download are made this way, so zerolayer and llama.cpp are compared on exactly such a file.

The source is the checkpoint's F32 GGUF (:func:`benchmarks.llamacpp.gguf_export.ensure_gguf`):
a bfloat16 checkpoint widened to float32 loses nothing, so quantizing it equals quantizing the
BF16 file. Source: llama.h (``llama_model_quantize``, ``llama_ftype``) and llama.cpp's
``tools/quantize`` of the version llama-cpp-python vendors.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

from benchmarks.llamacpp.gguf_export import ensure_gguf

LLAMA_FTYPES = {"q8_0": 7, "q4_k_m": 15}
"""llama.cpp's ``llama_ftype`` of each file type made here (``LLAMA_FTYPE_MOSTLY_Q8_0``,
``LLAMA_FTYPE_MOSTLY_Q4_K_M``): every 2-D tensor quantized, the mix of types llama.cpp's
quantizer chooses for Q4_K_M (Q4_K, with Q6_K for some attn_v/ffn_down and the output)."""


def quantize_gguf(source: Path, out_path: Path, file_type: str, num_threads: int = 0) -> Path:
    """Writes ``source`` quantized to ``file_type`` (a key of :data:`LLAMA_FTYPES`) as
    ``out_path``, through a temporary sibling renamed into place.

    Raises:
        ValueError: an unknown ``file_type``.
        ImportError: llama-cpp-python is not installed.
        RuntimeError: llama.cpp's quantizer failed.
    """
    import llama_cpp

    if file_type not in LLAMA_FTYPES:
        raise ValueError(f"file_type {file_type!r}: one of {', '.join(LLAMA_FTYPES)}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = LLAMA_FTYPES[file_type]
    params.nthread = num_threads
    tmp = out_path.with_name(out_path.name + ".tmp")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    rc = llama_cpp.llama_model_quantize(
        str(source).encode(), str(tmp).encode(), ctypes.byref(params)
    )
    if rc != 0:
        tmp.unlink(missing_ok=True)
        raise RuntimeError(f"llama_model_quantize({source}, {file_type}) returned {rc}")
    tmp.replace(out_path)
    return out_path


def ensure_quantized(model_dir: Path, cache_dir: Path, file_type: str) -> Path:
    """``<cache_dir>/<model dir name>-<file_type>-llama-quantize.gguf``, made by
    :func:`quantize_gguf` from the F32 GGUF when missing or older than that file."""
    source = ensure_gguf(model_dir, cache_dir, "f32")
    path = cache_dir / f"{model_dir.name}-{file_type}-llama-quantize.gguf"
    if path.exists() and path.stat().st_mtime >= source.stat().st_mtime:
        return path
    return quantize_gguf(source, path, file_type)
