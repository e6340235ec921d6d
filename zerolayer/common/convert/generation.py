"""Conversion of the public API's messages (``zerolayer.v1.TextGeneration``)."""

from __future__ import annotations

from collections.abc import Sequence

from zerolayer.common.generation import (
    CachePin,
    ChatMessage,
    GenerateParams,
    GenerationChunk,
    ModelInfo,
    PositionLogprobs,
    StructuredOutput,
    TokenizeParams,
    TokenizeResult,
    TokenLogprob,
    ToolCall,
    ToolCallDelta,
    ToolChoice,
    ToolDefinition,
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
        messages=_messages_from_pb(pb.messages) if which == "messages" else None,
        add_generation_prompt=(
            pb.messages.add_generation_prompt
            if which == "messages" and pb.messages.HasField("add_generation_prompt")
            else None
        ),
        repetition_penalty=_optional(pb, "repetition_penalty"),
        presence_penalty=_optional(pb, "presence_penalty"),
        frequency_penalty=_optional(pb, "frequency_penalty"),
        min_p=_optional(pb, "min_p"),
        min_new_tokens=pb.min_new_tokens,
        stop_token_ids=tuple(pb.stop_token_ids),
        logit_bias=tuple(sorted(pb.logit_bias.items())),
        logprobs=_optional(pb, "logprobs"),
        prompt_logprobs=_optional(pb, "prompt_logprobs"),
        n=pb.n,
        structured_output=structured_output_from_pb(pb.structured_output),
        tools=tuple(
            ToolDefinition(t.name, t.description, t.parameters_json or '{"type": "object"}')
            for t in pb.tools
        ),
        tool_choice=(
            ToolChoice(pb.tool_choice.mode, pb.tool_choice.name)
            if pb.HasField("tool_choice")
            else None
        ),
        parallel_tool_calls=(
            pb.parallel_tool_calls if pb.HasField("parallel_tool_calls") else True
        ),
        chat_template_kwargs_json=pb.chat_template_kwargs_json,
        parse_output=pb.parse_output or bool(pb.tools),
        cache_pins=tuple(_cache_pin_from_pb(p) for p in pb.cache_pins),
    )


def _cache_pin_from_pb(pb: generation_pb2.CachePin) -> CachePin:
    return CachePin(
        ttl_s=pb.ttl_s,
        num_prompt_tokens=pb.num_prompt_tokens,
        key=pb.key,
        include_output=pb.include_output,
        message_index=pb.message_index if pb.HasField("message_index") else None,
        content_offset=pb.content_offset,
    )


def _optional(pb: generation_pb2.GenerateRequest, name: str) -> float | int | None:
    return getattr(pb, name) if pb.HasField(name) else None


def _messages_from_pb(pb: generation_pb2.ChatMessages) -> tuple[ChatMessage, ...]:
    return tuple(
        ChatMessage(
            m.role,
            m.content,
            m.name,
            m.tool_call_id,
            tuple(ToolCall(c.id, c.name, c.arguments) for c in m.tool_calls),
            m.reasoning_content,
        )
        for m in pb.messages
    )


def _deltas_to_pb(deltas: Sequence[ToolCallDelta]) -> list[generation_pb2.ToolCallDelta]:
    return [
        generation_pb2.ToolCallDelta(index=d.index, id=d.id, name=d.name, arguments=d.arguments)
        for d in deltas
    ]


def structured_output_from_pb(pb: generation_pb2.StructuredOutput) -> StructuredOutput | None:
    """The constraint of a request; None when none is set."""
    which = pb.WhichOneof("constraint")
    if which is None:
        return None
    if which == "json_object":
        # NOTE: json_object false is treated as set: the client chose that member of the oneof.
        return StructuredOutput("json_object")
    return StructuredOutput(which, getattr(pb, which))


def structured_output_to_pb(s: StructuredOutput | None) -> generation_pb2.StructuredOutput | None:
    """The wire form of a constraint (None for none)."""
    if s is None:
        return None
    if s.kind == "json_object":
        return generation_pb2.StructuredOutput(json_object=True)
    return generation_pb2.StructuredOutput(**{s.kind: s.value})


def _token_logprob_to_pb(t: TokenLogprob) -> generation_pb2.TopLogprob:
    return generation_pb2.TopLogprob(token_id=t.token_id, logprob=t.logprob, token=t.token)


def position_logprobs_to_pb(p: PositionLogprobs) -> generation_pb2.TokenLogprobs:
    """Logprobs of one position to the public form."""
    return generation_pb2.TokenLogprobs(
        chosen=_token_logprob_to_pb(p.chosen),
        rank=p.rank,
        top=[_token_logprob_to_pb(t) for t in p.top],
    )


def chunk_to_pb(c: GenerationChunk) -> generation_pb2.GenerateResponse:
    """A generation chunk to a public response (usage only when the chunk carries it)."""
    pb = generation_pb2.GenerateResponse(
        text=c.text,
        token_ids=c.token_ids,
        finish_reason=int(c.finish_reason),
        request_id=c.request_id,
        index=c.index,
        logprobs=[position_logprobs_to_pb(p) for p in c.logprobs],
        prompt_logprobs=[position_logprobs_to_pb(p) for p in c.prompt_logprobs],
        reasoning_text=c.reasoning_text,
        tool_call_deltas=_deltas_to_pb(c.tool_call_deltas),
    )
    if c.usage is not None:
        pb.usage.CopyFrom(
            generation_pb2.Usage(
                prompt_tokens=c.usage.prompt_tokens,
                completion_tokens=c.usage.completion_tokens,
                cached_prompt_tokens=c.usage.cached_prompt_tokens,
                cache_write_prompt_tokens=c.usage.cache_write_prompt_tokens,
                pinned_prompt_tokens=c.usage.pinned_prompt_tokens,
                pin_refusal=c.usage.pin_refusal,
            )
        )
    return pb


def choices_to_pb(samples: Sequence[GenerationChunk]) -> generation_pb2.GenerateResponse:
    """The unary response of a request with n > 1: sample 0 in the top-level fields (with the
    usage of all), every sample in ``choices``.

    Args:
        samples: each sample's whole generation, by index (at least one).
    """
    pb = chunk_to_pb(samples[0])
    for s in samples:
        pb.choices.append(
            generation_pb2.Choice(
                index=s.index,
                text=s.text,
                token_ids=s.token_ids,
                finish_reason=int(s.finish_reason),
                logprobs=[position_logprobs_to_pb(p) for p in s.logprobs],
                reasoning_text=s.reasoning_text,
                tool_call_deltas=_deltas_to_pb(s.tool_call_deltas),
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
        has_chat_template=m.has_chat_template,
    )
