"""The scheduler's client of the kvstore: block allocation, prefix reuse and the arena mapping."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn, TypeVar

import grpc
import torch
from opentelemetry import trace

from zerolayer.checkpoints.dtypes import torch_dtype
from zerolayer.common.convert import (
    allocate_request_to_pb,
    allocate_response_from_pb,
    arena_info_from_pb,
    arena_request_to_pb,
    commit_blocks_request_to_pb,
    free_request_to_pb,
    get_stats_request_to_pb,
    kv_recovering_from_pb,
    lookup_prefix_request_to_pb,
    lookup_prefix_response_from_pb,
    reconcile_request_to_pb,
    reconcile_result_from_pb,
)
from zerolayer.common.device import CPU, Device
from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.common.status import reason_of
from zerolayer.common.tracing import Tracing
from zerolayer.kv.arena_file import map_arena
from zerolayer.kv.arena_info import ArenaInfo
from zerolayer.kv.arena_layout import ArenaLayout
from zerolayer.kv.commit import CommitEntry
from zerolayer.kv.owner import DEFAULT_OWNER, OwnerRef
from zerolayer.kv.stats import PrefixHit, PrefixLookup
from zerolayer.scheduler.core.kv_cache_manager import ArenaChanged, KVLeaseLost, KVStoreUnavailable
from zerolayer.scheduler.kv_owner_client import KVOwner
from zerolayer.sharing.handle_kinds import importer_kinds
from zerolayer.sharing.manifest import HandleKind
from zerolayer.v1 import kvstore_pb2_grpc

T = TypeVar("T")

UNUSABLE_CODES = (
    grpc.StatusCode.UNAVAILABLE,
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.CANCELLED,
)
"""Down, restarting, or restarted and not reconciled yet: all mean "try again later"."""


class KVStoreError(RuntimeError):
    """The kvstore refused a call for a reason retrying will not fix (e.g. it was restarted with
    a smaller arena, so a held block id is out of range); the message names the method and the
    status, without the gRPC exception's repr."""


