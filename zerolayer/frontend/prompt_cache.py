"""Prompt caching by reference, for one request: the prefixes it asks to keep cached
(``GenerateParams.cache_pins``) checked and resolved to token counts, pinned in the kvstore once
their blocks are committed, and counted in its usage.

When: a prompt prefix is pinned at the request's first output (its prefill has committed every
whole block of the prompt, and the running request still holds them, so none can be evicted in
between); a pin with ``include_output`` is made when sample 0 finishes, over the prompt and that
sample's tokens (their whole blocks were committed as they filled; freed a moment before, they
are the most recently used). Usage (Anthropic's accounting): ``cache_write_prompt_tokens`` are
the prompt tokens the longest pin holds less those read from the cache; a refused pin writes
nothing and says why in ``pin_refusal``. See docs/prefix-caching.md, "Pins".
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from opentelemetry import trace

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    MAX_CACHE_PINS,
    MAX_PIN_TTL_S,
    CachePin,
    GenerateParams,
    RequestOutput,
    Usage,
)
from zerolayer.frontend.kv_pin_client import KVPins, MadePin
from zerolayer.frontend.text.cache_breakpoints import breakpoint_token_counts
from zerolayer.frontend.text.chat_template import ChatTemplate
from zerolayer.frontend.text.tokenizer import TextTokenizer
from zerolayer.kv.pin import MAX_PIN_KEY_BYTES


def check_cache_pins(params: GenerateParams) -> None:
    """Refuses pins that cannot be made as asked.

    Raises:
        InvalidArgument: naming the field (``cache_pins``, ``cache_pins[i].ttl_s``, ...): more
            than :data:`MAX_CACHE_PINS`, a ttl outside 1 to :data:`MAX_PIN_TTL_S` seconds, a key
            over :data:`MAX_PIN_KEY_BYTES`, a chat position on a request without messages or
            outside them, a chat position and ``num_prompt_tokens`` both set, a
            ``content_offset`` without ``message_index``.
    """
    pins = params.cache_pins
    if len(pins) > MAX_CACHE_PINS:
        raise InvalidArgument("cache_pins", f"{len(pins)} pins; at most {MAX_CACHE_PINS}")
    messages = params.messages
    for i, pin in enumerate(pins):
        name = f"cache_pins[{i}]"
        if not 1 <= pin.ttl_s <= MAX_PIN_TTL_S:
            raise InvalidArgument(f"{name}.ttl_s", f"{pin.ttl_s}; must be 1 to {MAX_PIN_TTL_S} s")
        if len(pin.key.encode("utf-8", "surrogatepass")) > MAX_PIN_KEY_BYTES:
            raise InvalidArgument(f"{name}.key", f"longer than {MAX_PIN_KEY_BYTES} bytes")
        if pin.message_index is None:
            if pin.content_offset:
                raise InvalidArgument(f"{name}.content_offset", "set without message_index")
            continue
        if messages is None:
            raise InvalidArgument(f"{name}.message_index", "only for chat (messages) input")
        if pin.num_prompt_tokens:
            raise InvalidArgument(f"{name}.num_prompt_tokens", "set with message_index")
        if pin.message_index >= len(messages):
            raise InvalidArgument(
                f"{name}.message_index", f"{pin.message_index}; there are {len(messages)} messages"
            )
        content = messages[pin.message_index].content
        if not 0 <= pin.content_offset <= len(content):
            raise InvalidArgument(
                f"{name}.content_offset",
                f"{pin.content_offset}; the message's content has {len(content)} characters",
            )


@dataclass(frozen=True)
class PinPlan:
    """A request's pins, resolved against its prompt."""

    prefixes: tuple[tuple[int, CachePin], ...] = ()
    """Pinned at the first output: (prompt tokens, the pin); a 0 count pins nothing."""
    with_output: tuple[CachePin, ...] = ()
    """Pinned when sample 0 finishes, over prompt and output."""

    @property
    def empty(self) -> bool:
        return not (self.prefixes or self.with_output)


