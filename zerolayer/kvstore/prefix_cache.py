"""Content-addressed KV blocks: prefix reuse across requests, isolated per cache salt.

Each full block of ``block_size`` tokens gets a hash chained to its parent's,
``h_i = H(h_{i-1} || token ids of block i || extra keys)`` with ``H`` = xxh3-128 and extra keys =
the model fingerprint and the request's cache salt (length-prefixed), the scheme of vLLM's
automatic prefix caching (docs "Automatic Prefix Caching"; Kwon et al. 2023). Only full blocks are
cached. Freed blocks keep their content and stay findable, in the free queue's LRU order, until
allocation takes them (eviction).

Collisions: a hit is only taken when the candidate block's stored key (parent hash, token ids,
salt) equals the one being looked up, so two different blocks whose hashes collide never share
KV. A key names its parent by hash, so a hash keeps the one content it first stood for as long as
any known block has it as its own or its parent's hash; by induction over the chain the whole
prefix then matches token for token. A colliding block is simply not cached, nor is any block
after it. Different salts give different keys, so tenants never share blocks (closing the
timing side channel of a shared cache); the empty salt is one shared namespace.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import xxhash

from zerolayer.common.errors import InvalidArgument
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import PrefixLookup
from zerolayer.kvstore.block_pool import BlockPool

HashFn = Callable[[bytes], bytes]
"""Maps bytes to a block hash; injectable so tests can force collisions."""

ROOT_HASH = b"\x00" * 16
"""Parent hash of a sequence's first block."""


def xxh3_128(data: bytes) -> bytes:
    """The 16-byte xxh3-128 digest of ``data``."""
    return xxhash.xxh3_128_digest(data)


@dataclass(frozen=True)
class BlockKey:
    """Everything a full block's KV depends on (besides the model, fixed per kvstore)."""

    parent_hash: bytes
    token_ids: tuple[int, ...]
    cache_salt: str


@dataclass
class PrefixCacheStats:
    """Counters since start. A lookup counts once per admitted request (:meth:`count`, called by
    the allocation that admits it), not once per call: a request waiting for free blocks is
    looked up again at every engine step, and a preempted one when it is recomputed."""

    num_queries: int = 0
    num_query_tokens: int = 0
    num_hit_tokens: int = 0
    num_evictions: int = 0

    def count(self, lookup: PrefixLookup) -> None:
        """Adds one lookup of ``lookup.num_query_tokens`` tokens, ``num_hit_tokens`` found."""
        self.num_queries += 1
        self.num_query_tokens += lookup.num_query_tokens
        self.num_hit_tokens += lookup.num_hit_tokens

    @property
    def hit_ratio(self) -> float:
        """Hit tokens over queried tokens (0 before any query)."""
        return self.num_hit_tokens / self.num_query_tokens if self.num_query_tokens else 0.0


