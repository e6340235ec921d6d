"""Thin gRPC handlers of the public TextGeneration service."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc

from zerolayer.checkpoints.dtypes import torch_name
from zerolayer.common.convert import chunk_to_pb, generate_params_from_pb
from zerolayer.frontend.generation import TextGenerator
from zerolayer.v1 import generation_pb2, generation_pb2_grpc


class TextGenerationServicer(generation_pb2_grpc.TextGenerationServicer):
    """zerolayer.v1.TextGeneration over a :class:`TextGenerator`."""

    def __init__(self, generator: TextGenerator) -> None:
        self._generator = generator

    async def Generate(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.GenerateResponse:
        response = generation_pb2.GenerateResponse()
        params = generate_params_from_pb(request)
        async for chunk in self._generator.generate(params, context.time_remaining()):
            part = chunk_to_pb(chunk)
            response.text += part.text
            response.token_ids.extend(part.token_ids)
            response.request_id = part.request_id
            response.finish_reason = part.finish_reason
            if part.HasField("usage"):
                response.usage.CopyFrom(part.usage)
        return response

    async def GenerateStream(
        self, request: generation_pb2.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[generation_pb2.GenerateResponse]:
        params = generate_params_from_pb(request)
        async for chunk in self._generator.generate(params, context.time_remaining(), stream=True):
            yield chunk_to_pb(chunk)

    async def Tokenize(
        self, request: generation_pb2.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.TokenizeResponse:
        result = await asyncio.to_thread(
            self._generator.tokenize, request.text, request.add_special_tokens, request.model
        )
        return generation_pb2.TokenizeResponse(token_ids=result.token_ids, tokens=result.tokens)

    async def GetModelInfo(
        self, request: generation_pb2.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> generation_pb2.ModelInfo:
        g = self._generator
        cfg = g.model_config
        embed = next(t for t in g.manifest.tensors if t.name.endswith("embed_tokens.weight"))
        return generation_pb2.ModelInfo(
            model=g.manifest.model,
            architecture=cfg.architecture,
            vocab_size=cfg.vocab_size,
            max_model_len=cfg.max_position_embeddings,
            eos_token_ids=cfg.eos_token_ids,
            bos_token_id=cfg.bos_token_id,
            dtype=torch_name(embed.dtype),
            num_parameters=g.manifest.num_parameters,
            block_size=await g.scheduler.block_size(),
            fingerprint=g.manifest.fingerprint,
        )
