"""Generation chunks to OpenAI response bodies (plain dicts, serialized as JSON).

Shapes: https://platform.openai.com/docs/api-reference/completions/object,
https://platform.openai.com/docs/api-reference/chat/object and .../chat/streaming. Choices are
the samples of ``n`` by :attr:`GenerationChunk.index`; logprobs are natural logs of the raw
logits' softmax (see zerolayer.v1.TokenLogprobs).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from zerolayer.common.generation import (
    FinishReason,
    GenerationChunk,
    PositionLogprobs,
    TokenLogprob,
    ToolCallDelta,
    Usage,
    join_chunks,
    join_tool_calls,
)

FINISH_REASONS = {
    FinishReason.UNSPECIFIED: None,
    FinishReason.EOS: "stop",
    FinishReason.STOP: "stop",
    FinishReason.LENGTH: "length",
    FinishReason.ABORT: "abort",
    FinishReason.TOOL_CALLS: "tool_calls",
}
"""OpenAI's ``finish_reason`` of ours; "abort" (the scheduler gave the request up) is vLLM's,
not OpenAI's."""


@dataclass(frozen=True)
class ResponseHead:
    """What every body of one response carries."""

    id: str
    """``cmpl-<request id>`` or ``chatcmpl-<request id>``."""
    created: int
    """Unix time, seconds."""
    model: str
    chat: bool


def usage_body(usage: Usage | None) -> dict | None:
    """OpenAI's ``usage`` (None stays None). ``prompt_tokens_details``: ``cached_tokens`` read
    from the prefix cache, ``cache_write_tokens`` computed instead (the cache keeps their whole
    blocks for the next request; as the Responses API counts them)."""
    if usage is None:
        return None
    cached = usage.cached_prompt_tokens
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {
            "cached_tokens": cached,
            "cache_write_tokens": usage.prompt_tokens - cached,
        },
    }


def completion_logprobs(positions: Sequence[PositionLogprobs], text_offset: int) -> dict:
    """Completions' ``logprobs``: ``tokens`` (the text each token adds: they join to the
    choice's text), ``token_logprobs``, ``top_logprobs`` (token text, see :func:`_top_key`, ->
    logprob; tokens of the same text keep the likeliest) and ``text_offset`` (each token's
    offset in characters in the choice's text, the first at ``text_offset``)."""
    offsets = []
    for p in positions:
        offsets.append(text_offset)
        text_offset += len(p.chosen.text)
    return {
        "tokens": [p.chosen.text for p in positions],
        "token_logprobs": [p.chosen.logprob for p in positions],
        "top_logprobs": [_top_dict(p.top) for p in positions],
        "text_offset": offsets,
    }


def _top_dict(top: Sequence[TokenLogprob]) -> dict[str, float]:
    found: dict[str, float] = {}
    for t in top:  # most likely first: the first of a text is its likeliest
        found.setdefault(_top_key(t), t.logprob)
    return found


def _top_key(t: TokenLogprob) -> str:
    """An alternative's key: its text; for one that adds no text here, ``bytes:`` and its
    bytes as ``\\xNN`` escapes (it ends inside a character; OpenAI writes such tokens so), or
    its vocab piece (a special token, ``</s>``)."""
    if t.text or not t.token_bytes:
        return t.text or t.token
    return "bytes:" + "".join(f"\\x{b:02x}" for b in t.token_bytes)


def chat_logprobs(positions: Sequence[PositionLogprobs]) -> dict:
    """Chat's ``logprobs``: ``content``, one entry per token, with its text as ``token`` (the
    texts join to the message's content), its UTF-8 ``bytes`` (they join to the content's) and
    ``top_logprobs``; ``refusal`` null (none is ever generated)."""
    return {
        "content": [
            {**_chat_token(p.chosen), "top_logprobs": [_chat_token(t) for t in p.top]}
            for p in positions
        ],
        "refusal": None,
    }


def _chat_token(t: TokenLogprob) -> dict:
    return {"token": t.text, "logprob": t.logprob, "bytes": list(t.token_bytes)}


def whole_response(head: ResponseHead, chunks: Sequence[GenerationChunk], logprobs: bool) -> dict:
    """The body of a non-streamed response: one choice per sample, in index order, and the
    request's usage (that of its last chunk with one)."""
    by_index: dict[int, list[GenerationChunk]] = {}
    for chunk in chunks:
        by_index.setdefault(chunk.index, []).append(chunk)
    usages = [c.usage for c in chunks if c.usage is not None]
    choices = []
    for index in sorted(by_index):
        whole = join_chunks(by_index[index])
        choice: dict = {"index": index}
        if head.chat:
            choice["message"] = _message(by_index[index], whole)
            choice["logprobs"] = chat_logprobs(whole.logprobs) if logprobs else None
        else:
            choice["text"] = whole.text
            choice["logprobs"] = completion_logprobs(whole.logprobs, 0) if logprobs else None
        choice["finish_reason"] = FINISH_REASONS[whole.finish_reason]
        if whole.prompt_logprobs:
            choice["prompt_logprobs"] = [None, *prompt_logprobs(whole.prompt_logprobs)]
        choices.append(choice)
    body = _head(head, "chat.completion" if head.chat else "text_completion")
    return {**body, "choices": choices, "usage": usage_body(usages[-1] if usages else None)}


