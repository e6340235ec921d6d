"""KServe's errors go through the same status table as zerolayer's own API: a KServe servicer over
a scripted generator, on the real layer server (no stack)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from types import SimpleNamespace

import grpc
import pytest
from grpc_records import without_stale_completions

from zerolayer.common.errors import InvalidArgument, ResourceExhausted, Unavailable
from zerolayer.common.generation import GenerateParams
from zerolayer.common.server import LayerServer
from zerolayer.common.status import answered_by_handler, status_of
from zerolayer.frontend.kserve.server import kserve_binding
from zerolayer.frontend.kserve.tensors import pack_bytes
from zerolayer.kserve.v2 import grpc_service_pb2 as pb
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as pb_grpc

MODEL = "scripted"


def upstream(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)


class ScriptedGenerator:
    """What the KServe servicer uses of a TextGenerator; raises the error named by the prompt."""

    def __init__(self, failures: dict[str, Exception]) -> None:
        self.served = SimpleNamespace(name=MODEL)
        self._failures = failures

    async def generate(
        self,
        params: GenerateParams,
        timeout_s: float | None,
        stream: bool = False,
        tenant: str = "",
    ) -> AsyncIterator[object]:
        raise self._failures[params.prompt or ""]
        yield  # an async generator, like TextGenerator.generate


FAILURES = {
    "invalid": InvalidArgument("prompt", "too long"),
    "full": ResourceExhausted("prompt_token_ids: can never fit the KV arena"),
    "down": Unavailable("scheduler: connection refused"),
    "late": upstream(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"),
    "bug": KeyError("oops"),
}


def infer_request(prompt: str, model: str = MODEL) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name=model, id=prompt)
    request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(pack_bytes([prompt.encode()]))
    return request


async def serve_and_call(socket: Path, calls) -> None:  # noqa: ANN001
    server = LayerServer(f"unix:{socket}", [kserve_binding(ScriptedGenerator(FAILURES))])
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"unix:{socket}") as channel:
            await calls(pb_grpc.GRPCInferenceServiceStub(channel))
    finally:
        await server.stop(0)


def test_unary_errors_are_answered_from_the_table(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    answers = {}

    async def calls(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
        requests = {p: infer_request(p) for p in FAILURES}
        requests["other model"] = infer_request("x", model="other")
        for name, request in requests.items():
            with pytest.raises(grpc.aio.AioRpcError) as info:
                await stub.ModelInfer(request, timeout=10)
            answers[name] = (
                info.value.code(),
                info.value.details(),
                answered_by_handler(info.value),
            )
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await stub.ModelMetadata(pb.ModelMetadataRequest(name="other"), timeout=10)
        answers["metadata"] = (info.value.code(), info.value.details(), True)

    with caplog.at_level(logging.INFO):
        asyncio.run(serve_and_call(tmp_path / "s.sock", calls))
    code = grpc.StatusCode
    not_served = f"'other' is not served (serving {MODEL!r})"
    assert answers == {
        "invalid": (code.INVALID_ARGUMENT, "prompt: too long", True),
        "full": (code.RESOURCE_EXHAUSTED, "prompt_token_ids: can never fit the KV arena", True),
        "down": (code.UNAVAILABLE, "scheduler: connection refused", True),
        "late": (code.DEADLINE_EXCEEDED, "upstream layer: Deadline Exceeded", False),
        "bug": (code.INTERNAL, "internal error: KeyError: 'oops'", False),
        "other model": (code.NOT_FOUND, f"model_name: {not_served}", True),
        "metadata": (code.NOT_FOUND, f"name: {not_served}", True),
    }
    tracebacks = [r.getMessage() for r in without_stale_completions(caplog.records) if r.exc_info]
    assert tracebacks == ["unexpected error in handler"]


def test_stream_errors_are_error_messages_from_the_same_table(tmp_path: Path) -> None:
    responses: list[pb.ModelStreamInferResponse] = []

    async def calls(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
        requests = [infer_request(p) for p in FAILURES]
        responses.extend([r async for r in stub.ModelStreamInfer(iter(requests), timeout=10)])

    asyncio.run(serve_and_call(tmp_path / "s.sock", calls))
    by_id = {r.infer_response.id: r.error_message for r in responses}
    expected = {}
    for prompt, exc in FAILURES.items():
        status = status_of(exc)
        expected[prompt] = f"{status.code.name}: {status.details}"
    assert by_id == expected
    assert by_id["full"] == "RESOURCE_EXHAUSTED: prompt_token_ids: can never fit the KV arena"
