"""The frontend's asynchronous client of the scheduler."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import nullcontext

import grpc

from zerolayer.common.convert import (
    block_size_from_stats_pb,
    engine_request_to_pb,
    request_output_from_pb,
    scheduler_stats_request_to_pb,
)
from zerolayer.common.errors import Unavailable
from zerolayer.common.generation import EngineRequest, RequestOutput
from zerolayer.common.server import CHANNEL_OPTIONS
from zerolayer.common.status import answered_by_handler
from zerolayer.common.tracing import Tracing
from zerolayer.v1 import scheduler_pb2_grpc


class SchedulerClient:
    """Streams engine outputs; closing the stream early cancels the call, which aborts the request
    in the scheduler and frees its KV blocks."""

    def __init__(
        self, address: str, connect_grace_s: float = 2.0, tracing: Tracing | None = None
    ) -> None:
        """
        Args:
            address: the scheduler's gRPC address.
            connect_grace_s: how long a call retries while the scheduler is unreachable (e.g.
                restarting) before UNAVAILABLE; retrying is safe because nothing was sent yet.
            tracing: a CLIENT span around each call, its context sent in the call's metadata.
        """
        self._connect_grace_s = connect_grace_s
        self._tracing = tracing
        self._channel = grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
        self._stub = scheduler_pb2_grpc.SchedulerStub(self._channel)

    async def generate(
        self, request: EngineRequest, timeout_s: float | None
    ) -> AsyncIterator[RequestOutput]:
        """Yields the request's outputs until the finished one.

        Raises:
            Unavailable: the scheduler cannot be reached.
            grpc.aio.AioRpcError: the scheduler rejected the request (INVALID_ARGUMENT,
                RESOURCE_EXHAUSTED) or the deadline passed.
        """
        with (
            self._tracing.client_span("/zerolayer.v1.Scheduler/Generate")
            if self._tracing is not None
            else nullcontext(None)
        ) as metadata:
            async for output in self._generate(request, timeout_s, metadata):
                yield output

    async def _generate(
        self,
        request: EngineRequest,
        timeout_s: float | None,
        metadata: list[tuple[str, str]] | None,
    ) -> AsyncIterator[RequestOutput]:
        start = time.monotonic()
        give_up = start + self._connect_grace_s
        while True:
            remaining = (
                None if timeout_s is None else max(timeout_s - (time.monotonic() - start), 0.001)
            )
            call = self._stub.Generate(
                engine_request_to_pb(request), timeout=remaining, metadata=metadata
            )
            received = False
            try:
                async for pb in call:
                    received = True
                    yield request_output_from_pb(request.request_id, pb)
                return
            except grpc.aio.AioRpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                # NOTE: only an unreachable scheduler (restarting) is retried; one that answered
                # UNAVAILABLE itself (its kvstore is down, its GPU failed) has said no.
                if received or answered_by_handler(exc) or time.monotonic() > give_up:
                    raise Unavailable(f"scheduler: {exc.details()}") from None
            finally:
                call.cancel()
            await asyncio.sleep(0.1)

    async def block_size(self) -> int:
        """The KV block size the scheduler runs with (0 if it is unreachable)."""
        try:
            stats = await self._stub.GetStats(scheduler_stats_request_to_pb(), timeout=5)
        except grpc.aio.AioRpcError:
            return 0
        return block_size_from_stats_pb(stats)

    async def close(self) -> None:
        """Closes the channel."""
        await self._channel.close()
