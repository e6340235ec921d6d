"""Tests for PrefixCache: exact hits over chained block hashes, LRU eviction of freed blocks,
cache-salt and fingerprint isolation, and collisions that never share KV."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np
import pytest
import xxhash

from zerolayer.common.errors import InvalidArgument, ResourceExhausted
from zerolayer.kv.commit import CommitEntry
from zerolayer.kvstore.prefix_cache import (
    ROOT_HASH,
    BlockKey,
    HashFn,
    PrefixCache,
    PrefixCacheStats,
    xxh3_128,
)

BLOCK_SIZE = 4
A = list(range(10, 22))
"""Three full blocks of tokens."""
B = list(range(50, 62))
"""Three full blocks sharing nothing with A."""


def make_cache(
    num_blocks: int = 8,
    fingerprint: str = "model-a",
    enabled: bool = True,
    hash_fn: HashFn = xxh3_128,
) -> PrefixCache:
    return PrefixCache(num_blocks, BLOCK_SIZE, fingerprint, enabled, hash_fn)


def make_entries(
    block_ids: Sequence[int], token_ids: Sequence[int], salt: str = ""
) -> list[CommitEntry]:
    """One entry per full block of ``token_ids``, chained in order through ``block_ids``."""
    return [
        CommitEntry(
            block_id,
            block_ids[i - 1] if i else None,
            tuple(token_ids[i * BLOCK_SIZE : (i + 1) * BLOCK_SIZE]),
            salt,
        )
        for i, block_id in enumerate(block_ids)
    ]


def commit(cache: PrefixCache, block_ids: Sequence[int], token_ids: Sequence[int], salt="") -> int:
    return cache.commit(make_entries(block_ids, token_ids, salt))


def free_queue(cache: PrefixCache) -> list[int]:
    return list(cache.free_block_queue)


def stats(cache: PrefixCache) -> tuple[int, int, int, int]:
    s = cache.stats
    return (s.num_queries, s.num_query_tokens, s.num_hit_tokens, s.num_evictions)


def test_committed_blocks_are_found_and_referenced() -> None:
    cache = make_cache()
    assert cache.allocate(3) == [0, 1, 2]
    assert commit(cache, [0, 1, 2], A) == 3
    assert cache.num_cached_blocks == 3
    assert cache.lookup(A + [99], "") == [0, 1, 2]
    assert cache.ref_cnt == [2, 2, 2, 0, 0, 0, 0, 0]
    assert free_queue(cache) == [3, 4, 5, 6, 7]
    assert stats(cache) == (1, 13, 12, 0)
    assert cache.stats.hit_ratio == 12 / 13


def test_hit_ratio_accumulates_over_queries() -> None:
    cache = make_cache()
    assert PrefixCacheStats().hit_ratio == 0.0
    assert cache.allocate(2) == [0, 1]
    commit(cache, [0, 1], A[:8])
    assert cache.lookup(A[:9], "") == [0, 1]
    assert cache.lookup(B[:7], "") == []
    assert stats(cache) == (2, 16, 8, 0)
    assert cache.stats.hit_ratio == 0.5


def test_only_full_blocks_below_the_last_token_are_returned() -> None:
    cache = make_cache()
    assert cache.allocate(3) == [0, 1, 2]
    # 10 tokens fill two blocks; the third holds 2 tokens and cannot be committed.
    assert commit(cache, [0, 1], A[:8]) == 2
    with pytest.raises(InvalidArgument, match=r"^token_ids: 2 tokens, a full block has 4$"):
        cache.commit([CommitEntry(2, 1, tuple(A[8:10]))])
    assert cache.num_cached_blocks == 2
    # The last token is always computed, so an exactly cached prompt leaves its last block out.
    assert cache.lookup(A[:8], "") == [0]
    assert cache.lookup(A[:9], "") == [0, 1]
    assert cache.lookup(A[:10], "") == [0, 1]
    assert cache.lookup(A[:4], "") == []
    assert cache.lookup(A[:5], "") == [0]
    assert cache.lookup([], "") == []
    assert cache.ref_cnt[:3] == [5, 3, 1]
    assert stats(cache) == (6, 36, 24, 0)


def test_a_different_token_ends_the_hit_at_the_previous_block() -> None:
    cache = make_cache()
    assert cache.allocate(3) == [0, 1, 2]
    assert commit(cache, [0, 1, 2], A) == 3
    assert cache.lookup(A[:5] + [999] + A[6:] + [1], "") == [0]
    assert cache.lookup(A[:9] + [999] + A[10:] + [1], "") == [0, 1]
    assert cache.lookup([999] + A[1:] + [1], "") == []
    assert cache.ref_cnt[:3] == [3, 2, 1]


def test_the_same_block_after_a_different_prefix_is_different_content() -> None:
    cache = make_cache()
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0, 1], A[:8]) == 2
    # B[:4] + A[4:8]: block 1 has A's tokens, but its KV depends on B[:4].
    assert commit(cache, [2, 3], B[:4] + A[4:8]) == 2
    assert cache.num_cached_blocks == 4
    assert cache.lookup(B[:4] + A[4:9], "") == [2, 3]
    assert cache.lookup(A[:9], "") == [0, 1]
    parent_a = cache.hash_block(BlockKey(ROOT_HASH, tuple(A[:4]), ""))
    parent_b = cache.hash_block(BlockKey(ROOT_HASH, tuple(B[:4]), ""))
    assert cache.hash_block(BlockKey(parent_a, tuple(A[4:8]), "")) != cache.hash_block(
        BlockKey(parent_b, tuple(A[4:8]), "")
    )


def test_freed_blocks_stay_findable_until_evicted_in_lru_order() -> None:
    cache = make_cache(4)
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0, 1], A[:8]) == 2
    assert commit(cache, [2, 3], B[:8]) == 2
    cache.free([1, 0])
    cache.free([3, 2])
    assert free_queue(cache) == [1, 0, 3, 2]
    assert cache.ref_cnt == [0, 0, 0, 0]
    # A hit on a free block takes it out of the free queue.
    assert cache.lookup(A[:9], "") == [0, 1]
    assert free_queue(cache) == [3, 2]
    assert cache.ref_cnt == [1, 1, 0, 0]
    cache.free([1, 0])
    assert free_queue(cache) == [3, 2, 1, 0]
    # B's second block was freed least recently: evicted first.
    assert cache.allocate(1) == [3]
    assert cache.stats.num_evictions == 1
    assert cache.num_cached_blocks == 3
    assert cache.lookup(B[:9], "") == [2]
    assert free_queue(cache) == [1, 0]
    assert cache.allocate(2) == [1, 0]
    assert cache.stats.num_evictions == 3
    assert cache.lookup(A[:9], "") == []
    assert cache.num_cached_blocks == 1
    assert cache.ref_cnt == [1, 1, 1, 1]


def test_allocating_uncached_blocks_evicts_nothing() -> None:
    cache = make_cache(4)
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0], A[:4]) == 1
    cache.free([3, 1, 0])
    assert cache.allocate(2) == [3, 1]
    assert cache.stats.num_evictions == 0
    assert cache.allocate(1) == [0]
    assert cache.stats.num_evictions == 1


def test_referenced_cached_blocks_are_never_evicted() -> None:
    cache = make_cache(4)
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0, 1], A[:8]) == 2
    cache.free([3, 2])
    assert cache.allocate(2) == [3, 2]
    with pytest.raises(ResourceExhausted, match="^num_blocks: 1 requested, 0 free$"):
        cache.allocate(1)
    assert cache.stats.num_evictions == 0
    assert cache.lookup(A[:9], "") == [0, 1]
    assert cache.ref_cnt == [2, 2, 1, 1]


def test_cache_salt_isolates_tenants() -> None:
    cache = make_cache()
    assert cache.allocate(2) == [0, 1]
    assert commit(cache, [0, 1], A[:8], salt="a") == 2
    assert cache.lookup(A[:9], "b") == []
    assert cache.lookup(A[:9], "") == []
    assert cache.lookup(A[:9], "a") == [0, 1]
    # The same tokens under another salt are new content.
    assert cache.allocate(2) == [2, 3]
    assert commit(cache, [2, 3], A[:8], salt="b") == 2
    assert cache.lookup(A[:9], "b") == [2, 3]
    assert cache.num_cached_blocks == 4
    assert stats(cache) == (4, 36, 16, 0)


def test_empty_salt_is_one_namespace_shared_by_every_empty_salt_request() -> None:
    cache = make_cache()
    assert cache.allocate(2) == [0, 1]
    assert commit(cache, [0, 1], A[:8], salt="") == 2
    assert cache.lookup(A[:9], "") == [0, 1]
    assert cache.lookup(A[:8] + [7, 7], "") == [0, 1]
    assert cache.lookup(A[:9], "a") == []
    assert cache.ref_cnt[:2] == [3, 3]


def test_hash_is_xxh3_128_of_the_documented_layout() -> None:
    cache = make_cache(fingerprint="model-a")
    key = BlockKey(ROOT_HASH, (1, 2, 3, 70000), "tenant")
    data = (
        b"\x00" * 16
        + np.array([1, 2, 3, 70000], dtype="<u4").tobytes()
        + struct.pack("<I", 7)
        + b"model-a"
        + struct.pack("<I", 6)
        + b"tenant"
    )
    assert cache.hash_block(key) == xxhash.xxh3_128_digest(data)
    parent_hash = cache.hash_block(key)
    child = BlockKey(parent_hash, (4, 5, 6, 7), "tenant")
    child_data = parent_hash + np.array([4, 5, 6, 7], dtype="<u4").tobytes() + data[32:]
    assert cache.hash_block(child) == xxhash.xxh3_128_digest(child_data)


def test_fingerprint_and_salt_are_length_prefixed() -> None:
    key_salt_c = BlockKey(ROOT_HASH, (1, 2, 3, 4), "c")
    key_salt_bc = BlockKey(ROOT_HASH, (1, 2, 3, 4), "bc")
    assert make_cache(fingerprint="ab").hash_block(key_salt_c) != make_cache(
        fingerprint="a"
    ).hash_block(key_salt_bc)


def test_a_different_fingerprint_gives_different_hashes() -> None:
    cache_a, cache_b = make_cache(fingerprint="model-a"), make_cache(fingerprint="model-b")
    key = BlockKey(ROOT_HASH, tuple(A[:4]), "")
    assert cache_a.hash_block(key) != cache_b.hash_block(key)
    assert make_cache(fingerprint="model-a").hash_block(key) == cache_a.hash_block(key)
    assert cache_a.allocate(1) == [0]
    assert cache_b.allocate(1) == [0]
    commit(cache_a, [0], A[:4])
    commit(cache_b, [0], A[:4])
    assert set(cache_a.cached_block_hash).isdisjoint(cache_b.cached_block_hash)


def test_colliding_hashes_never_share_blocks() -> None:
    cache = make_cache(hash_fn=lambda data: b"\0" * 16)
    assert cache.allocate(2) == [0, 1]
    assert commit(cache, [0], A[:4]) == 1
    assert cache.lookup(B[:5], "") == []
    assert cache.lookup(A[:5], "") == [0]
    # B's block collides with A's: it is not cached, and A's registration is kept.
    assert commit(cache, [1], B[:4]) == 0
    assert cache.lookup(B[:5], "") == []
    assert cache.lookup(A[:5], "") == [0]
    assert cache.ref_cnt[:2] == [3, 1]
    assert cache.num_cached_blocks == 1


def first_blocks_collide(data: bytes) -> bytes:
    """xxh3-128, except that every first block of a sequence hashes to the same value."""
    return xxh3_128(b"first block" if data.startswith(ROOT_HASH) else data)


def test_a_block_after_a_colliding_block_is_not_cached() -> None:
    cache = make_cache(hash_fn=first_blocks_collide)
    assert cache.allocate(3) == [0, 1, 2]
    assert commit(cache, [0], A[:4]) == 1
    # B[:4] collides with A[:4]; block 2 holds A[4:8] but its KV was computed after B[:4].
    assert commit(cache, [1, 2], B[:4] + A[4:8]) == 0
    assert cache.lookup(A[:9], "") == [0]
    assert cache.lookup(B[:9], "") == []


def test_a_hash_keeps_its_content_while_a_cached_block_chains_through_it() -> None:
    cache = make_cache(4, hash_fn=first_blocks_collide)
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0, 1], B[:4] + A[4:8]) == 2
    cache.free([0])
    cache.free([1])
    assert cache.allocate(1) == [0]
    assert cache.stats.num_evictions == 1
    # Block 1 still names B[:4] by its hash: A[:4], colliding with it, must not take that hash.
    assert commit(cache, [0], A[:4]) == 0
    assert cache.lookup(A[:9], "") == []
    assert cache.lookup(B[:4] + A[4:9], "") == []
    # Once block 1 is evicted too, nothing depends on the hash any more.
    assert cache.allocate(1) == [1]
    assert cache.stats.num_evictions == 2
    assert commit(cache, [1], A[:4]) == 1
    assert cache.lookup(A[:9], "") == [1]


def test_duplicate_content_keeps_the_first_registration() -> None:
    cache = make_cache()
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0, 1], A[:8]) == 2
    assert commit(cache, [2, 3], A[:8]) == 0
    assert cache.num_cached_blocks == 2
    assert cache.lookup(A[:9], "") == [0, 1]
    # Evicting a duplicate does not drop the registered copy.
    cache.free([3, 2])
    assert cache.allocate(2) == [4, 5]
    assert cache.allocate(2) == [6, 7]
    assert cache.allocate(2) == [3, 2]
    assert cache.stats.num_evictions == 0
    assert cache.lookup(A[:9], "") == [0, 1]


def test_a_block_committed_again_forgets_its_old_content() -> None:
    cache = make_cache()
    assert cache.allocate(1) == [0]
    assert commit(cache, [0], A[:4]) == 1
    assert commit(cache, [0], B[:4]) == 1
    assert cache.num_cached_blocks == 1
    assert cache.lookup(A[:5], "") == []
    assert cache.lookup(B[:5], "") == [0]


def test_a_block_after_a_duplicate_is_cached_and_found_through_the_first_copy() -> None:
    cache = make_cache()
    assert cache.allocate(4) == [0, 1, 2, 3]
    assert commit(cache, [0], A[:4]) == 1
    assert commit(cache, [1, 2], A[:8]) == 1
    assert cache.lookup(A[:9], "") == [0, 2]


def test_commit_after_an_unknown_parent_registers_nothing() -> None:
    cache = make_cache()
    assert cache.allocate(3) == [0, 1, 2]
    assert cache.commit([CommitEntry(1, 0, tuple(A[4:8]))]) == 0
    assert cache.num_cached_blocks == 0
    assert commit(cache, [0], A[:4]) == 1
    assert cache.lookup(A[:9], "") == [0]


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (CommitEntry(0, None, (1, 2, 3)), r"^token_ids: 3 tokens, a full block has 4$"),
        (CommitEntry(0, None, (1, 2, 3, 4, 5)), r"^token_ids: 5 tokens, a full block has 4$"),
        (CommitEntry(5, None, (1, 2, 3, 4)), r"^block_id: block 5 is not allocated$"),
        (CommitEntry(8, None, (1, 2, 3, 4)), r"^block_id: block 8 is not allocated$"),
        (CommitEntry(-1, None, (1, 2, 3, 4)), r"^block_id: block -1 is not allocated$"),
    ],
)
def test_malformed_commits_are_invalid(entry: CommitEntry, message: str) -> None:
    cache = make_cache()
    assert cache.allocate(2) == [0, 1]
    with pytest.raises(InvalidArgument, match=message):
        cache.commit([entry])
    assert cache.num_cached_blocks == 0


def test_disabled_cache_counts_queries_and_caches_nothing() -> None:
    cache = make_cache(enabled=False)
    assert cache.allocate(2) == [0, 1]
    assert commit(cache, [0, 1], A[:8]) == 0
    assert cache.lookup(A[:9], "") == []
    assert cache.num_cached_blocks == 0
    assert cache.ref_cnt[:2] == [1, 1]
    assert stats(cache) == (1, 9, 0, 0)
    assert cache.stats.hit_ratio == 0.0


def test_reconcile_keeps_cached_content_findable() -> None:
    cache = make_cache()
    assert cache.allocate(3) == [0, 1, 2]
    assert commit(cache, [0, 1], A[:8]) == 2
    assert cache.reconcile([0, 0]) == 3
    assert cache.ref_cnt[:3] == [2, 0, 0]
    assert free_queue(cache) == [3, 4, 5, 6, 7, 1, 2]
    assert cache.lookup(A[:9], "") == [0, 1]
    assert cache.ref_cnt[:3] == [3, 1, 0]
    assert cache.num_cached_blocks == 2
