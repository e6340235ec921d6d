"""Which scheduler a request goes to: the frontend's view of its schedulers' health and load.

A scheduler *can take requests* when it reports SERVING on the service name
``zerolayer.v1.Scheduler`` (an active scheduler). A scheduler that reports SERVING on "" only (a
warmed standby) takes no traffic until it is activated and reports SERVING on the service name.
Among those that can take requests, the request goes to the one with the least outstanding
work: the tokens still ahead of the requests this frontend has in flight there (prompt tokens not
yet prefilled plus tokens still to generate; see
:class:`zerolayer.frontend.routing.failover.InFlight`).
Ties go round robin. The scheduler's own queue (``GetStats``) is not blended in: it would be polled
and stale, and each frontend balancing its own share balances the sum when the frontends get
similar traffic.

``prefix-affine`` routing (the comparison of docs/benchmarks.md, "routing") sends a request to the
scheduler its prompt's first tokens hash to (rendezvous hashing), unless that one has more than
:data:`AFFINITY_SLACK_TOKENS` more outstanding work than the least busy one.

Health comes from :mod:`zerolayer.frontend.routing.health_client` (grpc.health.v1 ``Watch``
streams); this module holds no gRPC.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from zerolayer.common import settings
from zerolayer.common.errors import Unavailable

SCHEDULER_SERVICE = "zerolayer.v1.Scheduler"
"""Health name on which a scheduler that takes requests reports SERVING."""
LEAST_WORK, PREFIX_AFFINE = settings.ROUTING.choices
"""The routing policies (``--routing``), in the order its declaration gives them."""
AFFINITY_PREFIX_TOKENS = 32
"""Prompt tokens (with the cache salt) that choose a request's scheduler under prefix-affine."""
AFFINITY_SLACK_TOKENS = 2048
"""Outstanding work, in tokens, a prefix-affine choice may have above the least busy scheduler."""


@dataclass
class SchedulerState:
    """What the frontend knows of one scheduler."""

    address: str
    active: bool = False
    """SERVING on :data:`SCHEDULER_SERVICE`: it takes requests."""
    warm: bool = False
    """SERVING on "": the process is up and warmed (a standby when not :attr:`active`)."""
    num_outstanding_tokens: int = 0
    """Work this frontend has in flight there, tokens."""
    num_requests: int = 0
    """Requests this frontend has in flight there."""


class Work:
    """One request's share of a scheduler's outstanding work; :meth:`set` as it progresses."""

    def __init__(self, state: SchedulerState, num_tokens: int) -> None:
        self._state = state
        self._num_tokens = 0
        self.set(num_tokens)

    def set(self, num_tokens: int) -> None:
        """The request's outstanding tokens are now ``num_tokens``."""
        self._state.num_outstanding_tokens += num_tokens - self._num_tokens
        self._num_tokens = num_tokens


