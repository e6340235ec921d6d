"""Thin handlers of the KServe v2 / Open Inference Protocol gRPC API
(``inference.GRPCInferenceService``, with Triton's ``ModelStreamInfer``) over a
:class:`TextGenerator`, so Triton and KServe clients work unchanged.

Tensors are named the way Triton's LLM backends name them (vLLM backend, TensorRT-LLM ensemble):
``text_input`` (BYTES, one element, shape [1] or [1, 1]) in, ``text_output`` (BYTES, same shape,
sent in ``raw_output_contents``) out. Sampling settings come from, later overriding earlier:
the scalar request ``parameters``; ``sampling_parameters`` (a JSON object, vLLM style; numbers may
be given as strings), first as a string request parameter, then as an input (both forms are
validated alike); then the scalar inputs ``max_tokens``, ``temperature``, ``top_p``, ``top_k``,
``seed``/``random_seed``, ``stop``/``stop_words``, ``ignore_eos``. ``max_tokens`` and ``top_k``
are at most 2^32 - 1, ``seed`` at most 2^64 - 1. ``stream`` (BOOL) makes ``ModelStreamInfer``
answer once per generated piece; the last answer carries the bool parameter
``triton_final_response`` = true (and ``finish_reason``, ``num_input_tokens``,
``num_output_tokens``). The prompt is not echoed unless ``exclude_input_in_output`` is false.
Spec: https://github.com/kserve/open-inference-protocol and Triton's grpc_service.proto.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from importlib import metadata

import grpc

from zerolayer.common.errors import NotFound
from zerolayer.common.generation import FinishReason, GenerationChunk
from zerolayer.common.server import ServiceBinding
from zerolayer.common.status import answer_status
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.kserve_request import (
    ALIASES,
    METADATA_DTYPE,
    SETTINGS,
    TextRequest,
    read_text_request,
)
from zerolayer.frontend.kserve_tensors import pack_bytes
from zerolayer.kserve.v2 import grpc_service_pb2 as pb
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as pb_grpc

MODEL_VERSION = "1"
"""The only version served (requests may also leave the version empty)."""
FINAL_RESPONSE_PARAM = "triton_final_response"
"""Response parameter Triton sets on a decoupled model's last response to a request."""


