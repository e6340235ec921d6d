"""Where a cache breakpoint inside a chat falls in its rendered prompt, in tokens.

A breakpoint (Anthropic's ``cache_control``, ``CachePin.message_index``) names a position in a
message's content; the pin needs the number of prompt tokens before it. The chat template decides
where that content lands in the prompt, so the position is found by rendering: each breakpoint
becomes a marker (private-use characters no tokenizer sees) inserted into the content, the
messages are rendered again, and the marker's place in that text, less the markers before it, is
its place in the prompt's text. The tokens before it are the longest common prefix of the
prompt's token ids and the tokenization of the text before it (so a token that spans the
breakpoint is left out). Where a template renders the marked content differently (e.g. it trims
content, or tests whether it is empty), the breakpoint is moved back to where the two renderings
part: a pin never holds more than the request's own prefix.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from zerolayer.common.generation import CachePin, ChatMessage, GenerateParams
from zerolayer.frontend.text.chat_template import ChatTemplate
from zerolayer.frontend.text.chat_variables import template_kwargs
from zerolayer.frontend.text.tokenizer import TextTokenizer

MARKER = "\ue000zerolayer-cache-breakpoint-{}\ue001"
"""A breakpoint's marker (Unicode private-use characters around its number)."""


def breakpoint_token_counts(
    params: GenerateParams,
    pins: Sequence[CachePin],
    chat_template: ChatTemplate,
    tokenizer: TextTokenizer,
    prompt_token_ids: Sequence[int],
) -> list[int]:
    """The number of prompt tokens before each chat breakpoint of ``pins`` (each has a
    ``message_index``, already checked against ``params.messages``); 0 where the template does
    not render the position.

    Raises:
        InvalidArgument: from rendering (as ``validate`` raises it for the same messages).
    """
    messages = list(params.messages or ())
    marked = _marked_messages(messages, pins)
    generation_prompt = params.add_generation_prompt is not False
    variables = template_kwargs(params.chat_template_kwargs_json)
    text = chat_template.render(messages, generation_prompt, params.tools, variables)
    marked_text = chat_template.render(marked, generation_prompt, params.tools, variables)
    places = _places(marked_text, len(pins))
    agreed = len(os.path.commonprefix([_unmarked(marked_text, len(pins)), text]))
    counts = []
    for place in places:
        if place is None:
            counts.append(0)
            continue
        ids = tokenizer.encode(text[: min(place, agreed)], add_special_tokens=False)
        counts.append(len(os.path.commonprefix([list(ids), list(prompt_token_ids)])))
    return counts


def _marked_messages(messages: list[ChatMessage], pins: Sequence[CachePin]) -> list[ChatMessage]:
    """``messages`` with each pin's marker inserted at its place (later offsets first, so that
    earlier ones stay where they are)."""
    marked = list(messages)
    by_place = sorted(
        enumerate(pins), key=lambda p: (p[1].message_index, p[1].content_offset), reverse=True
    )
    for number, pin in by_place:
        i = pin.message_index
        assert i is not None
        content = marked[i].content
        at = pin.content_offset
        marked[i] = replace(marked[i], content=content[:at] + MARKER.format(number) + content[at:])
    return marked


def _unmarked(text: str, num_markers: int) -> str:
    for number in range(num_markers):
        text = text.replace(MARKER.format(number), "")
    return text


def _places(marked_text: str, num_markers: int) -> list[int | None]:
    """Each marker's offset in the text without markers (None: not rendered, or rendered more
    than once)."""
    found = {}
    for number in range(num_markers):
        marker = MARKER.format(number)
        at = marked_text.find(marker)
        if at >= 0 and marked_text.find(marker, at + 1) < 0:
            found[number] = at
    places: list[int | None] = []
    for number in range(num_markers):
        if number not in found:
            places.append(None)
            continue
        before = sum(len(MARKER.format(n)) for n, at in found.items() if at < found[number])
        places.append(found[number] - before)
    return places
