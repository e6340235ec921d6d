"""Domain types of the generation API shared by the frontend and the scheduler."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass

GREEDY_TEMPERATURE_EPS = 1e-5
"""Temperatures below this are treated as greedy."""
_MASK64 = (1 << 64) - 1


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index`` of a request seeded with ``seed`` (``EngineRequest.n``):
    ``seed + index`` mod 2**64 (unsigned 64-bit, as ``SamplingParams.seed``)."""
    return (seed + index) & _MASK64


class FinishReason(enum.IntEnum):
    """Why a sequence stopped (mirrors zerolayer.v1.FinishReason)."""

    UNSPECIFIED = 0
    LENGTH = 1
    EOS = 2
    STOP = 3
    ABORT = 4
    TOOL_CALLS = 5
    """The model called tools (its output parsed into calls: GenerateParams.parse_output)."""


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the logits."""

    temperature: float = 0.0
    """0 (or below 1e-5, where dividing by it would overflow): greedy (argmax); otherwise logits
    are divided by it before softmax."""
    top_p: float = 1.0
    """Nucleus sampling threshold in (0, 1] (Holtzman et al. 2019, arXiv:1904.09751); 1: off."""
    top_k: int = 0
    """Keep the k most likely tokens; 0: off."""
    seed: int | None = None
    """Seed of the request's own generator; None: random."""
    repetition_penalty: float = 1.0
    """> 0; 1: off. Logits of tokens in the prompt or output: positive ones divided by it,
    negative ones multiplied (Keskar et al. 2019, arXiv:1909.05858)."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of each token already in the output; 0: off."""
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per occurrence in the output; 0: off."""
    min_p: float = 0.0
    """Drop tokens with probability below min_p times the top token's (Nguyen et al. 2024,
    arXiv:2407.01082); 0: off."""
    logit_bias: tuple[tuple[int, float], ...] = ()
    """(token id, bias) pairs added to the logits, ids ascending."""

    @property
    def is_greedy(self) -> bool:
        """True when the next token is the argmax."""
        return self.temperature < GREEDY_TEMPERATURE_EPS


@dataclass(frozen=True)
class EngineRequest:
    """A tokenized request as the scheduler receives it."""

    request_id: str
    prompt_token_ids: tuple[int, ...]
    max_new_tokens: int
    sampling: SamplingParams
    ignore_eos: bool = False
    cache_salt: str = ""
    min_new_tokens: int = 0
    """EOS and stop_token_ids do not end generation before this many output tokens."""
    stop_token_ids: tuple[int, ...] = ()
    """Further ids that end generation (FinishReason.STOP)."""
    logprobs: int | None = None
    """Top alternatives returned per generated token (0 to 20); None: no logprobs."""
    prompt_logprobs: int | None = None
    """Top alternatives returned per prompt token (0 to 20); None: none."""
    n: int = 1
    """Samples of the prompt; sample i is drawn with seed + i (mod 2**64)."""
    structured_output: StructuredOutput | None = None
    """Constraint on the output; None: free text."""
    num_resumed_output_tokens: int = 0
    """How many of the prompt's last tokens were generated earlier (a failover resubmission):
    output for presence/frequency penalties and the structured-output grammar."""


@dataclass(frozen=True)
class StructuredOutput:
    """A constraint on generated text."""

    kind: str
    """"json_schema", "json_object", "regex" or "grammar" (Lark syntax, llguidance dialect)."""
    value: str = ""
    """The schema (JSON text), the regex or the grammar; empty for json_object."""


@dataclass(frozen=True)
class ToolDefinition:
    """One function tool the model may call (OpenAI's ``tools[i].function``)."""

    name: str
    description: str = ""
    parameters_json: str = '{"type": "object"}'
    """The JSON schema of its arguments, as JSON text."""


@dataclass(frozen=True)
class ToolChoice:
    """Which tools the model may, or must, call."""

    mode: str = "auto"
    """"auto" (the model decides), "none" (no call), "required" (one call or more) or
    "function" (a call of ``name``)."""
    name: str = ""
    """The function, when ``mode`` is "function"."""


TOOL_CHOICE_MODES = ("auto", "none", "required", "function")
"""The values of :attr:`ToolChoice.mode`."""


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool, in a message of the history or in the output."""

    id: str
    name: str
    arguments: str
    """The arguments, as JSON text (an object)."""


@dataclass(frozen=True)
class ChatMessage:
    """One message of a chat (as OpenAI's and transformers' chat templates take it)."""

    role: str
    content: str
    name: str = ""
    tool_call_id: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    """An assistant message's calls."""
    reasoning_content: str = ""
    """An assistant message's thought (templates that render it: Qwen3's)."""


@dataclass(frozen=True)
class TokenLogprob:
    """A token and its log probability (natural log, of the raw logits' softmax)."""

    token_id: int
    logprob: float
    token: str = ""
    """Its text piece: the vocab entry (``"Ġthe"``, ``"▁the"``; set by the frontend)."""
    text: str = ""
    """The text it stands for where it is (set by the frontend; see
    zerolayer.frontend.text.logprob_tokens)."""
    token_bytes: bytes = b""
    """The bytes it stands for, UTF-8 (set by the frontend)."""


@dataclass(frozen=True)
class PositionLogprobs:
    """Log probabilities at one position: the token there, its rank, the top alternatives."""

    chosen: TokenLogprob
    rank: int
    """1-based rank of the chosen token by probability."""
    top: tuple[TokenLogprob, ...] = ()
    """Most likely first."""


@dataclass(frozen=True)
class RequestOutput:
    """What one engine step produced for one request."""

    request_id: str
    new_token_ids: tuple[int, ...]
    finish_reason: FinishReason
    num_prompt_tokens: int
    num_cached_tokens: int
    index: int = 0
    """Which sample (0 to n - 1) the tokens belong to."""
    logprobs: tuple[PositionLogprobs, ...] = ()
    """One per new token, when asked."""
    prompt_logprobs: tuple[PositionLogprobs, ...] = ()
    """Prompt positions 1.. in order, possibly spread over several outputs, when asked."""

    @property
    def finished(self) -> bool:
        """True on the request's last output."""
        return self.finish_reason != FinishReason.UNSPECIFIED


MAX_CACHE_PINS = 4
"""Most pins one request may ask for (Anthropic's limit of ``cache_control`` breakpoints)."""
MAX_PIN_TTL_S = 86400
"""Longest pin, seconds: OpenAI's longest ``prompt_cache_retention``, 24 hours."""
PIN_KVSTORE_UNAVAILABLE = "pin-kvstore-unavailable"
"""A pin refusal made by the frontend: the kvstore could not be asked (down, restarting, or the
frontend was started without ``--pin-kvstore``); the kvstore's own refusals are in
``zerolayer.kv.pin``."""


@dataclass(frozen=True)
class CachePin:
    """A prefix of a request's prompt to keep cached for ``ttl_s`` seconds: a pin in the kvstore
    (``zerolayer.kvstore.pins``), which holds its whole blocks past the LRU's evictions; a later
    request that reads all of it renews it (Anthropic's prompt caching semantics, see
    docs/prefix-caching.md, "Pins")."""

    ttl_s: int
    """Lifetime, seconds, 1 to :data:`MAX_PIN_TTL_S`."""
    num_prompt_tokens: int = 0
    """The prefix is the prompt's first ``num_prompt_tokens`` tokens; 0: the whole prompt."""
    key: str = ""
    """Pins of one namespace with the same key replace each other; "": no key."""
    include_output: bool = False
    """Pin prompt and output (sample 0's) when the request finishes, not the prefix at its first
    token."""
    message_index: int | None = None
    """Chat only: the prefix ends in this message (0-based) of the rendered prompt, ...;
    None: ``num_prompt_tokens`` says where."""
    content_offset: int = 0
    """... this many characters into its content."""


@dataclass(frozen=True)
class GenerateParams:
    """A public Generate request as received, before validation (None: the field was unset)."""

    prompt: str | None = None
    prompt_token_ids: tuple[int, ...] | None = None
    max_new_tokens: int = 0
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    cache_salt: str = ""
    request_id: str = ""
    model: str = ""
    messages: tuple[ChatMessage, ...] | None = None
    """Chat input (the third input, besides prompt and prompt_token_ids)."""
    add_generation_prompt: bool | None = None
    """Chat only; None: True."""
    repetition_penalty: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    min_p: float | None = None
    min_new_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    n: int = 0
    """0: 1."""
    structured_output: StructuredOutput | None = None
    tools: tuple[ToolDefinition, ...] = ()
    """Chat only: the functions the model may call (the template's ``tools``)."""
    tool_choice: ToolChoice | None = None
    """Chat only; None: "auto" with tools, else "none"."""
    parallel_tool_calls: bool = True
    """False: at most one call."""
    chat_template_kwargs_json: str = ""
    """Chat only: a JSON object of further template variables (e.g. ``{"enable_thinking":
    false}``); "": none."""
    parse_output: bool = False
    """Split the output into answer text, reasoning and tool calls (GenerationChunk's
    ``text``, ``reasoning_text``, ``tool_call_deltas``); chat APIs set it."""
    cache_pins: tuple[CachePin, ...] = ()
    """Prefixes to keep cached (at most :data:`MAX_CACHE_PINS`)."""


@dataclass(frozen=True)
class Usage:
    """Token accounting of one request."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int
    """Prompt tokens whose KV was read from the prefix cache (whole blocks)."""
    cache_write_prompt_tokens: int = 0
    """Prompt tokens the request's pins hold that were not read from the cache (Anthropic's
    ``cache_creation_input_tokens``)."""
    pinned_prompt_tokens: int = 0
    """Prompt tokens its longest pin holds (whole blocks)."""
    pin_refusal: str = ""
    """Why an asked-for pin was not made (``zerolayer.kv.pin`` refusals or
    :data:`PIN_KVSTORE_UNAVAILABLE`); "": every pin was made, or none was asked for."""


@dataclass(frozen=True)
class GenerationChunk:
    """One piece of a generation as the public API returns it."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason = FinishReason.UNSPECIFIED
    usage: Usage | None = None
    index: int = 0
    """Which sample (0 to n - 1)."""
    logprobs: tuple[PositionLogprobs, ...] = ()
    prompt_logprobs: tuple[PositionLogprobs, ...] = ()
    reasoning_text: str = ""
    """With parse_output: the next piece of the model's thought (``text`` is then the answer
    only)."""
    tool_call_deltas: tuple[ToolCallDelta, ...] = ()
    """With parse_output: the next pieces of the tool calls."""
    stop_string: str = ""
    """The stop string that ended the sample (its finish reason STOP); "" otherwise."""
    pin_ids: tuple[str, ...] = ()
    """The kvstore pins the request made, on the chunk whose output made them and on the
    stream's last chunk."""
    pin_refusal: str = ""
    """Why a pin was not made (as ``Usage.pin_refusal``), on the same chunks as ``pin_ids``."""


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call (OpenAI's ``delta.tool_calls[i]``)."""

    index: int
    """Which call of this sample (0, 1, ...)."""
    id: str = ""
    """On the call's first delta only."""
    name: str = ""
    """On the call's first delta only."""
    arguments: str = ""
    """The next piece of the arguments' JSON text."""


def join_tool_calls(chunks: Sequence[GenerationChunk]) -> tuple[ToolCall, ...]:
    """The whole tool calls of one sample's chunks, by call index: each call's id and name from
    its deltas, its arguments' pieces concatenated in order."""
    calls: dict[int, list[str]] = {}
    for chunk in chunks:
        for delta in chunk.tool_call_deltas:
            call = calls.setdefault(delta.index, ["", "", ""])
            call[0] = call[0] or delta.id
            call[1] = call[1] or delta.name
            call[2] += delta.arguments
    return tuple(ToolCall(*calls[i]) for i in sorted(calls))


def join_chunks(chunks: Sequence[GenerationChunk]) -> GenerationChunk:
    """A whole generation of one sample from its chunks, in order: the text, reasoning, token
    ids and logprobs concatenated, one tool call delta per whole call (:func:`join_tool_calls`),
    the request id, index, finish reason and stop string of the last chunk, the last usage given
    (an empty chunk for no chunks)."""
    usages = [c.usage for c in chunks if c.usage is not None]
    return GenerationChunk(
        request_id=chunks[-1].request_id if chunks else "",
        text="".join(c.text for c in chunks),
        token_ids=tuple(t for c in chunks for t in c.token_ids),
        finish_reason=chunks[-1].finish_reason if chunks else FinishReason.UNSPECIFIED,
        usage=usages[-1] if usages else None,
        index=chunks[-1].index if chunks else 0,
        logprobs=tuple(p for c in chunks for p in c.logprobs),
        prompt_logprobs=tuple(p for c in chunks for p in c.prompt_logprobs),
        stop_string=chunks[-1].stop_string if chunks else "",
        reasoning_text="".join(c.reasoning_text for c in chunks),
        tool_call_deltas=tuple(
            ToolCallDelta(i, call.id, call.name, call.arguments)
            for i, call in enumerate(join_tool_calls(chunks))
        ),
    )


def join_samples(chunks: Sequence[GenerationChunk]) -> list[GenerationChunk]:
    """Each sample's whole generation, by index ascending, from the chunks of a stream with
    n > 1: :func:`join_chunks` of the sample's chunks, each with the stream's usage (the last
    given, which counts every sample)."""
    by_index: dict[int, list[GenerationChunk]] = {}
    for chunk in chunks:
        by_index.setdefault(chunk.index, []).append(chunk)
    usages = [c.usage for c in chunks if c.usage is not None]
    usage = usages[-1] if usages else None
    return [dataclasses.replace(join_chunks(by_index[i]), usage=usage) for i in sorted(by_index)]


@dataclass(frozen=True)
class TokenizeParams:
    """A public Tokenize request."""

    text: str
    add_special_tokens: bool = False
    """Add the BOS (and whatever else) the tokenizer config asks for."""
    model: str = ""
    """Empty: the served model."""


@dataclass(frozen=True)
class TokenizeResult:
    """Token ids of a text and the vocab piece of each."""

    token_ids: tuple[int, ...]
    tokens: tuple[str, ...]


@dataclass(frozen=True)
class ModelInfo:
    """The served model as ``GetModelInfo`` describes it."""

    model: str
    architecture: str
    vocab_size: int
    max_model_len: int
    """Context length in tokens."""
    eos_token_ids: tuple[int, ...]
    bos_token_id: int | None
    dtype: str
    """Torch name of the compute dtype, e.g. "bfloat16"."""
    num_parameters: int
    block_size: int
    """Tokens per KV block; 0 while the scheduler is unreachable."""
    fingerprint: str
    has_chat_template: bool = False
    """True when GenerateRequest.messages can be used."""
