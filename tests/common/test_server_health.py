"""The layer server's health per service (a held service: a standby scheduler's) and its port
shared with the other frontends of one stack (SO_REUSEPORT, each also on its private address)."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_records import without_stale_completions

from zerolayer.common.server import BindError, LayerServer, ServiceBinding
from zerolayer.stack.preflight import bind_error
from zerolayer.v1 import generation_pb2 as pb
from zerolayer.v1 import generation_pb2_grpc

SERVICE = "zerolayer.v1.TextGeneration"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Servicer(generation_pb2_grpc.TextGenerationServicer):
    async def Tokenize(self, request: pb.TokenizeRequest, context) -> pb.TokenizeResponse:
        return pb.TokenizeResponse(token_ids=[len(request.text)])


def make_server(address: str, **options: object) -> LayerServer:
    binding = ServiceBinding(
        generation_pb2_grpc.add_TextGenerationServicer_to_server, Servicer(), SERVICE
    )
    return LayerServer(address, [binding], **options)


async def statuses(address: str, *services: str) -> list[int | str]:
    """Each service's health status (a status code's name where the check fails)."""
    found: list[int | str] = []
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in services:
            try:
                request = health_pb2.HealthCheckRequest(service=service)
                found.append((await stub.Check(request, timeout=5)).status)
            except grpc.aio.AioRpcError as exc:
                found.append(exc.code().name)
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_held_service_reports_not_serving_until_released(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 's.sock'}"

    async def run() -> list[list[int | str]]:
        server = make_server(address, held_services=[SERVICE])
        await server.start()
        seen = [await statuses(address, "", SERVICE)]
        await server.set_serving(True)
        seen.append(await statuses(address, "", SERVICE))
        async with grpc.aio.insecure_channel(address) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=SERVICE)
            )
            first = (await watch.read()).status
            await server.release_service(SERVICE)
            await server.release_service(SERVICE)  # a second release changes nothing
            seen.append([first, (await watch.read()).status])
            watch.cancel()
        seen.append(await statuses(address, "", SERVICE))
        await server.stop_serving("GPU fatal event")
        await server.release_service(SERVICE)
        seen.append(await statuses(address, "", SERVICE))
        await server.stop(0)
        return seen

    assert asyncio.run(run()) == [
        [NOT_SERVING, NOT_SERVING],  # starting
        [SERVING, NOT_SERVING],  # serving, held
        [NOT_SERVING, SERVING],  # what a Watch of the service sees at the release
        [SERVING, SERVING],
        [NOT_SERVING, NOT_SERVING],  # stopped serving: for good
    ]


def test_a_service_released_before_the_server_serves_follows_the_server(tmp_path: Path) -> None:
    address = f"unix:{tmp_path / 's.sock'}"

    async def run() -> list[list[int | str]]:
        server = make_server(address, held_services=[SERVICE])
        await server.start()
        await server.release_service(SERVICE)
        seen = [await statuses(address, "", SERVICE)]
        await server.set_serving(True)
        seen.append(await statuses(address, "", SERVICE))
        await server.stop(0)
        return seen

    assert asyncio.run(run()) == [[NOT_SERVING, NOT_SERVING], [SERVING, SERVING]]


def test_servers_of_one_instance_share_a_port_that_stays_taken_for_anyone_else(
    tmp_path: Path,
) -> None:
    listen = f"127.0.0.1:{free_port()}"
    private = {name: f"unix:{tmp_path / name}.sock" for name in ("a", "b")}

    async def run() -> dict[str, object]:
        first = make_server(
            listen, instance_id="zl-a", reuse_port=True, private_address=private["a"]
        )
        second = make_server(
            listen, instance_id="zl-b", reuse_port=True, private_address=private["b"]
        )
        await first.start()
        await second.start()
        await first.set_serving(True)
        await second.set_serving(True)
        found: dict[str, object] = {"bind": bind_error("127.0.0.1", int(listen.split(":")[1]))}
        try:
            await make_server(listen).start()
        except RuntimeError as exc:
            found["unshared"] = str(exc)
        found["a"] = await statuses(
            private["a"], "zerolayer.instance.zl-a", "zerolayer.instance.zl-b"
        )
        found["b"] = await statuses(private["b"], "zerolayer.instance.zl-b")
        await first.stop(0)
        async with grpc.aio.insecure_channel(listen) as channel:  # a new connection: the second
            stub = generation_pb2_grpc.TextGenerationStub(channel)
            found["after"] = list((await stub.Tokenize(pb.TokenizeRequest(text="abc"))).token_ids)
        await second.stop(0)
        return found

    found = asyncio.run(run())
    assert found == {
        "bind": "the port is already in use",
        "unshared": f"cannot listen on {listen} (in use, or not a local address)",
        "a": [SERVING, "NOT_FOUND"],
        "b": [SERVING],
        "after": [3],
    }


def test_sharing_a_port_needs_a_private_unix_address() -> None:
    with pytest.raises(ValueError, match="^reuse_port: needs a private_address"):
        make_server("127.0.0.1:1", reuse_port=True)
    with pytest.raises(ValueError, match="^private_address: unix-abstract:x: not unix:PATH"):
        make_server("127.0.0.1:1", reuse_port=True, private_address="unix-abstract:x")


def test_a_private_address_that_cannot_be_bound_is_one_error_naming_it(tmp_path: Path) -> None:
    private = f"unix:{tmp_path / 'frontend.sock'}"
    (tmp_path / "frontend.sock").write_text("someone's")

    async def start() -> None:
        server = make_server(
            f"127.0.0.1:{free_port()}", instance_id="i", reuse_port=True, private_address=private
        )
        await server.start()

    with pytest.raises(BindError, match=f"^cannot listen on {private} \\("):
        asyncio.run(start())


def test_stop_ends_health_watches_at_once_without_an_error_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    address = f"unix:{tmp_path / 's.sock'}"

    async def run() -> tuple[list[int], str, float]:
        server = make_server(address)
        await server.start()
        await server.set_serving(True)
        async with grpc.aio.insecure_channel(address) as channel:
            call = health_pb2_grpc.HealthStub(channel).Watch(
                health_pb2.HealthCheckRequest(service=SERVICE)
            )
            seen = [(await call.read()).status]
            loop = asyncio.get_running_loop()
            started = loop.time()
            await server.stop(grace_s=5.0)
            took = loop.time() - started
            while (response := await call.read()) is not grpc.aio.EOF:
                seen.append(response.status)
            return seen, (await call.code()).name, took

    with caplog.at_level("ERROR"):
        seen, code, took = asyncio.run(run())
    assert seen == [SERVING, NOT_SERVING]
    assert code == "OK"
    # the grace period (5 s) was not spent waiting for the watch
    assert took < 1.0
    assert not [r for r in without_stale_completions(caplog.records) if r.levelname == "ERROR"]
