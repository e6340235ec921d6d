"""This scheduler as an owner of kvstore block references: its registration (owner id, epoch),
the lease a keep-alive thread renews, and the notice that the lease is lost.

The lease is lost when the kvstore refuses a call of this owner as ``owner-lease-expired`` or
``owner-epoch-stale``. A lost lease means the blocks this scheduler held are no longer its own:
the engine drops them and recomputes its running requests, then registers again (a new epoch)
and reconciles with nothing held. So that the engine never writes into blocks it may have lost
(e.g. after this process was stopped for longer than a lease), :meth:`KVOwner.lost` asks the
kvstore itself (a keep-alive on the engine thread) once no keep-alive succeeded for
:data:`LOCAL_EXPIRY_FRACTION` of the lease. A kvstore that does not answer is down or hung: it
releases nothing meanwhile (a restarted one recovers first; a hung one extends every lease by
its stall), so the blocks stay in use.

``owner-not-registered`` means the kvstore restarted: the blocks are kept if this owner registers
again while the kvstore still recovers (it hands out no block before every registered owner
reconciled), see :meth:`zerolayer.scheduler.kv_client.KVStoreClient.reconcile`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import grpc

from zerolayer.common.convert import (
    keep_alive_request_to_pb,
    register_owner_request_to_pb,
    registration_from_pb,
    unregister_owner_request_to_pb,
)
from zerolayer.common.status import reason_of
from zerolayer.kv.owner import EPOCH_STALE, LEASE_EXPIRED, NOT_REGISTERED, OwnerRef
from zerolayer.v1 import kvstore_pb2_grpc

log = logging.getLogger(__name__)

LOST_REASONS = frozenset({LEASE_EXPIRED, EPOCH_STALE})
"""Refusal reasons after which this owner's references are gone (see the module note)."""

LOCAL_EXPIRY_FRACTION = 2 / 3
"""Share of the lease after the last successful keep-alive's send from which :meth:`KVOwner.lost`
asks the kvstore (keep-alives go every third of a lease, so one may be missed)."""


class KVOwner:
    """One scheduler's owner registration with its kvstore. Thread-safe: the engine thread
    registers and checks, the keep-alive thread renews."""

    def __init__(
        self,
        stub: kvstore_pb2_grpc.KVStoreStub,
        owner_id: str,
        timeout_s: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """
        Args:
            stub: the kvstore's stub (gRPC channels are thread-safe).
            owner_id: who this scheduler is to the kvstore; not empty.
            timeout_s: deadline of RegisterOwner, UnregisterOwner and each KeepAlive, seconds
                (a keep-alive waits at most a third of the lease).
            clock: seconds, monotonic (tests inject one).

        Raises:
            ValueError: ``owner_id`` is empty (the default owner does not register).
        """
        if not owner_id:
            raise ValueError("owner_id: empty; the default owner does not register")
        self.owner_id = owner_id
        self._stub = stub
        self._timeout_s = timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._ref: OwnerRef | None = None
        self._lease_s = 0.0
        self._renewed_at = 0.0
        self._next_probe = 0.0
        self.lost_reason = ""
        """Why the current registration is lost ("" while it holds, or before the first)."""
        self.kvstore_restarted = False
        """The kvstore refused the current registration as not registered (it restarted)."""
        self._stopped = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def ref(self) -> OwnerRef | None:
        """The id and epoch calls carry; None before registering, once the lease is lost, and
        after a kvstore restart (until :meth:`register`)."""
        with self._lock:
            return None if self.lost_reason or self.kvstore_restarted else self._ref

    def lost(self) -> bool:
        """True once the registration is lost (see the module note) until :meth:`register`.
        When no keep-alive succeeded for a while, first sends one on the calling thread (at most
        every third of a lease; it waits at most that long)."""
        with self._lock:
            ref = self._ref
            now = self._clock()
            lapsed = now >= self._renewed_at + self._lease_s * LOCAL_EXPIRY_FRACTION
            probe = (
                ref is not None
                and lapsed
                and not self.lost_reason
                and not self.kvstore_restarted
                and now >= self._next_probe
            )
            if probe:
                self._next_probe = now + self._lease_s / 3
        if probe:
            self._renew(ref)  # type: ignore[arg-type]
        with self._lock:
            return bool(self.lost_reason)

    def lose(self, reason: str) -> None:
        """Marks the current registration lost for ``reason`` (see :meth:`lost`)."""
        with self._lock:
            if not self.lost_reason:
                self._lose(reason)

    def _lose(self, reason: str) -> None:
        log.warning(
            "kvstore lease of %s lost (%s): its blocks are dropped and its running requests "
            "recomputed",
            self._ref,
            reason,
        )
        self.lost_reason = reason

    def refused(self, ref: OwnerRef, reason: str) -> bool:
        """Notes that the kvstore refused a call ``ref`` made with ``reason``; returns True when
        that loses the lease (a reason of :data:`LOST_REASONS` about the current epoch)."""
        if reason == NOT_REGISTERED:
            with self._lock:
                if ref == self._ref and not self.kvstore_restarted:
                    log.warning("the kvstore does not know %s (it restarted)", ref)
                    self.kvstore_restarted = True
            return False
        if reason not in LOST_REASONS:
            return False
        with self._lock:
            if ref == self._ref and not self.lost_reason:
                self._lose(reason)
            return ref == self._ref

    def register(self) -> OwnerRef:
        """Registers (again): a new epoch and a fresh lease; starts the keep-alive thread.

        Raises:
            grpc.RpcError: the kvstore did not answer or refused.
        """
        sent = self._clock()
        response = self._stub.RegisterOwner(
            register_owner_request_to_pb(self.owner_id), timeout=self._timeout_s
        )
        registration = registration_from_pb(response)
        with self._lock:
            self._ref = OwnerRef(self.owner_id, registration.epoch)
            self._lease_s = registration.lease_s
            self._renewed_at = sent
            self.lost_reason = ""
            self.kvstore_restarted = False
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._keep_alive_loop, name="kv-keep-alive", daemon=True
                )
                self._thread.start()
            log.info("registered with the kvstore as %s (lease %g s)", self._ref, self._lease_s)
            return self._ref

    def _keep_alive_loop(self) -> None:
        while not self._stopped.wait(self._lease_s / 3):
            ref = self.ref
            if ref is not None:  # else lost, or the kvstore restarted: the engine registers
                self._renew(ref)

    def _renew(self, ref: OwnerRef) -> None:
        """Sends one keep-alive of ``ref``; notes a success or a refusal. Never raises."""
        sent = self._clock()
        try:
            self._stub.KeepAlive(keep_alive_request_to_pb(ref), timeout=self._lease_s / 3)
        except grpc.RpcError as exc:
            if not self.refused(ref, reason_of(exc)):
                log.debug("keep-alive of %s failed: %s", ref, exc.code())
            return
        with self._lock:
            if self._ref == ref:
                self._renewed_at = max(self._renewed_at, sent)

    def close(self) -> None:
        """Stops the keep-alive thread and unregisters (the kvstore releases this owner's
        references at once instead of after the lease). Never raises."""
        self._stopped.set()
        if self._thread is not None:
            self._thread.join()
        ref = self.ref
        if ref is None:
            return
        try:
            self._stub.UnregisterOwner(unregister_owner_request_to_pb(ref), timeout=self._timeout_s)
        except grpc.RpcError as exc:
            log.info("unregistering %s failed (%s); its lease expires instead", ref, exc.code())
