"""``zerolayer quantize``: rewrites a checkpoint's linear weights as int8 (format:
:mod:`zerolayer.checkpoints.int8_format`).

Reads the safetensors files one tensor at a time, writes one ``model.safetensors``, config.json
with a ``quantization_config``, and copies the tokenizer, generation and chat-template files.
"""

from __future__ import annotations

import json
import secrets
import shutil
from pathlib import Path

from zerolayer.checkpoints.checkpoint import weight_files
from zerolayer.checkpoints.errors import CheckpointError
from zerolayer.checkpoints.int8_format import (
    is_quantized_name,
    quantization_config,
    quantize_weight,
    scale_name,
)
from zerolayer.checkpoints.model_files import MODEL_DIR_MODE, make_model_dir, share_model_files
from zerolayer.checkpoints.shard_index import read_weight_map

COPIED_PATTERNS = (
    "generation_config.json",
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template*",
    "vocab.json",
    "merges.txt",
)
"""Files of the source directory copied as they are (tokenizer, generation, chat template)."""
FLOAT_DTYPES = ("F32", "F16", "BF16")
"""Safetensors dtypes of the weights that can be quantized."""


class QuantizeError(CheckpointError):
    """The source cannot be quantized, or the destination cannot be written (one line)."""


def quantize_checkpoint(src: Path, dst: Path, group_size: int = 32) -> None:
    """Writes to ``dst`` an int8 copy of the checkpoint in ``src``.

    Every projection weight of the decoder layers (q/k/v/o, gate/up/down, fused qkv/gate_up) and
    the LM head become int8 [N, K] with float32 scales [N, K / group_size] (symmetric, one scale
    per ``group_size`` consecutive K elements, as llama.cpp's Q8_0). A checkpoint with tied
    embeddings gets an int8 ``lm_head.weight`` made from the embedding (the forward reads an
    ``lm_head.weight`` when there is one). Embeddings, norms and biases are copied unchanged.

    Raises:
        QuantizeError: ``src`` is not a model directory or holds no safetensors, is already
            quantized, has a weight of a non-float dtype or a K not divisible by
            ``group_size``; ``group_size`` is not positive; ``dst`` is ``src`` or a non-empty
            directory; a file of ``src`` cannot be read or is not valid safetensors.
        OSError: ``dst`` cannot be written (nothing is left there: the copy is written into a
            hidden sibling of ``dst`` and renamed into place).
    """
    config = _source_config(src)
    if group_size < 1:
        raise QuantizeError(f"--group-size must be positive, got {group_size}")
    if dst.exists() and (not dst.is_dir() or any(dst.iterdir())):
        raise QuantizeError(f"{dst}: exists and is not an empty directory")
    tensors = _quantized_tensors(src, group_size, bool(config.get("tie_word_embeddings")))
    from safetensors.torch import save_file

    make_model_dir(dst.parent)
    # NOTE: written into a hidden sibling and renamed into place, so a failure or an interrupt
    # (KeyboardInterrupt, SystemExit) leaves no half-written model directory behind. The name is
    # chosen before the directory is made inside the try: an interrupt between the two (a
    # SIGTERM as it appears) still finds it to remove.
    staging = dst.parent / f".{dst.name}.partial-{secrets.token_hex(6)}"
    try:
        staging.mkdir(mode=0o700)
        config["quantization_config"] = quantization_config(group_size)
        (staging / "config.json").write_text(json.dumps(config, indent=2))
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        copied = _copy_side_files(src, staging)
        share_model_files(staging, ("config.json", "model.safetensors", *copied))
        staging.chmod(MODEL_DIR_MODE)
        if dst.is_dir():
            dst.rmdir()
        staging.rename(dst)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _source_config(src: Path) -> dict:
    if not src.is_dir():
        raise QuantizeError(f"{src}: not a directory")
    try:
        config = json.loads((src / "config.json").read_text())
    except FileNotFoundError:
        raise QuantizeError(f"{src}: no config.json") from None
    except json.JSONDecodeError as exc:
        raise QuantizeError(f"{src}/config.json: {exc}") from None
    except OSError as exc:
        raise QuantizeError(f"{src}/config.json: {exc.strerror or exc}") from None
    if not isinstance(config, dict):
        raise QuantizeError(f"{src}/config.json: not a JSON object")
    quantization = config.get("quantization_config")
    if quantization is not None:
        method = quantization.get("quant_method", "?") if isinstance(quantization, dict) else "?"
        raise QuantizeError(f"{src}: already quantized (quantization_config {method!r})")
    return config


def _quantized_tensors(src: Path, group_size: int, tied: bool) -> dict:
    from safetensors import safe_open

    out = {}
    for path in weight_files(src, read_weight_map(src)):
        try:
            with safe_open(str(path), framework="pt") as f:
                for name in f.keys():
                    tensor = f.get_tensor(name)
                    out.update(_converted(name, tensor, group_size))
        except QuantizeError:
            raise
        except OSError as exc:
            raise QuantizeError(f"{path}: {exc.strerror or exc}") from None
        except Exception as exc:  # safetensors' SafetensorError: a truncated or corrupt file
            raise QuantizeError(f"{path}: {exc}") from None
    if tied and "lm_head.weight" not in out and "model.embed_tokens.weight" in out:
        out.update(_converted("lm_head.weight", out["model.embed_tokens.weight"], group_size))
    return out


def _converted(name: str, tensor: object, group_size: int) -> dict:
    import torch

    assert isinstance(tensor, torch.Tensor)
    if not is_quantized_name(name):
        return {name: tensor.contiguous()}
    if tensor.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise QuantizeError(
            f"tensor {name!r} has dtype {tensor.dtype} (quantizable: {', '.join(FLOAT_DTYPES)})"
        )
    if tensor.dim() != 2 or tensor.shape[1] % group_size:
        raise QuantizeError(
            f"tensor {name!r} of shape {list(tensor.shape)}: K={tensor.shape[-1]} is not a "
            f"multiple of --group-size {group_size}"
        )
    q, scales = quantize_weight(tensor, group_size)
    return {name: q, scale_name(name): scales}


def _copy_side_files(src: Path, dst: Path) -> list[str]:
    copied = []
    for pattern in COPIED_PATTERNS:
        for path in sorted(src.glob(pattern)):
            if path.is_file():
                shutil.copyfile(path, dst / path.name)
                copied.append(path.name)
    return copied
