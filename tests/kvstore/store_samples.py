"""A small kvstore for the kvstore tests: an 8-block arena of 4-token blocks over a one-layer
float32 model, with an injected clock; owners joining it and prompts cached in it."""

from __future__ import annotations

import json
from pathlib import Path

from zerolayer.common.config import KVStoreConfig
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import OwnerRef
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
    tmp_path: Path, clock: Clock, num_blocks: int = NUM_BLOCKS, **settings: float | bool
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


def join(store: KVStore, owner_id: str) -> OwnerRef:
    """Registers ``owner_id`` and reconciles it holding nothing: an owner that may act."""
    owner = OwnerRef(owner_id, store.owners.register(owner_id).epoch)
    store.reconcile([], owner)
    return owner


def cache_prompt(
    store: KVStore, owner: OwnerRef, prompt: list[int], salt: str = "", free: bool = True
) -> list[int]:
    """Allocates, commits (under ``salt``) and, if ``free``, frees the prompt's full blocks, as
    a finished request leaves them: cached, evictable."""
    num_full = len(prompt) // BLOCK_SIZE
    block_ids = store.allocate(num_full, owner)
    blocks = [tuple(prompt[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]) for i in range(num_full)]
    entries = [
        CommitEntry(b, block_ids[i - 1] if i else None, blocks[i], salt)
        for i, b in enumerate(block_ids)
    ]
    assert store.commit(entries, owner) == num_full
    if free:
        store.free(block_ids, owner)
    return block_ids


def pinned_store(
    tmp_path: Path, clock: Clock, fraction: float = 1.0, per: float = 1.0, **settings: bool
) -> KVStore:
    """The 8-block store with pin budgets ``fraction`` in all and ``per`` per namespace;
    ``settings``: other :class:`KVStoreConfig` fields (e.g. ``testing_pin_clock``)."""
    return make_store(
        tmp_path,
        clock,
        max_pinned_fraction=fraction,
        max_pinned_fraction_per_namespace=per,
        **settings,
    )