def plan_pins(
    params: GenerateParams,
    prompt_token_ids: Sequence[int],
    chat_template: ChatTemplate | None,
    tokenizer: TextTokenizer,
) -> PinPlan:
    """Resolves ``params.cache_pins`` (checked by :func:`check_cache_pins`) to prompt prefixes.

    Raises:
        InvalidArgument: ``num_prompt_tokens`` past the prompt (``cache_pins[i]...``).
    """
    pins = params.cache_pins
    chat = [p for p in pins if p.message_index is not None and not p.include_output]
    counts = iter(
        breakpoint_token_counts(params, chat, chat_template, tokenizer, prompt_token_ids)
        if chat and chat_template is not None
        else ()
    )
    prefixes = []
    for i, pin in enumerate(pins):
        if pin.include_output:
            continue
        if pin.message_index is not None:
            prefixes.append((next(counts, 0), pin))
            continue
        if pin.num_prompt_tokens > len(prompt_token_ids):
            raise InvalidArgument(
                f"cache_pins[{i}].num_prompt_tokens",
                f"{pin.num_prompt_tokens}; the prompt has {len(prompt_token_ids)} tokens",
            )
        prefixes.append((pin.num_prompt_tokens or len(prompt_token_ids), pin))
    return PinPlan(tuple(prefixes), tuple(p for p in pins if p.include_output))


@dataclass
class RequestPins:
    """The pins one request made, and their part of its usage."""

    kv_pins: KVPins
    plan: PinPlan
    cache_salt: str
    prompt_token_ids: tuple[int, ...]
    budget_namespace: str = ""
    """Whose pin budget the pins count against (the tenant's namespace; "": the salt's)."""
    tracer: trace.Tracer = field(default_factory=trace.NoOpTracer)
    made: list[MadePin] = field(default_factory=list)
    output_token_ids: list[int] = field(default_factory=list)
    """Sample 0's so far (for a pin of prompt and output)."""

    async def on_output(self, output: RequestOutput) -> None:
        """Makes the pins that sample 0's ``output`` allows, each set in a span ``pin``: the
        prefixes at its first token (the prompt's whole blocks are committed then; an earlier
        output carries prompt logprobs only), the prompt-and-output pins when it finished."""
        if self.plan.empty or not output.new_token_ids:
            return
        if not self.output_token_ids and self.plan.prefixes:
            with self.tracer.start_as_current_span("pin"):
                prefixes = self.plan.prefixes
                prompt = self.prompt_token_ids
                self.made += await asyncio.gather(*(self._pin(prompt[:n], p) for n, p in prefixes))
        self.output_token_ids += output.new_token_ids
        if output.finished and self.plan.with_output:
            token_ids = (*self.prompt_token_ids, *self.output_token_ids)
            with self.tracer.start_as_current_span("pin"):
                self.made += await asyncio.gather(
                    *(self._pin(token_ids, p) for p in self.plan.with_output)
                )

    async def _pin(self, token_ids: Sequence[int], pin: CachePin) -> MadePin:
        return await self.kv_pins.pin(
            token_ids, self.cache_salt, pin.ttl_s, pin.key, self.budget_namespace
        )

    @property
    def pin_ids(self) -> tuple[str, ...]:
        return tuple(m.pin_id for m in self.made if m.pin_id)

    @property
    def refusal(self) -> str:
        """The first refusal of the pins made so far ("": none)."""
        return next((m.refusal for m in self.made if m.refusal), "")

    def usage(self, usage: Usage) -> Usage:
        """``usage`` with the pins' fields (nothing pinned yet: unchanged)."""
        if not self.made:
            return usage
        num_prompt_tokens = len(self.prompt_token_ids)
        pinned = max((min(m.num_tokens, num_prompt_tokens) for m in self.made), default=0)
        return replace(
            usage,
            cache_write_prompt_tokens=max(0, pinned - usage.cached_prompt_tokens),
            pinned_prompt_tokens=pinned,
            pin_refusal=self.refusal,
        )
