"""Thin gRPC handlers of the public TextGeneration service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from zerolayer.common.convert import (
    choices_to_pb,
    chunk_to_pb,
    generate_params_from_pb,
    model_info_to_pb,
    tokenize_request_from_pb,
    tokenize_result_to_pb,
)
from zerolayer.common.generation import join_chunks, join_samples
from zerolayer.common.server import ServiceBinding
from zerolayer.frontend.generation import TextGenerator
from zerolayer.frontend.tenants import TenantPolicy, call_tenant
from zerolayer.v1 import generation_pb2, generation_pb2_grpc


def text_generation_binding(
    generator: TextGenerator, tenants: TenantPolicy | None = None
) -> ServiceBinding:
    """The binding that serves ``zerolayer.v1.TextGeneration`` over ``generator``; ``tenants``:
    who callers are (see :class:`TextGenerationServicer`)."""
    name = generation_pb2.DESCRIPTOR.services_by_name["TextGeneration"].full_name
    return ServiceBinding(
        generation_pb2_grpc.add_TextGenerationServicer_to_server,
        TextGenerationServicer(generator, tenants),
        name,
    )


class TextGenerationServicer(generation_pb2_grpc.TextGenerationServicer):
    """zerolayer.v1.TextGeneration over a :class:`TextGenerator`."""

    def __init__(self, generator: TextGenerator, tenants: TenantPolicy | None = None) -> None:
        """
        Args:
            tenants: who callers are (Generate, GenerateStream and Tokenize need a tenant
                when it is enabled; GetModelInfo stays open); None: nobody is identified.
        """
        self._generator = generator
        self._tenants = tenants or TenantPolicy()

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.GenerateResponse:
        tenant = call_tenant(self._tenants, context)
        params = generate_params_from_pb(request)
        generation = self._generator.generate(params, context.time_remaining(), tenant=tenant)
        chunks = [chunk async for chunk in generation]
        if params.n > 1:
            return choices_to_pb(join_samples(chunks))
        return chunk_to_pb(join_chunks(chunks))

    async def GenerateStream(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generation_pb2.GenerateResponse]:
        tenant = call_tenant(self._tenants, context)
        params = generate_params_from_pb(request)
        timeout_s = context.time_remaining()
        async for chunk in self._generator.generate(params, timeout_s, True, tenant):
            yield chunk_to_pb(chunk)

    async def Tokenize(
        self, request: generation_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.TokenizeResponse:
        # NOTE: tokenizing takes CPU time Generate calls need: identified callers only
        call_tenant(self._tenants, context)
        params = tokenize_request_from_pb(request)
        return tokenize_result_to_pb(await asyncio.to_thread(self._generator.tokenize, params))

    async def GetModelInfo(
        self, request: generation_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.ModelInfo:
        return model_info_to_pb(await self._generator.model_info())