class Router:
    """Chooses schedulers for requests from their health and this frontend's work on each.

    Not thread-safe: used from the frontend's event loop only.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        policy: str = LEAST_WORK,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        """
        Args:
            addresses: the schedulers, in order (the order breaks the first tie).
            policy: :data:`LEAST_WORK` or :data:`PREFIX_AFFINE`.
            on_change: called whenever :attr:`available` may have changed (public health).

        Raises:
            ValueError: no address, an address given twice, or an unknown policy.
        """
        if not addresses or len(set(addresses)) != len(addresses):
            raise ValueError(f"scheduler addresses must be distinct and at least one: {addresses}")
        if policy not in (LEAST_WORK, PREFIX_AFFINE):
            raise ValueError(f"unknown routing policy {policy!r}")
        self.states = {address: SchedulerState(address) for address in addresses}
        self._policy = policy
        self._on_change = on_change
        self._num_picks = 0
        self._changed = asyncio.Event()

    @property
    def available(self) -> bool:
        """True while some scheduler can take requests (SERVING on :data:`SCHEDULER_SERVICE`)."""
        return bool(self._candidates())

    def set_health(
        self, address: str, *, active: bool | None = None, warm: bool | None = None
    ) -> None:
        """Records what a scheduler's health says (None: unchanged); an unreachable scheduler is
        neither active nor warm."""
        state = self.states[address]
        if active is not None:
            state.active = active
        if warm is not None:
            state.warm = warm
        self._changed.set()
        self._changed = asyncio.Event()
        if self._on_change is not None:
            self._on_change()

    def pick(self, prompt_token_ids: Sequence[int] = (), cache_salt: str = "") -> str | None:
        """The scheduler for a request now, by the policy; None when none can take it."""
        candidates = self._candidates()
        if not candidates:
            return None
        start = self._num_picks % len(self.states)
        self._num_picks += 1
        order = list(self.states)
        least = min(
            candidates,
            key=lambda s: (s.num_outstanding_tokens, (order.index(s.address) - start) % len(order)),
        )
        if self._policy == PREFIX_AFFINE:
            key = affinity_key(prompt_token_ids, cache_salt)
            preferred = max(candidates, key=lambda s: _rendezvous(key, s.address))
            slack = preferred.num_outstanding_tokens - least.num_outstanding_tokens
            if slack <= AFFINITY_SLACK_TOKENS:
                return preferred.address
        return least.address

    async def wait_available(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` seconds until some scheduler can take requests; returns
        :attr:`available` then."""
        deadline = time.monotonic() + timeout_s
        while not self.available:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass
        return True

    async def acquire(
        self, timeout_s: float, prompt_token_ids: Sequence[int] = (), cache_salt: str = ""
    ) -> str:
        """:meth:`pick`, waiting up to ``timeout_s`` seconds for a scheduler that can take the
        request.

        Raises:
            Unavailable: none could within ``timeout_s`` (the message lists their health by
                index, see :meth:`describe`).
        """
        available = await self.wait_available(timeout_s)
        address = self.pick(prompt_token_ids, cache_salt) if available else None
        if address is None:
            raise Unavailable(f"scheduler: none can take requests ({self.describe()})")
        return address

    @contextmanager
    def working(self, address: str, num_tokens: int) -> Iterator[Work]:
        """Counts a request's outstanding work on ``address`` while the block runs."""
        state = self.states[address]
        work = Work(state, num_tokens)
        state.num_requests += 1
        try:
            yield work
        finally:
            work.set(0)
            state.num_requests -= 1

    def describe(self, by_address: bool = False, up: Mapping[str, str] | None = None) -> str:
        """Each scheduler's health in words, named by its index in the order given (what public
        clients may read), e.g. ``#0 down or starting; #1 standby``; ``by_address``: named by
        address (for the log), e.g. ``unix:/a.sock: down or starting; unix:/b.sock: standby``.
        ``up``: by address, the words for one that is up (SERVING on "") but takes no requests,
        as it described itself (e.g. ``not serving``); "standby" for those it lacks."""
        words = {(True, True): "serving", (True, False): "serving"}
        states = self.states.values()
        names = [f"{s.address}:" if by_address else f"#{i}" for i, s in enumerate(states)]
        return "; ".join(
            f"{name} {self._word(s, words, up or {})}"
            for name, s in zip(names, states, strict=True)
        )

    @staticmethod
    def _word(
        state: SchedulerState, words: Mapping[tuple[bool, bool], str], up: Mapping[str, str]
    ) -> str:
        if not state.active and state.warm:
            return up.get(state.address, "standby")
        return words.get((state.active, state.warm), "down or starting")

    def _candidates(self) -> list[SchedulerState]:
        # NOTE: a standby (warm, not active) is never a candidate: it would reject the request.
        return [s for s in self.states.values() if s.active]


def affinity_key(prompt_token_ids: Sequence[int], cache_salt: str) -> bytes:
    """What prefix-affine routing hashes: the cache salt and the first
    :data:`AFFINITY_PREFIX_TOKENS` prompt tokens (requests sharing them share a scheduler)."""
    head = prompt_token_ids[:AFFINITY_PREFIX_TOKENS]
    return cache_salt.encode() + b"\0" + b"".join(t.to_bytes(4, "little") for t in head)


def _rendezvous(key: bytes, address: str) -> bytes:
    """Highest-random-weight hashing: the scheduler with the largest digest wins, so removing one
    moves only its own keys."""
    return hashlib.blake2b(key + b"\0" + address.encode(), digest_size=8).digest()
