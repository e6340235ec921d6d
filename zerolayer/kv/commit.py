"""What a scheduler tells the kvstore when a block of a sequence becomes full (``CommitBlocks``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CommitEntry:
    """A block that became full: its KV is computed and may be found again by content.

    The block's prefix-cache key is derived from its parent's, its tokens and the sequence's
    cache salt (see :mod:`zerolayer.kvstore.prefix_cache`).
    """

    block_id: int
    parent_block_id: int | None
    """The previous block of the sequence; None for the first block."""
    token_ids: tuple[int, ...]
    """The block's ``block_size`` token ids."""
    cache_salt: str = ""
    """The sequence's cache salt (prefix-cache namespace); "" is the shared namespace."""
