"""The scheduler's view of KV memory: block tables of its requests over the kvstore's block pool,
with prefix reuse (lookup on admission, commit of blocks as they fill)."""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Protocol

from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.stats import PrefixHit, PrefixLookup
from zerolayer.scheduler.core.request import Request

log = logging.getLogger(__name__)


class KVStoreUnavailable(Exception):
    """The kvstore cannot be used right now (down, restarting, or not reconciled yet)."""


class KVLeaseLost(KVStoreUnavailable):
    """The kvstore no longer counts this scheduler's block references (its lease expired, a newer
    registration of its owner id exists, or the kvstore restarted): the blocks its requests hold
    are not its own any more. The scheduler drops them and recomputes those requests."""


class ArenaChanged(Exception):
    """The kvstore came back with a new arena (its file was recreated): the KV of every running
    sequence is gone. Carries the new arena mapping."""

    def __init__(self, arena: object) -> None:
        super().__init__("kvstore arena was recreated: the KV cache of running requests is gone")
        self.arena = arena


class BlockAllocator(Protocol):
    """The operations the scheduler needs from the kvstore.

    Every method may raise :class:`KVStoreUnavailable`.
    """

    num_blocks_total: int

    def allocate(
        self, num_blocks: int, admitted_lookup: PrefixLookup | None = None
    ) -> list[int] | None:
        """Takes blocks with ref_cnt 1; None (nothing taken) when too few are free. When the
        blocks are taken, ``admitted_lookup`` (the prefix lookup of the request they admit) is
        added to the kvstore's prefix-cache counters."""

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block."""

    def lookup(self, token_ids: Sequence[int], cache_salt: str, counted: bool) -> PrefixHit:
        """Blocks of the longest cached prefix (never covering the last token), referenced, and
        how many of them a kvstore pin holds. ``counted``: added to the prefix-cache counters
        now; the scheduler passes False, and the allocation that admits the request counts it
        (``admitted_lookup``)."""

    def commit(self, entries: Sequence[CommitEntry]) -> None:
        """Registers full blocks (each with its sequence's cache salt)."""

    def reconcile(self, held_block_ids: list[int]) -> int:
        """Declares every block reference held; returns how many counts changed."""

    def lease_lost(self) -> bool:
        """True when the references held are gone (see :class:`KVLeaseLost`); an allocator
        without owners never loses them."""


class KVCacheManager:
    """Grows, fills and frees the block tables of requests.

    A request's block table ``block_ids`` covers tokens ``[0, len(block_ids) * block_size)``;
    token ``p`` lives in block ``block_ids[p // block_size]`` at offset ``p % block_size``.
    When the kvstore fails, ``needs_reconcile`` is set: before allocating again, the manager
    declares what its requests hold (:meth:`reconcile`), so a restarted kvstore rebuilds its
    reference counts and nothing is lost or handed out twice.
    """

    def __init__(
        self,
        allocator: BlockAllocator,
        block_size: int,
        clock: Callable[[], float] = time.monotonic,
        reconcile_interval_s: float = 1.0,
    ) -> None:
        """
        Args:
            allocator: the kvstore (or an in-process pool).
            block_size: tokens per block.
            clock: seconds, monotonic; when the kvstore became unusable (tests inject one).
            reconcile_interval_s: least time between two reconcile attempts while the kvstore
                is unusable, seconds; a hung kvstore then costs the engine at most one probe
                (the client's probe deadline) per interval.
        """
        self.clock = clock
        self.reconcile_interval_s = reconcile_interval_s
        self._next_reconcile = 0.0
        self.num_reconcile_attempts = 0
        """Reconcile calls made to the kvstore so far."""
        self.allocator = allocator
        self.block_size = block_size
        self.num_blocks_held = 0
        """Block references the requests hold: a block shared by k requests counts k times."""
        self._holders: collections.Counter[int] = collections.Counter()
        """Requests holding each held block (a block leaves when its last holder lets go)."""
        self.needs_reconcile = False
        self._lease_lost = False
        self.unusable_since: float | None = None
        """``clock()`` when the first call that failed since the kvstore was last usable began;
        None while it is usable."""
        self.last_error = ""
        """The latest failure, for messages (e.g. "UNAVAILABLE: failed to connect")."""
        self.count_lookups = True
        """Report admissions' prefix lookups to the kvstore's counters (``allocate_slots``'s
        ``count_lookup``); False while the engine warms up, which is not traffic."""

    @property
    def num_blocks_total(self) -> int:
        """Blocks of the whole arena (the allocator's pool)."""
        return self.allocator.num_blocks_total

    @property
    def num_blocks_in_use(self) -> int:
        """Distinct blocks the requests hold (each shared block once); at most
        :attr:`num_blocks_total`. Other schedulers' blocks and cached blocks nobody holds are
        not counted."""
        return len(self._holders)

    def _hold(self, block_ids: Iterable[int]) -> None:
        self._holders.update(block_ids)

    def _let_go(self, block_ids: Iterable[int]) -> None:
        for block_id in block_ids:
            if self._holders[block_id] <= 1:
                del self._holders[block_id]
            else:
                self._holders[block_id] -= 1

    def num_blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` tokens."""
        return -(-num_tokens // self.block_size)

    def _failed(self, what: str, exc: Exception, started: float) -> None:
        if not self.needs_reconcile:
            log.warning("kvstore unusable (%s: %s); will reconcile when it is back", what, exc)
            self._next_reconcile = self.clock() + self.reconcile_interval_s
        self.needs_reconcile = True
        self.last_error = str(exc)
        if self.unusable_since is None:
            self.unusable_since = started

    def _check_usable(self) -> None:
        # NOTE: until the kvstore has been told what this scheduler holds, only reconcile() talks
        # to it: a restarted kvstore must not hand out blocks before it knows which are taken,
        # and a hung one would block the engine for a deadline per call.
        if self.needs_reconcile:
            raise KVStoreUnavailable(f"not reconciled yet ({self.last_error})")

    def lease_lost(self) -> bool:
        """True when this scheduler's references at the kvstore are gone (see
        :class:`KVLeaseLost`): every request's blocks must be dropped (:meth:`forget`) and its KV
        recomputed before the next :meth:`reconcile`, which registers again. The first time it
        finds the lease lost, that reconcile is due at once (not after the probe interval)."""
        lost = self.allocator.lease_lost()
        if lost and not self._lease_lost:
            self._next_reconcile = 0.0
        self._lease_lost = lost
        return lost

    def get_computed_blocks(self, request: Request) -> int:
        """Takes the cached prefix of a request that holds no blocks; returns its token count.
        Sets the request's ``num_pinned_tokens``: of them, tokens a kvstore pin holds.

        A request that still needs prompt logprobs takes no cached prefix (0): its prompt's
        logits must be computed. Its blocks are still committed as they fill.

        Raises:
            KVStoreUnavailable: the lookup failed (nothing is held).
        """
        request.num_pinned_tokens = 0
        if request.needs_prompt_logprobs:
            return 0
        self._check_usable()
        started = self.clock()
        try:
            hit = self.allocator.lookup(request.all_token_ids, request.cache_salt, counted=False)
        except KVStoreUnavailable as exc:
            self._failed("lookup", exc, started)
            raise
        block_ids = hit.block_ids
        request.num_pinned_tokens = hit.num_pinned_blocks * self.block_size
        request.block_ids = list(block_ids)
        request.num_committed_blocks = len(block_ids)
        request.num_computed_tokens = len(block_ids) * self.block_size
        self.num_blocks_held += len(block_ids)
        self._hold(block_ids)
        return request.num_computed_tokens

    def allocate_slots(
        self, request: Request, num_new_tokens: int, count_lookup: bool = False
    ) -> bool:
        """Makes room for the request's next ``num_new_tokens`` tokens.

        Args:
            count_lookup: this allocation admits the request for the first time, right after
                :meth:`get_computed_blocks`: if it succeeds, that lookup (the request's tokens,
                its ``num_computed_tokens`` as hits) goes into the kvstore's prefix-cache
                counters. So each request counts once, not once per admission attempt while it
                waits for free blocks, nor again when recomputed after a preemption.

        Returns:
            False if the pool has too few free blocks; the request is then unchanged.

        Raises:
            KVStoreUnavailable: the kvstore could not be asked (the request is unchanged).
        """
        needed = self.num_blocks_for(request.num_computed_tokens + num_new_tokens)
        missing = needed - len(request.block_ids)
        if missing <= 0:
            return True
        self._check_usable()
        admitted = None
        # NOTE: a request that needs prompt logprobs made no lookup (get_computed_blocks).
        if count_lookup and self.count_lookups and not request.needs_prompt_logprobs:
            admitted = PrefixLookup(request.num_tokens, request.num_computed_tokens)
        started = self.clock()
        try:
            with _in_trace_of(request):
                block_ids = self.allocator.allocate(missing, admitted)
        except KVStoreUnavailable as exc:
            self._failed("allocate", exc, started)
            raise
        if block_ids is None:
            return False
        request.block_ids.extend(block_ids)
        self.num_blocks_held += len(block_ids)
        self._hold(block_ids)
        return True

    def free(self, request: Request) -> None:
        """Releases every block of the request (tail first, so the prefix is evicted last).

        Never raises: if the kvstore is down, the reference is dropped here and the next
        reconcile releases it there.
        """
        if not request.block_ids:
            return
        block_ids, request.block_ids = request.block_ids, []
        request.num_committed_blocks = 0
        self.num_blocks_held -= len(block_ids)
        self._let_go(block_ids)
        if self.needs_reconcile:
            return  # the next reconcile declares the blocks no longer held
        started = self.clock()
        try:
            with _in_trace_of(request):
                self.allocator.free(block_ids[::-1])
        except KVStoreUnavailable as exc:
            self._failed("free", exc, started)

    def forget(self, request: Request) -> None:
        """Drops the request's blocks here without telling the kvstore (after a failure, which
        the kvstore may be part of); the next :meth:`reconcile`, which runs before any other
        kvstore call, releases them there. Never raises."""
        self.num_blocks_held -= len(request.block_ids)
        self._let_go(request.block_ids)
        request.block_ids = []
        request.num_committed_blocks = 0
        self.needs_reconcile = True

    def commit_full_blocks(self, requests: Iterable[Request]) -> None:
        """Registers the blocks that became full (all their tokens computed) since last time.

        Never raises: a failed commit only means those blocks are not findable later.
        """
        entries: list[CommitEntry] = []
        for request in requests:
            num_full = min(request.num_computed_tokens // self.block_size, len(request.block_ids))
            if num_full <= request.num_committed_blocks:
                continue
            for i in range(request.num_committed_blocks, num_full):
                parent = request.block_ids[i - 1] if i else None
                block_tokens = tuple(
                    request.token_slice(i * self.block_size, (i + 1) * self.block_size)
                )
                entries.append(
                    CommitEntry(request.block_ids[i], parent, block_tokens, request.cache_salt)
                )
            request.num_committed_blocks = num_full
        if not entries or self.needs_reconcile:
            return
        started = self.clock()
        try:
            self.allocator.commit(entries)
        except KVStoreUnavailable as exc:
            self._failed("commit", exc, started)

    def reconcile(self, requests: Iterable[Request], force: bool = False) -> bool:
        """Declares every block the requests hold; returns True once the kvstore accepted it.

        Tries at most every ``reconcile_interval_s`` (False without a call in between) unless
        ``force``.
        """
        if not force and self.clock() < self._next_reconcile:
            return False
        self.num_reconcile_attempts += 1
        held = [block_id for r in requests for block_id in r.block_ids]
        try:
            changed = self.allocator.reconcile(held)
        except KVStoreUnavailable as exc:
            self.last_error = str(exc)
            self._next_reconcile = self.clock() + self.reconcile_interval_s
            return False
        log.info(
            "reconciled %d held block(s) with the kvstore (%d count(s) corrected)",
            len(held),
            changed,
        )
        self.needs_reconcile = False
        self.unusable_since = None
        return True


def _in_trace_of(request: Request) -> AbstractContextManager[object]:
    """Around an allocator call made for ``request`` alone: the call joins its trace (if any)."""
    return request.trace.attached() if request.trace is not None else nullcontext()
