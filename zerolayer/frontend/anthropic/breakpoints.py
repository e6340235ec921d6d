"""Anthropic's ``cache_control`` breakpoints (https://docs.anthropic.com/en/docs/build-with-claude/
prompt-caching) as the seam's :class:`CachePin`: a prefix of the chat to keep cached for the
breakpoint's ttl (``5m``: 300 s, ``1h``: 3600 s), which the frontend's TextGenerator turns into
a pin in the kvstore.

A pin names the end of its prefix as a place in the translated chat
(``zerolayer.frontend.anthropic.params``): ``message_index`` into ``GenerateParams.messages``,
``content_offset`` characters into that message's ``content``. Where each breakpoint lies:

- a text block (of ``system``, of a message, or inside a ``tool_result``'s content): the end of
  its text within the content its message was joined into (text blocks joined with ``"\\n"``);
- a ``tool_result`` block: the end of its ``tool`` message's content;
- a ``tool_use`` block: the end of its assistant message's text content; the call itself is
  rendered after that text, so the prefix does not hold it;
- a tool (``tools.N``): the start of the first message that is not ``system`` (its index,
  offset 0: after the template's header of that turn). Anthropic caches tools before
  ``system``; chat templates render the tools inside the system turn, so the prefix holds the
  whole system turn, tools and system text;
- the last ``system`` block, when tools are defined: as a tool's breakpoint (Anthropic's prefix
  of a system breakpoint holds the tools, and the template may render them after the text);
- the request's own ``cache_control`` (automatic caching): the end of the last message.

Checked as Anthropic checks them: at most 4 breakpoints (the request's own counts), no ``1h``
breakpoint after a ``5m`` one in the order ``tools``, ``system``, ``messages``, none on an
empty text block. Breakpoints at one place make one pin, of the first one's ttl (the longest).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel

from zerolayer.common.errors import InvalidArgument, ZerolayerError
from zerolayer.common.generation import MAX_CACHE_PINS, CachePin, ChatMessage
from zerolayer.frontend.anthropic.schema import CountTokensRequest, TextBlock

TTL_S = {"5m": 300, "1h": 3600}
"""A breakpoint's lifetime, seconds, by its ``ttl``."""
TTL_ORDER = (
    "a ttl='1h' cache_control block must not come after a ttl='5m' cache_control block. "
    "Note that blocks are processed in the following order: `tools`, `system`, `messages`."
)
"""Anthropic's refusal of a ``1h`` breakpoint after a ``5m`` one."""


@dataclass(frozen=True)
class Breakpoint:
    """One ``cache_control`` of a request, placed in the translated chat."""

    field: str
    """The block that carries it as Anthropic names it (``tools.0``, ``system.1``,
    ``messages.2.content.0``); "": the request's own ``cache_control``."""
    ttl: str
    """``5m`` or ``1h``."""
    message_index: int
    """The prefix ends in this message of the translated chat ..."""
    content_offset: int
    """... this many characters into its content."""


class TooManyBreakpoints(InvalidArgument):
    """More than :data:`MAX_CACHE_PINS` breakpoints; the message is Anthropic's, whole (it
    names no one field: every ``cache_control`` counts)."""

    def __init__(self, found: int) -> None:
        ZerolayerError.__init__(
            self,
            f"A maximum of {MAX_CACHE_PINS} blocks with cache_control may be provided. "
            f"Found {found}.",
        )
        self.field = ""


def joined_length(texts: Sequence[str]) -> int:
    """Characters of ``"\\n".join(texts)``: where the last of ``texts`` ends once joined."""
    return sum(len(text) for text in texts) + max(len(texts) - 1, 0)


def block_breakpoint(
    block: BaseModel, field: str, message_index: int, content_offset: int
) -> list[Breakpoint]:
    """The breakpoint of ``block`` (named ``field``) ending at that place of the chat; none
    without ``cache_control``.

    Raises:
        InvalidArgument: ``cache_control`` on an empty text block (``<field>.text``, Anthropic's
            words).
    """
    control = getattr(block, "cache_control", None)
    if control is None:
        return []
    if isinstance(block, TextBlock) and not block.text:
        raise InvalidArgument(f"{field}.text", "cache_control cannot be set for empty text blocks")
    return [Breakpoint(field, control.ttl, message_index, content_offset)]


def cache_pins(breakpoints: Sequence[Breakpoint]) -> tuple[CachePin, ...]:
    """The pins of a request's breakpoints, given in Anthropic's order (tools, system,
    messages, the request's own): one per place, by place in the chat.

    Raises:
        TooManyBreakpoints: more than :data:`MAX_CACHE_PINS`.
        InvalidArgument: a ``1h`` breakpoint after a ``5m`` one (``<field>.cache_control.ttl``).
    """
    if len(breakpoints) > MAX_CACHE_PINS:
        raise TooManyBreakpoints(len(breakpoints))
    after_5m = False
    for breakpoint in breakpoints:
        if breakpoint.ttl == "1h" and after_5m:
            control = f"{breakpoint.field}.cache_control" if breakpoint.field else "cache_control"
            raise InvalidArgument(f"{control}.ttl", TTL_ORDER)
        after_5m |= breakpoint.ttl == "5m"
    pins: dict[tuple[int, int], CachePin] = {}
    for b in breakpoints:
        place = (b.message_index, b.content_offset)
        pins.setdefault(
            place, CachePin(TTL_S[b.ttl], message_index=place[0], content_offset=place[1])
        )
    return tuple(pins[place] for place in sorted(pins))


def request_pins(
    body: CountTokensRequest, messages: tuple[ChatMessage, ...], marks: list[Breakpoint]
) -> tuple[CachePin, ...]:
    """The pins of ``body``'s breakpoints: its tools' (and, with tools, its last system
    block's) at the start of the first message that is not ``system``, ``marks`` (those of
    ``system`` and the messages, placed as they were translated into ``messages``), the
    request's own at the end of the last message.

    Raises:
        InvalidArgument: see :func:`block_breakpoint` and :func:`cache_pins`.
    """
    first = 1 if body.system is not None else 0
    tools = [
        mark
        for j, tool in enumerate(body.tools or ())
        for mark in block_breakpoint(tool, f"tools.{j}", first, 0)
    ]
    if body.tools:
        last_system = f"system.{len(body.system) - 1}" if isinstance(body.system, list) else None
        marks = [
            Breakpoint(m.field, m.ttl, first, 0) if m.field == last_system else m for m in marks
        ]
    own = []
    if body.cache_control is not None:
        own = [Breakpoint("", body.cache_control.ttl, len(messages) - 1, len(messages[-1].content))]
    return cache_pins([*tools, *marks, *own])