class PrefixCache(BlockPool):
    """A :class:`BlockPool` whose full blocks can be found again by content: the kvstore's pool.

    Freeing, reference counts and reconciles are the pool's (a freed block keeps its content
    until an allocation evicts it); lookup, commit and allocation's eviction are its own. Not
    thread-safe (the kvstore's event loop, or the in-process engine, drives it).

    Raises (from its methods):
        InvalidArgument: malformed token lists or block ids.
    """

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        fingerprint: str,
        enabled: bool,
        hash_fn: HashFn = xxh3_128,
    ) -> None:
        """
        Args:
            num_blocks: blocks of the arena.
            block_size: tokens per block.
            fingerprint: the model's, part of every block hash.
            enabled: find blocks by content at all (``--no-prefix-caching``: never).
            hash_fn: the block hash (tests force collisions with it).

        Raises:
            ValueError: ``num_blocks`` is not > 0.
        """
        super().__init__(num_blocks)
        self.block_size = block_size
        self.enabled = enabled
        self._fingerprint = fingerprint.encode()
        self._hash_fn = hash_fn
        self.cached_block_hash: dict[bytes, int] = {}
        """Hash -> the block registered under it."""
        self.block_keys: dict[int, tuple[bytes, BlockKey]] = {}
        """Block id -> (hash, key) for every block whose content is known."""
        self._hash_keys: dict[bytes, tuple[BlockKey, int]] = {}
        """Hash -> (the key it stands for, how many known blocks have it as own or parent hash)."""
        self.stats = PrefixCacheStats()

    def hash_block(self, key: BlockKey) -> bytes:
        """The chained hash of one full block."""
        salt = key.cache_salt.encode()
        data = b"".join(
            (
                key.parent_hash,
                struct.pack(f"<{len(key.token_ids)}I", *key.token_ids),
                struct.pack("<I", len(self._fingerprint)),
                self._fingerprint,
                struct.pack("<I", len(salt)),
                salt,
            )
        )
        return self._hash_fn(data)

    @property
    def num_cached_blocks(self) -> int:
        """Blocks findable by content (free or in use)."""
        return len(self.cached_block_hash)

    @property
    def num_evictable_blocks(self) -> int:
        """Free blocks (ref_cnt 0) still findable by content: a lookup reuses them, an allocation
        evicts them (least recently freed first). O(cached blocks)."""
        ref_cnt = self.ref_cnt
        return sum(1 for block_id in self.cached_block_hash.values() if ref_cnt[block_id] == 0)

    def lookup(self, token_ids: Sequence[int], cache_salt: str, counted: bool = True) -> list[int]:
        """Finds the longest cached prefix and takes a reference on each of its blocks.

        At most the full blocks within the first ``len(token_ids) - 1`` tokens are returned, so the
        caller always computes at least the last token (it needs its logits).

        Args:
            counted: add the lookup to :attr:`stats` now; False when the caller counts it once
                its request is admitted (:meth:`PrefixCacheStats.count`).

        Returns:
            Block ids of the cached prefix, in order (``len * block_size`` tokens are cached).
        """
        hits = self.find(token_ids[:-1], cache_salt)
        self.incref(hits)
        if counted:
            self.stats.count(PrefixLookup(len(token_ids), len(hits) * self.block_size))
        return hits

    def find(self, token_ids: Sequence[int], cache_salt: str) -> list[int]:
        """The committed blocks of the longest cached prefix of ``token_ids``' full blocks
        (``len(token_ids) // block_size`` at most), in order; takes no reference, counts nothing."""
        if not self.enabled:
            return []
        num_full = len(token_ids) // self.block_size
        parent = ROOT_HASH
        hits: list[int] = []
        for i in range(num_full):
            key = BlockKey(
                parent,
                tuple(token_ids[i * self.block_size : (i + 1) * self.block_size]),
                cache_salt,
            )
            block_hash = self.hash_block(key)
            block_id = self.cached_block_hash.get(block_hash)
            if block_id is None or self.block_keys[block_id][1] != key:
                break  # a miss, or a hash collision with different content
            hits.append(block_id)
            parent = block_hash
        return hits

    def commit(self, entries: Sequence[CommitEntry]) -> int:
        """Registers blocks that became full (their KV is computed), in sequence order; each
        entry carries its sequence's cache salt.

        A block whose parent's content is unknown (e.g. after a kvstore restart, or the parent
        was not committed, or its hash collided) is not registered. A block whose content is already
        registered under another block id stays unregistered (the first copy is kept), but blocks
        after it are registered.

        Returns:
            How many blocks were newly registered.

        Raises:
            InvalidArgument: wrong token count, or a block that is not allocated.
        """
        if not self.enabled:
            return 0
        registered = 0
        for entry in entries:
            if len(entry.token_ids) != self.block_size:
                raise InvalidArgument(
                    "token_ids",
                    f"{len(entry.token_ids)} tokens, a full block has {self.block_size}",
                )
            if not 0 <= entry.block_id < self.num_blocks or self.ref_cnt[entry.block_id] == 0:
                raise InvalidArgument("block_id", f"block {entry.block_id} is not allocated")
            self._unlink(entry.block_id)
            if entry.parent_block_id is None:
                parent_hash = ROOT_HASH
            elif entry.parent_block_id in self.block_keys:
                parent_hash = self.block_keys[entry.parent_block_id][0]
            else:
                continue
            key = BlockKey(parent_hash, tuple(entry.token_ids), entry.cache_salt)
            block_hash = self.hash_block(key)
            known = self._hash_keys.get(block_hash)
            if known is not None and known[0] != key:
                continue  # a collision: the content stays unknown, so blocks after it are skipped
            self._link(entry.block_id, block_hash, key)
            if block_hash not in self.cached_block_hash:
                self.cached_block_hash[block_hash] = entry.block_id
                registered += 1
        return registered

    def allocate(self, num_blocks: int, admitted_lookup: PrefixLookup | None = None) -> list[int]:
        """Takes free blocks (least recently freed first), evicting their cached content.

        Args:
            admitted_lookup: set when these blocks admit a request for the first time: its prefix
                lookup (made with ``counted=False``) is counted once the blocks are taken.

        Raises:
            InvalidArgument: num_blocks is 0, or ``admitted_lookup`` has more hit than query
                tokens (nothing is taken).
            ResourceExhausted: fewer free blocks than asked (nothing is taken).
        """
        if admitted_lookup is not None and (
            admitted_lookup.num_hit_tokens > admitted_lookup.num_query_tokens
        ):
            raise InvalidArgument(
                "admitted_lookup",
                f"{admitted_lookup.num_hit_tokens} hit tokens of "
                f"{admitted_lookup.num_query_tokens} looked up",
            )
        block_ids = super().allocate(num_blocks)
        for block_id in block_ids:
            self._forget(block_id)
        if admitted_lookup is not None:
            self.stats.count(admitted_lookup)
        return block_ids

    def _forget(self, block_id: int) -> None:
        if self._unlink(block_id):
            self.stats.num_evictions += 1

    def _link(self, block_id: int, block_hash: bytes, key: BlockKey) -> None:
        self.block_keys[block_id] = (block_hash, key)
        for used in _hashes_used(block_hash, key):
            stored, num_users = self._hash_keys.get(used, (key, 0))
            self._hash_keys[used] = (stored, num_users + 1)

    def _unlink(self, block_id: int) -> bool:
        """Forgets a block's content; returns True if it was the registered copy."""
        entry = self.block_keys.pop(block_id, None)
        if entry is None:
            return False
        block_hash, key = entry
        for used in _hashes_used(block_hash, key):
            stored, num_users = self._hash_keys[used]
            if num_users == 1:
                del self._hash_keys[used]
            else:
                self._hash_keys[used] = (stored, num_users - 1)
        if self.cached_block_hash.get(block_hash) != block_id:
            return False
        del self.cached_block_hash[block_hash]
        return True


def _hashes_used(block_hash: bytes, key: BlockKey) -> tuple[bytes, ...]:
    """The hashes whose meaning a known block relies on: its own and its parent's."""
    return (block_hash,) if key.parent_hash == ROOT_HASH else (block_hash, key.parent_hash)
