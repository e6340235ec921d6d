"""Conversion of the public API's messages (``zerolayer.v1.TextGeneration``)."""

from __future__ import annotations

from zerolayer.common.generation import (
    GenerateParams,
    GenerationChunk,
    ModelInfo,
    TokenizeParams,
    TokenizeResult,
)
from zerolayer.v1 import generation_pb2


def generate_params_from_pb(pb: generation_pb2.GenerateRequest) -> GenerateParams:
    """Public request to the domain form; unset optional fields become None."""
    which = pb.WhichOneof("input")
    return GenerateParams(
        prompt=pb.prompt if which == "prompt" else None,
        prompt_token_ids=tuple(pb.prompt_token_ids.ids) if which == "prompt_token_ids" else None,
        max_new_tokens=pb.max_new_tokens,
        temperature=pb.temperature if pb.HasField("temperature") else None,
        top_p=pb.top_p if pb.HasField("top_p") else None,
        top_k=pb.top_k if pb.HasField("top_k") else None,
        seed=pb.seed if pb.HasField("seed") else None,
        stop=tuple(pb.stop),
        ignore_eos=pb.ignore_eos,
        cache_salt=pb.cache_salt,
        request_id=pb.request_id,
        model=pb.model,
    )


def chunk_to_pb(c: GenerationChunk) -> generation_pb2.GenerateResponse:
    """A generation chunk to a public response (usage only when the chunk carries it)."""
    pb = generation_pb2.GenerateResponse(
        text=c.text,
        token_ids=c.token_ids,
        finish_reason=int(c.finish_reason),
        request_id=c.request_id,
    )
    if c.usage is not None:
        pb.usage.CopyFrom(
            generation_pb2.Usage(
                prompt_tokens=c.usage.prompt_tokens,
                completion_tokens=c.usage.completion_tokens,
                cached_prompt_tokens=c.usage.cached_prompt_tokens,
            )
        )
    return pb


def tokenize_request_from_pb(pb: generation_pb2.TokenizeRequest) -> TokenizeParams:
    """Public Tokenize request to the domain form."""
    return TokenizeParams(pb.text, pb.add_special_tokens, pb.model)


def tokenize_result_to_pb(r: TokenizeResult) -> generation_pb2.TokenizeResponse:
    """Token ids and pieces to the public response."""
    return generation_pb2.TokenizeResponse(token_ids=r.token_ids, tokens=r.tokens)


def model_info_to_pb(m: ModelInfo) -> generation_pb2.ModelInfo:
    """The served model to the public response (no ``bos_token_id`` when the model has none)."""
    return generation_pb2.ModelInfo(
        model=m.model,
        architecture=m.architecture,
        vocab_size=m.vocab_size,
        max_model_len=m.max_model_len,
        eos_token_ids=m.eos_token_ids,
        bos_token_id=m.bos_token_id,
        dtype=m.dtype,
        num_parameters=m.num_parameters,
        block_size=m.block_size,
        fingerprint=m.fingerprint,
    )