def prompt_logprobs(positions: Sequence[PositionLogprobs]) -> list[dict]:
    """vLLM's ``prompt_logprobs`` (an extension of OpenAI's responses) of prompt positions
    1..: per position, token id (a string, as JSON keys are) -> ``logprob``, ``rank`` (1: the
    likeliest) and ``decoded_token``, for the prompt's token and the top alternatives. The
    first position has none: a response's list starts with null."""
    out = []
    for p in positions:
        entry = {str(t.token_id): _vllm_logprob(t, i + 1) for i, t in enumerate(p.top)}
        entry[str(p.chosen.token_id)] = _vllm_logprob(p.chosen, p.rank)
        out.append(entry)
    return out


def _vllm_logprob(t: TokenLogprob, rank: int) -> dict:
    return {"logprob": t.logprob, "rank": rank, "decoded_token": t.text}


def _message(chunks: Sequence[GenerationChunk], whole: GenerationChunk) -> dict:
    """A chat answer's ``message``: its content (null when it only called tools), ``refusal``
    (null) and ``annotations`` (none) as the spec requires, its ``tool_calls`` and
    ``reasoning_content`` (vLLM's name) when it has them."""
    calls = join_tool_calls(chunks)
    message: dict = {
        "role": "assistant",
        "content": whole.text or (None if calls else ""),
        "refusal": None,
        "annotations": [],
    }
    if calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in calls
        ]
    if whole.reasoning_text:
        message["reasoning_content"] = whole.reasoning_text
    return message


def _delta(chunk: GenerationChunk, first: bool) -> dict:
    """A chat stream's ``delta``: the role with a choice's first piece; the content, the
    thought's piece (``reasoning_content``) and the tool calls' pieces (``tool_calls``) it has;
    empty when it has none (text held back, the tags around a tool call, a last chunk), as
    OpenAI ends a choice."""
    delta: dict = {"role": "assistant"} if first else {}
    if chunk.text or (first and not (chunk.reasoning_text or chunk.tool_call_deltas)):
        delta["content"] = chunk.text
    if chunk.reasoning_text:
        delta["reasoning_content"] = chunk.reasoning_text
    if chunk.tool_call_deltas:
        delta["tool_calls"] = [_tool_call_delta(d) for d in chunk.tool_call_deltas]
    return delta


def _tool_call_delta(delta: ToolCallDelta) -> dict:
    """OpenAI's ``delta.tool_calls[i]``: the index; id, type and name on a call's first piece."""
    if delta.id or delta.name:
        function = {"name": delta.name, "arguments": delta.arguments}
        return {"index": delta.index, "id": delta.id, "type": "function", "function": function}
    return {"index": delta.index, "function": {"arguments": delta.arguments}}


def _head(head: ResponseHead, kind: str) -> dict:
    return {"id": head.id, "object": kind, "created": head.created, "model": head.model}


@dataclass
class StreamEncoder:
    """Turns a stream's chunks into the bodies of its SSE events (in order), one per chunk."""

    head: ResponseHead
    logprobs: bool
    include_usage: bool = False
    """``stream_options.include_usage``: ``usage: null`` on every chunk, then a last one with
    empty choices and the usage."""
    continuous_usage: bool = False
    """``stream_options.continuous_usage_stats`` (vLLM's): the usage so far on every chunk."""
    _text_offsets: dict[int, int] = field(default_factory=dict)
    _prompt_logprobs_sent: set[int] = field(default_factory=set)
    _usage: Usage | None = None

    def chunk(self, chunk: GenerationChunk) -> dict:
        """The event body of ``chunk``."""
        first = chunk.index not in self._text_offsets
        offset = self._text_offsets.get(chunk.index, 0)
        self._text_offsets[chunk.index] = offset + len(chunk.text)
        choice: dict = {"index": chunk.index}
        if self.head.chat:
            choice["delta"] = _delta(chunk, first)
            choice["logprobs"] = chat_logprobs(chunk.logprobs) if self.logprobs else None
        else:
            choice["text"] = chunk.text
            logprobs = completion_logprobs(chunk.logprobs, offset) if self.logprobs else None
            choice["logprobs"] = logprobs
        choice["finish_reason"] = FINISH_REASONS[chunk.finish_reason]
        if chunk.prompt_logprobs:
            # NOTE: the first prompt position has none: null leads the first chunk's list
            lead = [] if chunk.index in self._prompt_logprobs_sent else [None]
            self._prompt_logprobs_sent.add(chunk.index)
            choice["prompt_logprobs"] = [*lead, *prompt_logprobs(chunk.prompt_logprobs)]
        self._usage = chunk.usage or self._usage
        body = {**_head(self.head, self._kind), "choices": [choice]}
        if self.continuous_usage:
            body["usage"] = usage_body(self._usage)
        elif self.include_usage:
            body["usage"] = None
        return body

    def usage(self) -> dict | None:
        """The last event's body (``include_usage``), or None: none is sent."""
        if not self.include_usage:
            return None
        return {**_head(self.head, self._kind), "choices": [], "usage": usage_body(self._usage)}

    @property
    def _kind(self) -> str:
        return "chat.completion.chunk" if self.head.chat else "text_completion"