def kserve_binding(generator: TextGenerator) -> ServiceBinding:
    """The binding that serves ``inference.GRPCInferenceService`` over ``generator``."""
    name = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    return ServiceBinding(
        pb_grpc.add_GRPCInferenceServiceServicer_to_server, KServeServicer(generator), name
    )


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over a :class:`TextGenerator` (one model, version "1")."""

    def __init__(self, generator: TextGenerator) -> None:
        self._generator = generator
        self._model = generator.served.name
        try:
            self._version = metadata.version("zerolayer")
        except metadata.PackageNotFoundError:
            self._version = "unknown"

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=True)

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        ready = request.name == self._model and request.version in ("", MODEL_VERSION)
        return pb.ModelReadyResponse(ready=ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(name="zerolayer", version=self._version, extensions=[])

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        self._check_model(request.name, request.version, "name", "version")
        tensor = pb.ModelMetadataResponse.TensorMetadata
        inputs = [tensor(name="text_input", datatype="BYTES", shape=[-1])]
        inputs.append(tensor(name="sampling_parameters", datatype="BYTES", shape=[1]))
        for name, kind in [*SETTINGS.items(), *((a, SETTINGS[k]) for a, k in ALIASES.items())]:
            shape = [-1] if kind == "strings" else [1]
            dtype = "UINT64" if name.endswith("seed") else METADATA_DTYPE[kind]
            inputs.append(tensor(name=name, datatype=dtype, shape=shape))
        return pb.ModelMetadataResponse(
            name=self._model,
            versions=[MODEL_VERSION],
            platform="zerolayer",
            inputs=inputs,
            outputs=[tensor(name="text_output", datatype="BYTES", shape=[-1])],
        )

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        """The whole generated text in one response (``stream`` is ignored here)."""
        text_request = self._read(request)
        pieces, last = [], None
        async for chunk in self._generator.generate(text_request.params, context.time_remaining()):
            pieces.append(chunk.text)
            last = chunk
        text = self._prefix(text_request) + "".join(pieces)
        return self._response(request, text_request, text, last, final=None)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Serves requests concurrently as they arrive; responses of different requests may
        interleave (each echoes its request's ``id``). Errors become ``error_message`` responses.
        """
        responses: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            async for response in self._stream_one(request, context.time_remaining()):
                await responses.put(response)

        async def read_requests() -> None:
            try:
                async for request in request_iterator:
                    task = asyncio.create_task(serve(request))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                while tasks:
                    await asyncio.wait(set(tasks))
            finally:
                await responses.put(None)

        reader = asyncio.create_task(read_requests())
        try:
            while (response := await responses.get()) is not None:
                yield response
            await reader  # NOTE: re-raises what ended the reading, e.g. an unparsable request
        finally:
            # The client left (or everything is answered): closing the generations aborts them.
            for task in [reader, *tasks]:
                task.cancel()

    async def _stream_one(
        self, request: pb.ModelInferRequest, timeout_s: float | None
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            text_request = self._read(request)
            prefix, pieces = self._prefix(text_request), []
            async for chunk in self._generator.generate(text_request.params, timeout_s):
                final = chunk.finish_reason != FinishReason.UNSPECIFIED
                if not text_request.stream:
                    pieces.append(chunk.text)
                    if final:
                        text = prefix + "".join(pieces)
                        yield self._stream_response(request, text_request, text, chunk)
                elif chunk.text or final:
                    yield self._stream_response(request, text_request, prefix + chunk.text, chunk)
                    prefix = ""
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the stream
            status = answer_status(exc)
            yield self._error_response(request, f"{status.code.name}: {status.details}")

    def _error_response(
        self, request: pb.ModelInferRequest, message: str
    ) -> pb.ModelStreamInferResponse:
        infer_response = pb.ModelInferResponse(
            model_name=request.model_name, model_version=request.model_version, id=request.id
        )
        return pb.ModelStreamInferResponse(error_message=message, infer_response=infer_response)

    def _stream_response(
        self,
        request: pb.ModelInferRequest,
        text_request: TextRequest,
        text: str,
        chunk: GenerationChunk,
    ) -> pb.ModelStreamInferResponse:
        final = chunk.finish_reason != FinishReason.UNSPECIFIED
        response = self._response(request, text_request, text, chunk, final=final)
        return pb.ModelStreamInferResponse(infer_response=response)

    def _response(
        self,
        request: pb.ModelInferRequest,
        text_request: TextRequest,
        text: str,
        last: GenerationChunk | None,
        final: bool | None,
    ) -> pb.ModelInferResponse:
        output = pb.ModelInferResponse.InferOutputTensor(
            name="text_output", datatype="BYTES", shape=text_request.output_shape
        )
        response = pb.ModelInferResponse(
            model_name=self._model,
            model_version=MODEL_VERSION,
            id=request.id,
            outputs=[output],
            raw_output_contents=[pack_bytes([text.encode()])],
        )
        if final is not None:
            response.parameters[FINAL_RESPONSE_PARAM].bool_param = final
        if last is not None and last.finish_reason != FinishReason.UNSPECIFIED:
            response.parameters["finish_reason"].string_param = last.finish_reason.name.lower()
            if last.usage is not None:
                response.parameters["num_input_tokens"].int64_param = last.usage.prompt_tokens
                response.parameters["num_output_tokens"].int64_param = last.usage.completion_tokens
        return response

    def _prefix(self, text_request: TextRequest) -> str:
        return (text_request.params.prompt or "") if text_request.echo_prompt else ""

    def _read(self, request: pb.ModelInferRequest) -> TextRequest:
        """Reads the request after checking the model name and version.

        Raises:
            NotFound: another model or version.
            InvalidArgument: see :func:`read_text_request`.
        """
        self._check_model(request.model_name, request.model_version, "model_name", "model_version")
        return read_text_request(request, self._model)

    def _check_model(self, name: str, version: str, name_field: str, version_field: str) -> None:
        if name != self._model:
            raise NotFound(f"{name_field}: {name!r} is not served (serving {self._model!r})")
        if version not in ("", MODEL_VERSION):
            raise NotFound(
                f"{version_field}: {version!r} is not served (serving {MODEL_VERSION!r})"
            )
