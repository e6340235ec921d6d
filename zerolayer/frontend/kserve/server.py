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
vLLM's SamplingParams names carry Generate's other fields: ``repetition_penalty``,
``presence_penalty``, ``frequency_penalty``, ``min_p``, ``min_tokens``, ``stop_token_ids``,
``logit_bias`` (JSON object), ``logprobs``, ``prompt_logprobs`` and one of ``guided_json``,
``guided_regex``, ``guided_grammar`` (structured output). With ``logprobs`` (``prompt_logprobs``)
set, each response also carries a ``logprobs`` (``prompt_logprobs``) BYTES output: a JSON array
for the tokens it covers (:func:`zerolayer.frontend.kserve.response.logprobs_json`). Chat
messages and ``n`` > 1 have no place in the protocol's one-text tensors: use Generate.
Spec: https://github.com/kserve/open-inference-protocol and Triton's grpc_service.proto.
"""

from __future__ import annotations

import asyncio
import reprlib
from collections.abc import AsyncIterator
from importlib import metadata

import grpc

from zerolayer.common.errors import NotFound
from zerolayer.common.generation import FinishReason, join_chunks
from zerolayer.common.server import ServiceBinding
from zerolayer.common.status import answer_status
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.kserve.request import TextRequest, read_text_request
from zerolayer.frontend.kserve.response import (
    MODEL_VERSION,
    infer_response,
    model_metadata_response,
    model_ready_response,
    server_live_response,
    server_metadata_response,
    server_ready_response,
    stream_error_response,
    stream_response,
)
from zerolayer.frontend.tenants import TenantPolicy, call_tenant
from zerolayer.kserve.v2 import grpc_service_pb2 as pb
from zerolayer.kserve.v2 import grpc_service_pb2_grpc as pb_grpc


def kserve_binding(generator: TextGenerator, tenants: TenantPolicy | None = None) -> ServiceBinding:
    """The binding that serves ``inference.GRPCInferenceService`` over ``generator``; ``tenants``:
    who callers are (see :class:`KServeServicer`)."""
    name = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
    return ServiceBinding(
        pb_grpc.add_GRPCInferenceServiceServicer_to_server,
        KServeServicer(generator, tenants),
        name,
    )


class KServeServicer(pb_grpc.GRPCInferenceServiceServicer):
    """inference.GRPCInferenceService over a :class:`TextGenerator` (one model, version "1").

    Errors are raised (NotFound, InvalidArgument, ...) and answered by the server's status table
    (:mod:`zerolayer.common.status`), as for every other service.
    """

    def __init__(self, generator: TextGenerator, tenants: TenantPolicy | None = None) -> None:
        """
        Args:
            tenants: who callers are (ModelInfer and ModelStreamInfer need a tenant when it is
                enabled, a stream once before its first request); None: nobody is identified.
        """
        self._generator = generator
        self._tenants = tenants or TenantPolicy()
        self._model = generator.served.name
        try:
            self._version = metadata.version("zerolayer")
        except metadata.PackageNotFoundError:
            self._version = "unknown"

    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerLiveResponse:
        return server_live_response()

    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerReadyResponse:
        return server_ready_response(self._generator.ready)

    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelReadyResponse:
        served = request.name == self._model and request.version in ("", MODEL_VERSION)
        return model_ready_response(served and self._generator.ready)

    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ServerMetadataResponse:
        return server_metadata_response(self._version)

    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelMetadataResponse:
        self._check_model(request.name, request.version, "name", "version")
        return model_metadata_response(self._model)

    async def ModelInfer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        """The whole generated text in one response (``stream`` is ignored here)."""
        tenant = call_tenant(self._tenants, context)
        text_request = self._read(request)
        generation = self._generator.generate(
            text_request.params, context.time_remaining(), tenant=tenant
        )
        whole = join_chunks([chunk async for chunk in generation])
        text = text_request.output_prefix + whole.text
        return infer_response(self._model, request, text_request, text, whole, final=None)

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[pb.ModelInferRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Serves requests concurrently as they arrive; responses of different requests may
        interleave (each echoes its request's ``id``). Errors become ``error_message`` responses.
        """
        tenant = call_tenant(self._tenants, context)
        responses: asyncio.Queue[pb.ModelStreamInferResponse | None] = asyncio.Queue()
        tasks: set[asyncio.Task[None]] = set()

        async def serve(request: pb.ModelInferRequest) -> None:
            async for response in self._stream_one(request, context.time_remaining(), tenant):
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
        self, request: pb.ModelInferRequest, timeout_s: float | None, tenant: str
    ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        try:
            text_request = self._read(request)
            prefix, chunks = text_request.output_prefix, []
            generation = self._generator.generate(
                text_request.params, timeout_s, text_request.stream, tenant
            )
            async for chunk in generation:
                final = chunk.finish_reason != FinishReason.UNSPECIFIED
                if not text_request.stream:
                    chunks.append(chunk)
                    if final:
                        whole = join_chunks(chunks)
                        text = prefix + whole.text
                        yield stream_response(self._model, request, text_request, text, whole)
                elif chunk.text or final or chunk.logprobs or chunk.prompt_logprobs:
                    text = prefix + chunk.text
                    yield stream_response(self._model, request, text_request, text, chunk)
                    prefix = ""
        except Exception as exc:  # noqa: BLE001 - one bad request must not end the stream
            status = answer_status(exc)
            yield stream_error_response(request, f"{status.code.name}: {status.details}")

    def _read(self, request: pb.ModelInferRequest) -> TextRequest:
        """Reads the request after checking the model name and version.

        Raises:
            NotFound: another model or version.
            InvalidArgument: see :func:`read_text_request`.
        """
        self._check_model(request.model_name, request.model_version, "model_name", "model_version")
        return read_text_request(request, self._model)

    def _check_model(self, name: str, version: str, name_field: str, version_field: str) -> None:
        # NOTE: reprlib bounds what is quoted (a status travels in a size-limited trailer)
        if name != self._model:
            raise NotFound(
                f"{name_field}: {reprlib.repr(name)} is not served (serving {self._model!r})"
            )
        if version not in ("", MODEL_VERSION):
            raise NotFound(
                f"{version_field}: {reprlib.repr(version)} is not served "
                f"(serving {MODEL_VERSION!r})"
            )
