"""KVStoreClient's mapping of kvstore statuses, against a scripted KVStore gRPC server (a unit
test of the client; the real kvstore is exercised end to end in tests/e2e)."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
import pytest

from zerolayer.scheduler.core.kv_cache_manager import KVStoreUnavailable
from zerolayer.scheduler.kv_client import KVStoreClient, KVStoreError
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


class ScriptedKVStore(kvstore_pb2_grpc.KVStoreServicer):
    def GetArena(self, request, context):  # noqa: N802 - gRPC method name
        return kvstore_pb2.ArenaInfo(arena_id="a", num_blocks=4, block_size=16)

    def Reconcile(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, "held_block_ids: 4 is out of range")

    def Allocate(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.UNAVAILABLE, "restarting")

    def Free(self, request, context):  # noqa: N802
        context.abort(grpc.StatusCode.INTERNAL, "boom")


@pytest.fixture
def client(tmp_path: Path):
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(ScriptedKVStore(), server)
    address = f"unix:{tmp_path / 'kv.sock'}"
    server.add_insecure_port(address)
    server.start()
    client = KVStoreClient(address)
    yield client
    client.close()
    server.stop(0)


def test_a_refusal_is_a_kvstore_error_naming_method_and_status(client) -> None:
    with pytest.raises(KVStoreError) as info:
        client.reconcile([0, 4])
    assert (
        str(info.value) == "kvstore Reconcile: INVALID_ARGUMENT: held_block_ids: 4 is out of range"
    )
    with pytest.raises(KVStoreError, match="^kvstore Free: INTERNAL: boom$"):
        client.free([1])


def test_unavailable_is_retryable(client) -> None:
    with pytest.raises(KVStoreUnavailable, match="^UNAVAILABLE: restarting$"):
        client.allocate(2)
