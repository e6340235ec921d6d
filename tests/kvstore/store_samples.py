"""A small kvstore for the kvstore tests: an 8-block arena of 4-token blocks over a one-layer
float32 model, with an injected clock."""

from __future__ import annotations

import json
from pathlib import Path

from zerolayer.common.config import KVStoreConfig
from zerolayer.kvstore.kv_store import KVStore
from zerolayer.sharing.manifest import HandleKind, TensorSpec, WeightManifest

BLOCK_SIZE = 4
NUM_BLOCKS = 8
BLOCK_BYTES = 2 * BLOCK_SIZE * 8 * 4
"""K and V x 1 layer x 4 tokens x 1 KV head x 8 dims x 4 bytes (float32)."""
LEASE_S = 3.0
PROMPT = list(range(10, 23))
"""13 tokens: three full blocks within the first 12."""


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_manifest() -> WeightManifest:
    config = {
        "vocab_size": 16,
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_hidden_layers": 1,
        "num_attention_heads": 1,
    }
    embed = TensorSpec("model.embed_tokens.weight", "F32", (16, 8), 0, 0, 512)
    return WeightManifest(
        "m", "", json.dumps(config), "", "", "", "fp", HandleKind.MMAP_FILE, (), (), (embed,), 0
    )


def make_store(
    tmp_path: Path, clock: Clock, num_blocks: int = NUM_BLOCKS, **settings: float
) -> KVStore:
    """A kvstore over a ``num_blocks``-block arena at ``tmp_path/arena.kv`` (reopened if it
    exists); ``settings``: other :class:`KVStoreConfig` fields (e.g. the pin budgets)."""
    config = KVStoreConfig(
        address="unix:/unused",
        loader_address="unix:/unused",
        shm_path=str(tmp_path / "arena.kv"),
        kv_cache_bytes=num_blocks * BLOCK_BYTES,
        block_size=BLOCK_SIZE,
        owner_lease_s=LEASE_S,
        **settings,
    )
    return KVStore(config, make_manifest(), clock=clock)
