"""The tensors a model config needs, and the refusal of checkpoints that do not provide them.

Runs on safetensors headers only (no tensor data), in the loader and in ``zerolayer up``'s
pre-flight, so that a checkpoint the forward cannot run is refused before any layer starts.
"""

from __future__ import annotations

import json

from zerolayer.checkpoints.checkpoint import CheckpointError
from zerolayer.checkpoints.dtypes import itemsize, torch_name
from zerolayer.checkpoints.gguf.tensor_names import gguf_name
from zerolayer.checkpoints.gguf.tensor_types import SERVED_TYPES, is_quantized, tensor_nbytes
from zerolayer.checkpoints.int8_format import is_quantized_name, scale_name
from zerolayer.checkpoints.model_config import FLOAT_DTYPES, ZEROLAYER_KEY, ModelConfig
from zerolayer.sharing.manifest import TensorSpec, WeightManifest

EMBED = "model.embed_tokens.weight"


def expected_tensors(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the forward reads (transformers' parameter names)."""
    c = config
    shapes: dict[str, tuple[int, ...]] = {
        EMBED: (c.vocab_size, c.hidden_size),
        "model.norm.weight": (c.hidden_size,),
    }
    if not c.tie_word_embeddings or c.int8_group_size is not None:
        # NOTE: zerolayer quantize writes an int8 lm_head.weight for tied embeddings too.
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_hidden_layers):
        shapes.update(_layer_tensors(c, f"model.layers.{i}."))
    return shapes


def _layer_tensors(c: ModelConfig, p: str) -> dict[str, tuple[int, ...]]:
    q_dim = c.num_attention_heads * c.head_dim
    shapes: dict[str, tuple[int, ...]] = {
        p + "input_layernorm.weight": (c.hidden_size,),
        p + "post_attention_layernorm.weight": (c.hidden_size,),
        p + "self_attn.o_proj.weight": (c.hidden_size, q_dim),
        p + "mlp.down_proj.weight": (c.hidden_size, c.intermediate_size),
    }
    attn, mlp = p + "self_attn.", p + "mlp."
    if c.fused_projections:
        shapes[attn + "qkv_proj.weight"] = (q_dim + 2 * c.kv_dim, c.hidden_size)
        shapes[mlp + "gate_up_proj.weight"] = (2 * c.intermediate_size, c.hidden_size)
    else:
        for name, rows in (("q_proj", q_dim), ("k_proj", c.kv_dim), ("v_proj", c.kv_dim)):
            shapes[f"{attn}{name}.weight"] = (rows, c.hidden_size)
            if c.qkv_bias:
                shapes[f"{attn}{name}.bias"] = (rows,)
        for name in ("gate_proj", "up_proj"):
            shapes[f"{mlp}{name}.weight"] = (c.intermediate_size, c.hidden_size)
            if c.mlp_bias:
                shapes[f"{mlp}{name}.bias"] = (c.intermediate_size,)
    if c.o_bias:
        shapes[attn + "o_proj.bias"] = (c.hidden_size,)
    if c.mlp_bias:
        shapes[mlp + "down_proj.bias"] = (c.hidden_size,)
    if c.sandwich_norms:
        shapes[p + "pre_feedforward_layernorm.weight"] = (c.hidden_size,)
        shapes[p + "post_feedforward_layernorm.weight"] = (c.hidden_size,)
    if c.qk_norm:
        shapes[attn + "q_norm.weight"] = (c.head_dim,)
        shapes[attn + "k_norm.weight"] = (c.head_dim,)
    return shapes


def compute_dtype(manifest: WeightManifest, config: ModelConfig) -> str:
    """The dtype the forward runs in, as transformers' ``dtype="auto"`` picks it: config.json's
    ``dtype`` (or ``torch_dtype``), else the embedding's (a torch name such as "bfloat16").

    Raises:
        CheckpointError: the checkpoint has no embedding.
    """
    if config.dtype is not None:
        return config.dtype
    for tensor in manifest.tensors:
        if tensor.name == EMBED:
            return torch_name(tensor.dtype)
    raise CheckpointError(f"checkpoint: missing tensor {EMBED!r}")


def check_weights(manifest: WeightManifest, config: ModelConfig, dtype: str = "auto") -> None:
    """Refuses a checkpoint whose tensors the forward cannot use as they are stored, or the
    compute dtype ``dtype`` asked for (``--dtype``) where it is not the checkpoint's.

    Tensors the forward does not read are ignored (transformers ignores unexpected keys too). An
    ``lm_head.weight`` is read even with ``tie_word_embeddings`` (see ``LlamaModel``), so it is
    checked then too.
    Matrices must be stored in the compute dtype (they are used in place, never converted);
    vectors (norms, biases) may be stored in another float dtype and are cast per use, which
    equals transformers casting them once at load. In an int8 checkpoint
    (``config.int8_group_size``) the projections and the LM head are int8 with float32 scales
    (:mod:`zerolayer.checkpoints.int8_format`). In a GGUF file (:func:`gguf_architecture`) a
    matrix is F32, F16, BF16 or of a quantized GGUF type (the forward converts per use), with
    the bytes its type and shape take; a vector is F32, F16 or BF16; messages name the tensor
    by its GGUF name too.

    Raises:
        CheckpointError: one line naming the first tensor that is missing, has another shape than
            the config implies, a dtype other than float32/float16/bfloat16, a matrix dtype other
            than the compute dtype, or data not aligned to its element size (torch views need it);
            in an int8 checkpoint, a quantized weight that is not int8 or whose scales are
            missing or not float32 [N, K / group_size]; a ``dtype`` other than "auto" and the
            compute dtype.
    """
    computes_in = compute_dtype(manifest, config)
    gguf_arch = gguf_architecture(manifest)
    if dtype not in ("auto", computes_in):
        kind = "GGUF file read for another --dtype" if gguf_arch else "safetensors checkpoint"
        raise CheckpointError(
            f"--dtype {dtype}: this {kind} computes in {computes_in} (a safetensors checkpoint "
            "is served in its stored dtype: --dtype auto)"
        )
    by_name = {t.name: t for t in manifest.tensors}
    expected = expected_tensors(config)
    if config.tie_word_embeddings and "lm_head.weight" in by_name:
        # NOTE: read in place of the embedding (see LlamaModel), as transformers does.
        expected.setdefault("lm_head.weight", (config.vocab_size, config.hidden_size))
    for name, shape in expected.items():
        tensor = by_name.get(name)
        where = _gguf_where(name, gguf_arch)
        try:
            if tensor is None:
                raise CheckpointError(f"checkpoint: missing tensor {name!r}{_tie_hint(name)}")
            if config.int8_group_size is not None and is_quantized_name(name):
                _check_int8(by_name, tensor, shape, config.int8_group_size)
            elif gguf_arch:
                _check_gguf_tensor(tensor, shape)
            else:
                _check_tensor(tensor, shape, computes_in)
        except CheckpointError as exc:
            raise CheckpointError(f"{exc}{where}") from None


def gguf_architecture(manifest: WeightManifest) -> str:
    """The GGUF architecture of a manifest read from a GGUF file ("llama" ...; its config's
    ``zerolayer`` key says it), else ""."""
    config = json.loads(manifest.config_json) if manifest.config_json.strip() else {}
    facts = config.get(ZEROLAYER_KEY) if isinstance(config, dict) else None
    return str(facts.get("gguf_architecture", "")) if isinstance(facts, dict) else ""


def _gguf_where(name: str, gguf_arch: str) -> str:
    """ " (GGUF 'blk.0.attn_q.weight')" for a tensor of a GGUF file; "" otherwise."""
    if not gguf_arch:
        return ""
    try:
        return f" (GGUF {gguf_name(name, gguf_arch)!r})"
    except KeyError:
        return ""


def _check_gguf_tensor(tensor: TensorSpec, shape: tuple[int, ...]) -> None:
    """A GGUF tensor: its shape, a served type (quantized for matrices only) and its bytes."""
    name = tensor.name
    if tuple(tensor.shape) != shape:
        raise CheckpointError(
            f"checkpoint: tensor {name!r} has shape {list(tensor.shape)}, the metadata implies "
            f"{list(shape)}"
        )
    if tensor.dtype not in SERVED_TYPES or (is_quantized(tensor.dtype) and len(shape) < 2):
        served = "F32, F16, BF16" if len(shape) < 2 else ", ".join(SERVED_TYPES)
        raise CheckpointError(
            f"checkpoint: tensor {name!r} has type {tensor.dtype} (served: {served})"
        )
    served = SERVED_TYPES[tensor.dtype]
    if shape[-1] % served.block_size or tensor.nbytes != tensor_nbytes(tensor.dtype, shape):
        raise CheckpointError(
            f"checkpoint: tensor {name!r} holds {tensor.nbytes} bytes; {tensor.dtype} "
            f"{list(shape)} takes whole blocks of {served.block_size} weights, "
            f"{served.type_size} bytes each"
        )
    if tensor.offset_bytes % served.type_size and not served.quantized:
        raise CheckpointError(
            f"checkpoint: tensor {name!r} data at byte {tensor.offset_bytes} is not aligned to "
            f"its {served.type_size}-byte elements"
        )


def _check_int8(
    by_name: dict[str, TensorSpec], tensor: TensorSpec, shape: tuple[int, ...], group_size: int
) -> None:
    name = tensor.name
    if tensor.dtype != "I8":
        raise CheckpointError(
            f"checkpoint: tensor {name!r} has dtype {tensor.dtype}, the quantization_config "
            "implies I8"
        )
    if tuple(tensor.shape) != shape or shape[1] % group_size:
        raise CheckpointError(
            f"checkpoint: tensor {name!r} has shape {list(tensor.shape)}, the config implies "
            f"{list(shape)} with K a multiple of group_size {group_size}"
        )
    scales = by_name.get(scale_name(name))
    scale_shape = (shape[0], shape[1] // group_size)
    if scales is None:
        raise CheckpointError(f"checkpoint: missing tensor {scale_name(name)!r} (int8 scales)")
    if scales.dtype != "F32" or tuple(scales.shape) != scale_shape:
        raise CheckpointError(
            f"checkpoint: tensor {scales.name!r} is {scales.dtype} {list(scales.shape)}, the "
            f"quantization_config implies F32 {list(scale_shape)}"
        )
    if scales.offset_bytes % 4:
        raise CheckpointError(
            f"checkpoint: tensor {scales.name!r} data at byte {scales.offset_bytes} is not "
            "aligned to its 4-byte elements"
        )


def _check_tensor(tensor: TensorSpec, shape: tuple[int, ...], dtype: str) -> None:
    name = tensor.name
    if tuple(tensor.shape) != shape:
        raise CheckpointError(
            f"checkpoint: tensor {name!r} has shape {list(tensor.shape)}, the config implies "
            f"{list(shape)}"
        )
    stored = torch_name(tensor.dtype)
    if stored not in FLOAT_DTYPES:
        raise CheckpointError(
            f"checkpoint: tensor {name!r} has dtype {tensor.dtype} (supported: F32, F16, BF16)"
        )
    if len(shape) > 1 and stored != dtype:
        raise CheckpointError(
            f"checkpoint: tensor {name!r} is stored as {stored}, the model computes in {dtype} "
            "(matrices are used in place, never converted)"
        )
    if tensor.offset_bytes % itemsize(tensor.dtype):
        raise CheckpointError(
            f"checkpoint: tensor {name!r} data at byte {tensor.offset_bytes} is not aligned to "
            f"its {itemsize(tensor.dtype)}-byte elements"
        )


def _tie_hint(name: str) -> str:
    if name == "lm_head.weight":
        return " (config.json says tie_word_embeddings=false)"
    return ""
