"""The KV arena's geometry: every layer's K and V blocks in one array.

Layout (C-contiguous): ``[num_layers, 2 (K, V), num_blocks, block_size, num_kv_heads, head_dim]``
of ``dtype``, so that the K (or V) cache of one layer is a contiguous
``[num_blocks, block_size, num_kv_heads, head_dim]`` array, the paged layout of vLLM
(Kwon et al. 2023, "Efficient Memory Management for LLM Serving with PagedAttention"). The kvstore
creates the arena in this layout; every scheduler maps it in the same one.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from zerolayer.checkpoints.dtypes import itemsize
from zerolayer.checkpoints.model_config import ModelConfig
from zerolayer.sharing.manifest import WeightManifest, model_dtype_name


@dataclass(frozen=True)
class ArenaLayout:
    """Geometry of a KV arena."""

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    """Tokens per block."""
    dtype: str
    """Safetensors dtype name of the elements."""
    num_blocks: int

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return itemsize(self.dtype)

    @property
    def block_bytes(self) -> int:
        """Bytes of one block across all layers, K and V."""
        return (
            2
            * self.num_layers
            * self.block_size
            * self.num_kv_heads
            * self.head_dim
            * self.itemsize
        )

    @property
    def size_bytes(self) -> int:
        """Bytes of the whole arena."""
        return self.block_bytes * self.num_blocks

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of the arena as one tensor."""
        return (
            self.num_layers,
            2,
            self.num_blocks,
            self.block_size,
            self.num_kv_heads,
            self.head_dim,
        )


def blocks_for_bytes(kv_cache_bytes: int, layout_without_blocks: ArenaLayout) -> int:
    """Number of whole blocks that fit in ``kv_cache_bytes``."""
    per_block = layout_without_blocks.block_bytes
    return kv_cache_bytes // per_block


def model_arena_layout(
    manifest: WeightManifest, block_size: int, kv_cache_bytes: int
) -> ArenaLayout:
    """The arena geometry for the manifest's model: whole blocks of ``block_size`` tokens in
    ``kv_cache_bytes`` (``num_blocks`` is 0 when not even one fits). Builds nothing per block."""
    model = ModelConfig.from_json(manifest.config_json, manifest.generation_config_json)
    shape = ArenaLayout(
        num_layers=model.num_hidden_layers,
        num_kv_heads=model.num_key_value_heads,
        head_dim=model.head_dim,
        block_size=block_size,
        dtype=model_dtype_name(manifest),
        num_blocks=0,
    )
    return dataclasses.replace(shape, num_blocks=blocks_for_bytes(kv_cache_bytes, shape))
