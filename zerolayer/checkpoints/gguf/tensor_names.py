"""GGUF tensor names and the transformers parameter names the forward reads them by.

GGUF names a layer's tensors ``blk.N.<name>.weight`` (``.bias``) and the others ``token_embd``,
``output_norm`` and ``output`` (ggml's ``docs/gguf.md``, gguf-py's ``TENSOR_NAMES``); the map of
each family is the reverse of llama.cpp's converter's (gguf-py's ``TensorNameMap``, checked by
the tests). Gemma 2 keeps its ``post_attention_layernorm`` apart (``post_attention_norm``) and
calls its pre-feed-forward norm ``ffn_norm``; Phi-3's ``ffn_up`` is its fused ``gate_up_proj``.
"""

from __future__ import annotations

import re

GLOBAL_NAMES = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
"""GGUF name -> transformers module of the tensors outside the layers."""
LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_qkv": "self_attn.qkv_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
"""GGUF name -> transformers module of a layer's tensors (``blk.N.`` / ``model.layers.N.``)."""
FAMILY_LAYER_NAMES: dict[str, dict[str, str]] = {
    "gemma2": {
        "post_attention_norm": "post_attention_layernorm",
        "ffn_norm": "pre_feedforward_layernorm",
        "post_ffw_norm": "post_feedforward_layernorm",
    },
    "phi3": {"ffn_up": "mlp.gate_up_proj"},
}
"""Per GGUF architecture, where its layer names differ from :data:`LAYER_NAMES`."""
ALWAYS_TIED = ("gemma", "gemma2")
"""Architectures whose LM head llama.cpp takes from ``token_embd`` whatever the file holds
(``llama_model_gemma2::load_arch_tensors``): their ``output.weight`` is not served."""
_LAYER_TENSOR = re.compile(r"^blk\.(?P<layer>\d+)\.(?P<name>[a-z_0-9]+)\.(?P<kind>weight|bias)$")
_GLOBAL_TENSOR = re.compile(r"^(?P<name>[a-z_]+)\.(?P<kind>weight|bias)$")


def layer_names(architecture: str) -> dict[str, str]:
    """The GGUF -> transformers layer tensor names of the GGUF ``architecture`` ("llama" ...)."""
    return {**LAYER_NAMES, **FAMILY_LAYER_NAMES.get(architecture, {})}


def transformers_name(gguf_name: str, architecture: str) -> str | None:
    """The transformers parameter name of the GGUF tensor ``gguf_name`` of ``architecture``
    (``blk.3.attn_q.weight`` -> ``model.layers.3.self_attn.q_proj.weight``); None for a tensor
    the forward has no name for (``rope_freqs.weight``, ...)."""
    match = _LAYER_TENSOR.match(gguf_name)
    if match:
        module = layer_names(architecture).get(match["name"])
        if module is None:
            return None
        return f"model.layers.{int(match['layer'])}.{module}.{match['kind']}"
    match = _GLOBAL_TENSOR.match(gguf_name)
    if match and match["name"] == "output" and architecture in ALWAYS_TIED:
        return None
    if match and match["name"] in GLOBAL_NAMES:
        return f"{GLOBAL_NAMES[match['name']]}.{match['kind']}"
    return None


def gguf_name(hf_name: str, architecture: str) -> str:
    """The GGUF name of the transformers parameter ``hf_name`` (the inverse of
    :func:`transformers_name`; what a writer of GGUF files names it).

    Raises:
        KeyError: a parameter GGUF has no name for in ``architecture``.
    """
    module, _, kind = hf_name.rpartition(".")
    for gguf_module, hf_module in GLOBAL_NAMES.items():
        if module == hf_module:
            return f"{gguf_module}.{kind}"
    match = re.match(r"^model\.layers\.(\d+)\.(.+)$", module)
    if match:
        inverse = {hf: g for g, hf in layer_names(architecture).items()}
        return f"blk.{match[1]}.{inverse[match[2]]}.{kind}"
    raise KeyError(hf_name)
