"""The scheduler as a kvstore owner (KVStoreClient with an owner id, KVOwner), against a scripted
KVStore gRPC server: registration, keep-alives, refusals that lose the lease, and a kvstore
restart that keeps or loses the held blocks."""

from __future__ import annotations

import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from zerolayer.scheduler.core.kv_cache_manager import KVLeaseLost, KVStoreUnavailable
from zerolayer.scheduler.kv_client import KVStoreClient
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc

LEASE_MS = 300


class ScriptedKVStore(kvstore_pb2_grpc.KVStoreServicer):
    def __init__(self) -> None:
        self.epoch = 0
        self.refuse = ""
        """A reason every owner call but RegisterOwner and GetStats is refused with."""
        self.recovering = False
        self.calls: list[tuple[str, str, int]] = []
        self.reconciled: list[tuple[int, list[int]]] = []

    def _check(self, method: str, owner: kvstore_pb2.OwnerRef, context) -> None:
        self.calls.append((method, owner.owner_id, owner.epoch))
        if self.refuse:
            context.abort_with_status(_Status(self.refuse))

    def GetArena(self, request, context):  # noqa: N802 - gRPC method name
        return kvstore_pb2.ArenaInfo(arena_id="a", num_blocks=8, block_size=16)

    def RegisterOwner(self, request, context):  # noqa: N802
        self.epoch += 1
        self.refuse = ""
        self.calls.append(("RegisterOwner", request.owner_id, self.epoch))
        return kvstore_pb2.RegisterOwnerResponse(epoch=self.epoch, lease_ms=LEASE_MS)

    def KeepAlive(self, request, context):  # noqa: N802
        self._check("KeepAlive", request.owner, context)
        return kvstore_pb2.KeepAliveResponse(lease_ms=LEASE_MS)

    def UnregisterOwner(self, request, context):  # noqa: N802
        self._check("UnregisterOwner", request.owner, context)
        return kvstore_pb2.UnregisterOwnerResponse()

    def Reconcile(self, request, context):  # noqa: N802
        self._check("Reconcile", request.owner, context)
        self.reconciled.append((request.owner.epoch, list(request.held_block_ids)))
        return kvstore_pb2.ReconcileResponse(recovering=self.recovering)

    def Allocate(self, request, context):  # noqa: N802
        self._check("Allocate", request.owner, context)
        return kvstore_pb2.AllocateResponse(block_ids=[3])

    def GetStats(self, request, context):  # noqa: N802
        return kvstore_pb2.KVStats(recovering=self.recovering)


class _Status(grpc.Status):
    def __init__(self, reason: str) -> None:
        self.code = grpc.StatusCode.FAILED_PRECONDITION
        self.details = f"refused: {reason}"
        self.trailing_metadata = (("zerolayer-reason", reason),)


@pytest.fixture
def kvstore(tmp_path: Path):
    servicer = ScriptedKVStore()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(servicer, server)
    address = f"unix:{tmp_path / 'kv.sock'}"
    server.add_insecure_port(address)
    server.start()
    yield servicer, address
    server.stop(0)


def test_registers_at_the_first_reconcile_keeps_alive_and_unregisters(kvstore) -> None:
    servicer, address = kvstore
    client = KVStoreClient(address, owner_id="sched-a")
    client.reconcile([])
    assert client.allocate(1) == [3]
    time.sleep(LEASE_MS / 1000)
    assert not client.lease_lost()
    client.close()
    methods = [c[0] for c in servicer.calls]
    assert methods[:3] == ["RegisterOwner", "Reconcile", "Allocate"]
    assert methods.count("KeepAlive") >= 2 and methods[-1] == "UnregisterOwner"
    assert {c[1:] for c in servicer.calls} == {("sched-a", 1)}


def test_an_expired_lease_is_lost_until_it_registers_again_holding_nothing(kvstore) -> None:
    servicer, address = kvstore
    client = KVStoreClient(address, owner_id="sched-a")
    client.reconcile([])
    servicer.refuse = "owner-lease-expired"
    with pytest.raises(KVLeaseLost):
        client.allocate(1)
    assert client.lease_lost()
    with pytest.raises(KVLeaseLost):
        client.allocate(1)  # not sent: the lease is lost here
    with pytest.raises(KVLeaseLost):
        client.reconcile([3])  # its blocks are not its own any more
    client.reconcile([])
    assert not client.lease_lost()
    assert servicer.reconciled == [(1, []), (2, [])]
    assert client.allocate(1) == [3]
    assert servicer.calls[-1] == ("Allocate", "sched-a", 2)
    client.close()


def test_a_stale_epoch_found_by_the_keep_alive_loses_the_lease(kvstore) -> None:
    servicer, address = kvstore
    client = KVStoreClient(address, owner_id="sched-a")
    client.reconcile([])
    servicer.refuse = "owner-epoch-stale"
    deadline = time.monotonic() + 5
    while not client.lease_lost() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert client.lease_lost()
    client.close()


@pytest.mark.parametrize("recovering", [True, False])
def test_after_a_kvstore_restart_the_blocks_are_kept_only_while_it_recovers(
    kvstore, recovering: bool
) -> None:
    servicer, address = kvstore
    client = KVStoreClient(address, owner_id="sched-a")
    client.reconcile([])
    servicer.refuse = "owner-not-registered"
    servicer.recovering = recovering
    with pytest.raises(KVStoreUnavailable) as info:
        client.allocate(1)
    assert type(info.value) is KVStoreUnavailable  # not lost (yet): reconcile
    assert not client.lease_lost()
    if recovering:
        client.reconcile([3, 4])  # registers again and declares what it holds
        assert servicer.reconciled[-1] == (2, [3, 4])
        assert not client.lease_lost()
    else:
        with pytest.raises(KVLeaseLost):
            client.reconcile([3, 4])  # blocks may be handed out already: recompute
        assert client.lease_lost()
        client.reconcile([])
        assert servicer.reconciled[-1] == (3, [])
    client.close()


def test_without_an_owner_id_the_client_is_the_default_owner(kvstore) -> None:
    servicer, address = kvstore
    client = KVStoreClient(address)
    client.reconcile([1])
    assert client.allocate(1) == [3]
    client.close()
    assert servicer.calls == [("Reconcile", "", 0), ("Allocate", "", 0)]
