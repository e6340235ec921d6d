"""The scheduler's client of the kvstore: block allocation and the arena mapping."""

from __future__ import annotations

import grpc
import torch

from services.common.server import CHANNEL_OPTIONS
from services.kvstore.arena import ArenaLayout, map_arena
from zerolayer.v1 import kvstore_pb2, kvstore_pb2_grpc


class KVStoreClient:
    """Blocking client used from the engine thread (implements ``BlockAllocator``)."""

    def __init__(self, address: str, timeout_s: float = 10.0) -> None:
        self._channel = grpc.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        self._timeout_s = timeout_s
        self.arena_info = self._stub.GetArena(
            kvstore_pb2.GetArenaRequest(), timeout=60.0, wait_for_ready=True
        )
        self.num_blocks_total = self.arena_info.num_blocks

    @property
    def layout(self) -> ArenaLayout:
        """Geometry of the arena."""
        a = self.arena_info
        return ArenaLayout(
            num_layers=a.num_layers,
            num_kv_heads=a.num_kv_heads,
            head_dim=a.head_dim,
            block_size=a.block_size,
            dtype=a.dtype,
            num_blocks=a.num_blocks,
        )

    def map(self) -> torch.Tensor:
        """Maps the arena's shared-memory file: [num_layers, 2, num_blocks, block_size, Hkv, D]."""
        return map_arena(self.arena_info.shm_path, self.layout)

    def allocate(self, num_blocks: int) -> list[int] | None:
        """Takes blocks; None when the pool has too few free.

        Raises:
            grpc.RpcError: the kvstore is unreachable (UNAVAILABLE) or failed.
        """
        try:
            response = self._stub.Allocate(
                kvstore_pb2.AllocateRequest(num_blocks=num_blocks), timeout=self._timeout_s
            )
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                return None
            raise
        return list(response.block_ids)

    def free(self, block_ids: list[int]) -> None:
        """Drops one reference from each block.

        Raises:
            grpc.RpcError: the kvstore is unreachable or rejected the ids.
        """
        self._stub.Free(kvstore_pb2.FreeRequest(block_ids=block_ids), timeout=self._timeout_s)

    def reconcile(self, held_block_ids: list[int]) -> int:
        """Declares every block reference this scheduler holds; returns how many changed.

        Raises:
            grpc.RpcError: the kvstore is unreachable or rejected the ids.
        """
        response = self._stub.Reconcile(
            kvstore_pb2.ReconcileRequest(held_block_ids=held_block_ids), timeout=self._timeout_s)
        return response.num_blocks_changed

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()
