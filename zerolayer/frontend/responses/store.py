"""The stored responses of ``/v1/responses`` (``store: true``): what ``previous_response_id``
continues and ``GET``/``DELETE /v1/responses/{id}`` read and remove.

Kept in the frontend process's memory: a restart forgets them, and with several frontends a
response is found only on the one that stored it. Bounded in number and age (``--responses-max-
stored``, ``--responses-max-age-s``): the oldest goes first. Each belongs to its tenant; to anyone
else it does not exist (the same NotFound as a missing one). A dropped entry is no longer
referenced by the store (what it held is freed), and :attr:`ResponseStore.on_drop` is told why.
Entries past the max age are dropped by every call of the store and, inside an event loop, by a
timer set for the oldest one's expiry, so that an idle frontend frees them too.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from zerolayer.common.errors import NotFound

EXPIRY_SLACK_S = 0.01
"""How long after an entry's expiry its timer fires, seconds (the loop's clock and the store's
may differ by rounding)."""


class ResponseNotFound(NotFound):
    """No stored response of that id for this caller (missing, dropped, or another tenant's:
    the same answer)."""

    def __init__(self, param: str, response_id: str) -> None:
        super().__init__(f"{param}: no stored response {response_id[:64]!r}")
        self.param = param
        """The request's field that named it (``previous_response_id``, ``response_id``)."""


class DropReason(enum.Enum):
    """Why a stored response left the store."""

    EVICTED = "evicted"
    """The store was full: the oldest made room for a new one."""
    EXPIRED = "expired"
    """Older than the store's max age."""
    DELETED = "deleted"
    """``DELETE /v1/responses/{id}``."""


@dataclass(frozen=True)
class StoredResponse:
    """One stored response and the conversation that led to it."""

    response_id: str
    """``resp_<32 hex digits>``."""
    tenant: str
    """Its owner (zerolayer.frontend.tenants); "": callers are not identified."""
    body: dict
    """The response object, as ``GET`` returns it."""
    input_items: tuple[dict, ...]
    """The input items of its request alone (``GET .../input_items``)."""
    conversation: tuple[dict, ...]
    """Every item of the conversation, in order: the previous responses' inputs and outputs,
    this request's input, its output items. Items are shared with the previous entry, not
    copied."""
    stored_at: float = 0.0
    """The store's clock when it was stored, seconds."""
    pin_ids: tuple[str, ...] = ()
    """The kvstore pins that hold its context's KV (released when it is dropped)."""


class ResponseStore:
    """Stored responses by id, oldest first; every call first drops those past the max age."""

    def __init__(
        self,
        max_responses: int,
        max_age_s: float,
        on_drop: Callable[[StoredResponse, DropReason], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Args:
        max_responses: most entries kept (> 0); a new one beyond it drops the oldest.
        max_age_s: an entry older than this, seconds, is dropped.
        on_drop: told of every entry that leaves the store, and why (issue 31 unpins the KV
            of a stored conversation there); it must not raise.
        clock: seconds, monotonic.
        """
        self.max_responses = max_responses
        self.max_age_s = max_age_s
        self.on_drop = on_drop
        self._clock = clock
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()
        self._timer: asyncio.TimerHandle | None = None

    def __len__(self) -> int:
        self._expire()
        return len(self._entries)

    def now(self) -> float:
        """The store's clock, seconds (``stored_at`` of an entry made now)."""
        return self._clock()

    def put(self, entry: StoredResponse) -> None:
        """Stores ``entry`` as the newest (its ``stored_at`` must be :meth:`now`'s); drops the
        oldest while there are more than ``max_responses``."""
        self._expire()
        self._entries[entry.response_id] = entry
        while len(self._entries) > self.max_responses:
            _, oldest = self._entries.popitem(last=False)
            self._dropped(oldest, DropReason.EVICTED)
        self._set_timer()

    def get(self, tenant: str, response_id: str, param: str = "response_id") -> StoredResponse:
        """The entry ``response_id`` of ``tenant``.

        Raises:
            ResponseNotFound: none (missing, expired, dropped, or another tenant's), naming
                ``param``.
        """
        self._expire()
        entry = self._entries.get(response_id)
        if entry is None or entry.tenant != tenant:
            raise ResponseNotFound(param, response_id)
        return entry

    def delete(self, tenant: str, response_id: str) -> StoredResponse:
        """Removes and returns the entry ``response_id`` of ``tenant``.

        Raises:
            ResponseNotFound: as :meth:`get`.
        """
        entry = self.get(tenant, response_id)
        del self._entries[response_id]
        self._dropped(entry, DropReason.DELETED)
        return entry

    def _expire(self) -> None:
        oldest_kept = self._clock() - self.max_age_s
        while self._entries:
            entry = next(iter(self._entries.values()))
            if entry.stored_at >= oldest_kept:
                return
            del self._entries[entry.response_id]
            self._dropped(entry, DropReason.EXPIRED)

    def _set_timer(self) -> None:
        """Sets the timer of the oldest entry's expiry, unless one is set, the store is empty,
        or no event loop runs here (then the next call drops it)."""
        if self._timer is not None or not self._entries:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        oldest = next(iter(self._entries.values()))
        delay = oldest.stored_at + self.max_age_s - self._clock()
        self._timer = loop.call_later(max(delay, 0.0) + EXPIRY_SLACK_S, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._expire()
        self._set_timer()

    def _dropped(self, entry: StoredResponse, reason: DropReason) -> None:
        if self.on_drop is not None:
            self.on_drop(entry, reason)