class KVStoreClient:
    """Blocking client used from the engine thread (implements ``BlockAllocator``)."""

    def __init__(
        self,
        address: str,
        timeout_s: float = 3.0,
        tracing: Tracing | None = None,
        probe_timeout_s: float = 1.0,
        device: Device = CPU,
        owner_id: str = "",
    ) -> None:
        """
        Args:
            address: the kvstore's gRPC address.
            timeout_s: deadline of each block call, seconds (a local kvstore answers in
                milliseconds; the engine thread waits this long on a hung one).
            probe_timeout_s: deadline of Reconcile and the GetArena after it, seconds: the
                calls that probe a kvstore already found unusable.
            tracing: CLIENT spans for calls made inside a traced request.
            device: where the model computes; the arena must be mappable there (the kvstore's
                shared-memory file on CPU, its device memory on the same GPU).
            owner_id: who this scheduler is to the kvstore (it registers at its first
                :meth:`reconcile` and keeps a lease alive, see
                :mod:`zerolayer.scheduler.kv_owner_client`); "": the default owner, which never
                registers (one scheduler per kvstore).

        Raises:
            grpc.RpcError: the kvstore did not answer GetArena within 60 s, or offers no handle
                kind this device can map (FAILED_PRECONDITION).
        """
        self._tracing = tracing
        self._device = device
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        self._timeout_s = timeout_s
        self._probe_timeout_s = probe_timeout_s
        self._owner = KVOwner(self._stub, owner_id, probe_timeout_s) if owner_id else None
        self._arena_allocation: object | None = None
        # NOTE: a GPU scheduler maps only device arenas: the KV cache in host memory would put
        # every attention read on the PCIe bus. (Probed once: the kinds need driver queries.)
        self._accepted_kinds = (
            [k for k in importer_kinds(str(device)) if k != HandleKind.MMAP_FILE]
            if device.is_cuda
            else [HandleKind.MMAP_FILE]
        )
        self.arena_info = self._get_arena()
        self.num_blocks_total = self.arena_info.layout.num_blocks

    def _get_arena(self) -> ArenaInfo:
        request = arena_request_to_pb(self._accepted_kinds)
        with self._traced("GetArena") as metadata:
            response = self._stub.GetArena(
                request, timeout=60.0, wait_for_ready=True, metadata=metadata
            )
        return arena_info_from_pb(response)

    @property
    def layout(self) -> ArenaLayout:
        """Geometry of the arena."""
        return self.arena_info.layout

    def map(self) -> torch.Tensor:
        """Maps the arena: [num_layers, 2, num_blocks, block_size, Hkv, D], on this client's
        device (the shared-memory file on CPU; the kvstore's device memory on a GPU).

        Raises:
            ValueError / RuntimeError: the device memory cannot be imported (see
                :func:`zerolayer.scheduler.model.device_import.import_device_memory`).
        """
        info = self.arena_info
        if info.device_memory is None:
            return map_arena(info.shm_path, self.layout)
        from zerolayer.scheduler.model.device_import import import_device_memory

        allocation = import_device_memory(info.device_memory, self._device)
        # NOTE: the tensor holds the allocation; the previous arena's mapping is released when
        # its tensors are gone (after an ArenaChanged).
        self._arena_allocation = allocation
        return allocation.as_tensor(torch_dtype(info.layout.dtype), self.layout.shape)

    @contextmanager
    def _traced(self, method: str) -> Iterator[list[tuple[str, str]] | None]:
        """A CLIENT span and its metadata when the call belongs to a traced request or to the
        start-up (a span is current: the start-up's "map kv arena", a request's context load, or
        its SERVER span around a call made for it alone, see
        :meth:`zerolayer.scheduler.request_trace.RequestTrace.attached`). Calls outside one are
        not traced: the per-step CommitBlocks (one call for the blocks of every request that
        filled one), reconciles and the lease's keep-alive belong to no single request."""
        if self._tracing is None or not trace.get_current_span().get_span_context().is_valid:
            yield None
            return
        with self._tracing.client_span(f"/zerolayer.v1.KVStore/{method}") as metadata:
            yield metadata

    def _owner_ref(self) -> OwnerRef:
        """Who the block calls are made as.

        Raises:
            KVLeaseLost: the lease is lost (the next :meth:`reconcile` registers again).
        """
        if self._owner is None:
            return DEFAULT_OWNER
        ref = self._owner.ref
        if ref is None:
            raise KVLeaseLost(f"kvstore lease of owner {self._owner.owner_id!r} lost")
        return ref

    def _call(
        self, method: str, request: object, owner: OwnerRef, timeout_s: float | None = None
    ) -> T:
        try:
            with self._traced(method) as metadata:
                rpc: Callable[..., T] = getattr(self._stub, method)
                return rpc(request, timeout=timeout_s or self._timeout_s, metadata=metadata)
        except grpc.RpcError as exc:
            self._raise_for(method, exc, owner)

    def _raise_for(self, method: str, exc: grpc.RpcError, owner: OwnerRef) -> NoReturn:
        """Raises what a failed call of ``owner`` means to the engine.

        Raises:
            KVLeaseLost: the kvstore no longer counts this owner's references (see
                :mod:`zerolayer.scheduler.kv_owner_client`).
            KVStoreUnavailable: try again later (down, restarting, recovering, not reconciled).
            KVStoreError: anything else.
        """
        message = f"{exc.code().name}: {exc.details()}"
        if self._owner is not None and self._owner.refused(owner, reason_of(exc)):
            raise KVLeaseLost(message) from None
        if exc.code() in UNUSABLE_CODES:
            raise KVStoreUnavailable(message) from None
        raise KVStoreError(f"kvstore {method}: {message}") from None

    def lease_lost(self) -> bool:
        """True when this scheduler's references at the kvstore are gone (its lease expired, a
        newer epoch of its owner id exists, or the kvstore restarted): the blocks its requests
        hold are no longer its own. Always False for the default owner."""
        return self._owner is not None and self._owner.lost()

    def allocate(
        self, num_blocks: int, admitted_lookup: PrefixLookup | None = None
    ) -> list[int] | None:
        """Takes blocks; None when the pool has too few free. When they are taken, the kvstore
        counts ``admitted_lookup`` (the prefix lookup of the request they admit).

        Raises:
            KVStoreUnavailable: the kvstore is down, restarting or not reconciled.
            KVLeaseLost: this scheduler's lease is lost.
        """
        owner = self._owner_ref()
        try:
            with self._traced("Allocate") as metadata:
                response = self._stub.Allocate(
                    allocate_request_to_pb(num_blocks, owner, admitted_lookup),
                    timeout=self._timeout_s,
                    metadata=metadata,
                )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return None
            self._raise_for("Allocate", exc, owner)
        return allocate_response_from_pb(response)

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block. Raises KVStoreUnavailable, KVLeaseLost."""
        owner = self._owner_ref()
        self._call("Free", free_request_to_pb(block_ids, owner), owner)

    def lookup(self, token_ids: Sequence[int], cache_salt: str, counted: bool) -> PrefixHit:
        """The longest cached prefix: its blocks, referenced, and how many a pin holds. Counted
        now if ``counted``, else by the :meth:`allocate` admitting the request. Raises
        KVStoreUnavailable, KVLeaseLost."""
        owner = self._owner_ref()
        request = lookup_prefix_request_to_pb(token_ids, cache_salt, owner, not counted)
        return lookup_prefix_response_from_pb(self._call("LookupPrefix", request, owner))

    def commit(self, entries: Sequence[CommitEntry]) -> None:
        """Registers full blocks. Raises KVStoreUnavailable, KVLeaseLost."""
        owner = self._owner_ref()
        self._call("CommitBlocks", commit_blocks_request_to_pb(entries, owner), owner)

    def reconcile(self, held_block_ids: list[int]) -> int:
        """Declares every block reference this scheduler holds; returns how many changed.
        Registers first when this scheduler has an owner id and is not registered (its first
        call, or its lease is lost: then it must hold nothing).

        Raises:
            KVStoreUnavailable: the kvstore is down.
            KVLeaseLost: the lease is lost and ``held_block_ids`` is not empty (drop them first).
            ArenaChanged: the kvstore now serves another arena (its file was recreated); the
                new one is mapped and carried by the exception.
        """
        owner = self._register_if_needed(held_block_ids)
        request = reconcile_request_to_pb(held_block_ids, owner)
        response = self._call("Reconcile", request, owner, self._probe_timeout_s)
        arena_request = arena_request_to_pb(self._accepted_kinds)
        arena_pb = self._call("GetArena", arena_request, owner, self._probe_timeout_s)
        arena = arena_info_from_pb(arena_pb)
        if arena.arena_id != self.arena_info.arena_id:
            self.arena_info = arena
            raise ArenaChanged(self.map())
        return reconcile_result_from_pb(response).num_blocks_changed

    def _register_if_needed(self, held_block_ids: list[int]) -> OwnerRef:
        """The owner to reconcile as: registers first when not registered. After a kvstore
        restart the held blocks are kept only if the kvstore still recovers once registered
        (no block can be handed out before this owner reconciles then); otherwise they are lost.

        Raises:
            KVLeaseLost: the held blocks are no longer this scheduler's.
            KVStoreUnavailable: the kvstore did not answer.
        """
        owner = self._owner
        if owner is None:
            return DEFAULT_OWNER
        ref = owner.ref
        if ref is not None:
            return ref
        if owner.lost_reason and held_block_ids:
            raise KVLeaseLost(
                f"kvstore lease of owner {owner.owner_id!r} lost ({owner.lost_reason}); "
                f"{len(held_block_ids)} block reference(s) are no longer held"
            )
        try:
            ref = owner.register()
            if held_block_ids:
                stats = self._stub.GetStats(
                    get_stats_request_to_pb(), timeout=self._probe_timeout_s
                )
        except grpc.RpcError as exc:
            self._raise_for("RegisterOwner", exc, DEFAULT_OWNER)
        if held_block_ids and not kv_recovering_from_pb(stats):
            owner.lose("the kvstore restarted and recovered without this owner")
            raise KVLeaseLost(f"kvstore lease of owner {owner.owner_id!r} lost")
        return ref

    def close(self) -> None:
        """Stops the keep-alive, unregisters (if registered) and closes the channel."""
        if self._owner is not None:
            self._owner.close()
        self._channel.close()
