"""The frontend's scheduler client tells a scheduler that went away (SchedulerLost, with whether
it may have carried the request) from one that answered UNAVAILABLE itself. A real aio server on
a unix socket stands in for the scheduler."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import pytest
from factories import make_engine_request

from zerolayer.common.errors import SchedulerLost, Unavailable
from zerolayer.common.status import ANSWERED_METADATA
from zerolayer.frontend.routing.scheduler_client import SchedulerClient, scheduler_channel_options
from zerolayer.v1 import scheduler_pb2, scheduler_pb2_grpc


class FakeScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Answers UNAVAILABLE as a handler would (``answer``, with ``details``), or sends one output
    and dies."""

    def __init__(self, answer: bool, details: str = "kvstore: down") -> None:
        self.answer = answer
        self.details = details
        self.server: grpc.aio.Server | None = None

    async def Generate(self, request, context):
        if self.answer:
            await context.abort(
                grpc.StatusCode.UNAVAILABLE, self.details, trailing_metadata=(ANSWERED_METADATA,)
            )
        yield scheduler_pb2.EngineOutput(new_token_ids=[7], num_prompt_tokens=3)
        asyncio.get_running_loop().create_task(self.server.stop(0))
        await asyncio.sleep(10)


async def generate_with(
    address: str, scheduler: FakeScheduler | None, token_ids: list[int] | None = None
) -> None:
    """Runs one Generate through a SchedulerClient, collecting the tokens into ``token_ids``."""
    server = None
    if scheduler is not None:
        server = scheduler.server = grpc.aio.server()
        scheduler_pb2_grpc.add_SchedulerServicer_to_server(scheduler, server)
        server.add_insecure_port(address)
        await server.start()
    client = SchedulerClient(address, hung_after_s=5.0)
    try:
        async for output in client.generate(make_engine_request(), timeout_s=5):
            if token_ids is not None:
                token_ids.extend(output.new_token_ids)
    finally:
        await client.close()
        if server is not None:
            await server.stop(0)


def test_a_scheduler_that_dies_after_an_output_was_carrying_the_request(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 's.sock'}"
    token_ids: list[int] = []
    with pytest.raises(SchedulerLost) as info:
        asyncio.run(generate_with(address, FakeScheduler(answer=False), token_ids))
    assert info.value.carrying is True
    assert token_ids == [7]
    assert str(info.value).startswith(f"scheduler {address}: ")


def test_an_unreachable_scheduler_never_had_the_request(tmp_path: Path) -> None:
    with pytest.raises(SchedulerLost) as info:
        asyncio.run(generate_with(f"unix:{tmp_path / 'nobody.sock'}", None))
    assert info.value.carrying is False


def test_unavailable_answered_by_the_scheduler_is_not_a_lost_scheduler(tmp_path: Path) -> None:
    with pytest.raises(Unavailable) as info:
        asyncio.run(generate_with(f"unix:{tmp_path / 's.sock'}", FakeScheduler(answer=True)))
    assert not isinstance(info.value, SchedulerLost)
    assert str(info.value) == "scheduler: kvstore: down"


@pytest.mark.parametrize(
    ("details", "public"),
    [
        ("scheduler: the engine is still starting", "scheduler: the engine is still starting"),
        (
            "kvstore: unusable for more than 2 s (UNAVAILABLE: failed to connect to all addresses;"
            " last error: UNKNOWN: unix:/tmp/zerolayer-x1/kvstore.sock: No such file or directory)",
            "scheduler: kvstore: unusable for more than 2 s (UNAVAILABLE: failed to connect to all"
            " addresses; last error: UNKNOWN: <internal>: No such file or directory)",
        ),
    ],
)
def test_unavailable_answered_by_the_scheduler_reaches_clients_without_internals(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, details: str, public: str
) -> None:
    address = f"unix:{tmp_path / 's.sock'}"
    with pytest.raises(Unavailable) as info:
        asyncio.run(generate_with(address, FakeScheduler(answer=True, details=details)))
    assert str(info.value) == public  # the prefix once, no socket path
    assert f"scheduler {address} answered UNAVAILABLE: {details}" in caplog.messages


def test_a_scheduler_that_starts_listening_is_connected_within_100_ms() -> None:
    # NOTE: with CHANNEL_OPTIONS' 1 s, a scheduler that listens after its torch import (seconds
    # after the frontend) was seen up to a second late by ``zerolayer up`` (issue 18, cold start)
    options = dict(scheduler_channel_options(hung_after_s=2.5))
    assert len(options) == len(scheduler_channel_options(2.5))  # gRPC would take the first
    assert options["grpc.max_reconnect_backoff_ms"] == 100
    assert options["grpc.keepalive_time_ms"] == 1000
    # --scheduler-hung-after-s: the ping timeout that ends a hung scheduler's connection
    assert options["grpc.keepalive_timeout_ms"] == options["grpc.http2.ping_timeout_ms"] == 2500
