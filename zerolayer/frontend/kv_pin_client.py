"""The frontend's client of the kvstore's pin calls: the pins that requests ask for
(``GenerateParams.cache_pins``), made after the prompt's blocks are committed, and ended when what
they were made for goes away (a stored response, a removed tenant).

Pins are best effort for a request: a kvstore that cannot be asked (down, restarting, or no
``--pin-kvstore`` given) refuses every pin as :data:`PIN_KVSTORE_UNAVAILABLE` and the request
runs on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import grpc

from zerolayer.common.convert import (
    get_stats_request_to_pb,
    pin_namespaces_from_pb,
    pin_request_to_pb,
    release_namespace_pins_request_to_pb,
    release_namespace_pins_response_from_pb,
    release_pin_request_to_pb,
)
from zerolayer.common.generation import PIN_KVSTORE_UNAVAILABLE
from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.frontend.tenants import namespace_tenant, scoped_cache_salt
from zerolayer.v1 import kvstore_pb2_grpc

log = logging.getLogger(__name__)

PIN_CALL_TIMEOUT_S = 2.0
"""Deadline of one pin call, seconds (a local kvstore answers in milliseconds)."""


@dataclass(frozen=True)
class MadePin:
    """What one Pin call gave: a pin (``pin_id`` set) or a refusal (``refusal`` set)."""

    pin_id: str = ""
    num_tokens: int = 0
    """Tokens the pin holds (whole blocks)."""
    refusal: str = ""
    """``zerolayer.kv.pin``'s refusals, or :data:`PIN_KVSTORE_UNAVAILABLE`."""


class KVPins:
    """Pin, release and namespace release, over one channel to the kvstore (opened on first
    use, on the running event loop)."""

    def __init__(self, address: str) -> None:
        """
        Args:
            address: the kvstore's gRPC address; "": no kvstore (every pin is refused as
                :data:`PIN_KVSTORE_UNAVAILABLE`).
        """
        self.address = address
        self._channel: grpc.aio.Channel | None = None
        self._stub: kvstore_pb2_grpc.KVStoreStub | None = None
        self._releases: set[asyncio.Task] = set()
        """Releases under way (:meth:`release_soon`), kept until done."""

    def _kvstore(self) -> kvstore_pb2_grpc.KVStoreStub:
        if self._stub is None:
            self._channel = grpc.aio.insecure_channel(self.address, options=CHANNEL_OPTIONS)
            self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        return self._stub

    async def pin(
        self,
        token_ids: Sequence[int],
        cache_salt: str,
        ttl_s: float,
        key: str = "",
        budget_namespace: str = "",
    ) -> MadePin:
        """Pins the committed whole blocks of ``token_ids`` under ``cache_salt`` for ``ttl_s``
        seconds, renewed by every later request that reads all of them (Anthropic's semantics);
        a pin with a ``key`` replaces the namespace's earlier pin of that key; it counts against
        ``budget_namespace``'s budget (a tenant's; "": ``cache_salt``'s). Never raises."""
        if not self.address:
            return MadePin(refusal=PIN_KVSTORE_UNAVAILABLE)
        request = pin_request_to_pb(
            token_ids, cache_salt, ttl_s, True, key=key, budget_namespace=budget_namespace
        )
        try:
            answer = await self._kvstore().Pin(request, timeout=PIN_CALL_TIMEOUT_S)
        except grpc.aio.AioRpcError as exc:
            log.info("kvstore Pin failed (%s): the request's pin is refused", exc.code().name)
            return MadePin(refusal=PIN_KVSTORE_UNAVAILABLE)
        return MadePin(answer.pin_id, answer.num_tokens, answer.refusal)

    async def release(self, pin_ids: Sequence[str]) -> None:
        """Ends the pins now (their blocks stay cached, evictable). Never raises: a pin the
        kvstore no longer holds, or a kvstore that cannot be asked, ends by its ttl."""
        if not self.address:
            return
        for pin_id in pin_ids:
            try:
                await self._kvstore().ReleasePin(
                    release_pin_request_to_pb(pin_id), timeout=PIN_CALL_TIMEOUT_S
                )
            except grpc.aio.AioRpcError as exc:
                log.info("kvstore ReleasePin failed (%s): the pin ends by its ttl", exc.code().name)

    def release_soon(self, pin_ids: Sequence[str]) -> None:
        """:meth:`release` in a task of the running loop (for synchronous callers, e.g. a store
        dropping an entry); nothing to do without pins."""
        if pin_ids and self.address:
            task = asyncio.get_running_loop().create_task(self.release(pin_ids))
            self._releases.add(task)
            task.add_done_callback(self._releases.discard)

    async def release_namespaces(self, cache_salt_prefix: str) -> int:
        """Ends every pin of the namespaces whose cache salt starts with ``cache_salt_prefix``;
        returns how many.

        Raises:
            grpc.aio.AioRpcError: the kvstore could not be asked.
        """
        answer = await self._kvstore().ReleaseNamespacePins(
            release_namespace_pins_request_to_pb(cache_salt_prefix), timeout=PIN_CALL_TIMEOUT_S
        )
        return release_namespace_pins_response_from_pb(answer).num_pins

    async def release_other_tenants(self, tenants: set[str]) -> int:
        """Ends the pins of every tenant namespace whose tenant is not in ``tenants`` (a tenant
        removed from the ``--tenants`` file while its pins lived); returns how many. Never
        raises: a kvstore that cannot be asked keeps them until their ttl."""
        if not self.address:
            return 0
        try:
            stats = await self._kvstore().GetStats(
                get_stats_request_to_pb(), timeout=PIN_CALL_TIMEOUT_S
            )
            removed = {namespace_tenant(n) for n in pin_namespaces_from_pb(stats)}
            removed -= {None, *tenants}
            released = 0
            for tenant in sorted(t for t in removed if t is not None):
                released += await self.release_namespaces(scoped_cache_salt(tenant, ""))
        except grpc.aio.AioRpcError as exc:
            log.info("kvstore pins of removed tenants not released (%s)", exc.code().name)
            return 0
        if released:
            log.info("released %d pin(s) of %d removed tenant(s)", released, len(removed))
        return released

    async def close(self) -> None:
        """Closes the channel (if one was opened)."""
        if self._channel is not None:
            await self._channel.close()
