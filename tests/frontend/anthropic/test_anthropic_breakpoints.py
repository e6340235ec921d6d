"""Anthropic's ``cache_control`` breakpoints to the seam's CachePins
(zerolayer.frontend.anthropic.breakpoints, placed by .params): where each kind of block's
breakpoint ends in the translated chat, the request's own, one pin per place, and Anthropic's
refusals (more than 4, a 1h after a 5m, a ttl or type not offered, an empty text block)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import CachePin
from zerolayer.frontend.anthropic.breakpoints import TTL_ORDER, TooManyBreakpoints
from zerolayer.frontend.anthropic.params import conversation, count_params, generate_params
from zerolayer.frontend.anthropic.schema import CountTokensRequest, MessagesRequest
from zerolayer.frontend.prompt_cache import plan_pins
from zerolayer.frontend.text.chat_template import ChatTemplate
from zerolayer.frontend.text.tokenizer import TextTokenizer

EPHEMERAL = {"type": "ephemeral"}
HOUR = {"type": "ephemeral", "ttl": "1h"}
TOOL = {"name": "weather", "input_schema": {"type": "object"}}
QWEN25 = json.loads((Path(__file__).parents[1] / "text" / "chat_templates.json").read_text())[
    "Qwen/Qwen2.5-0.5B-Instruct"
]["chat_template"]
"""Qwen2.5's published chat template (tools rendered after the system text)."""


def text(value: str, control: dict | None = None) -> dict:
    block: dict = {"type": "text", "text": value}
    return {**block, "cache_control": control} if control else block


def pins(**body: object) -> tuple[CachePin, ...]:
    request = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], **body}
    return conversation(CountTokensRequest.model_validate(request)).cache_pins


def refusal(**body: object) -> str:
    with pytest.raises(InvalidArgument) as refused:
        pins(**body)
    return str(refused.value)


def tool_loop(use: dict, result: dict) -> list[dict]:
    """A user asks, the assistant says ``Let me look.`` and calls ``use``, the user answers
    with ``result`` then ``And?``: translated, user 0, assistant 1, tool 2, user 3."""
    call = {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {}, **use}
    answer = {"type": "tool_result", "tool_use_id": "toolu_1", **result}
    return [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": [text("Let me"), call, text("look.")]},
        {"role": "user", "content": [answer, text("And?")]},
    ]


def test_a_system_blocks_breakpoint_ends_at_its_text_in_the_joined_system() -> None:
    system = [text("Be brief.", HOUR), text("Be kind.", EPHEMERAL), text("Bye.")]
    assert pins(system=system) == (
        CachePin(3600, message_index=0, content_offset=9),  # "Be brief."
        CachePin(300, message_index=0, content_offset=18),  # "Be brief.\nBe kind."
    )


def test_a_message_text_blocks_breakpoint_ends_at_its_text_in_the_joined_message() -> None:
    messages = [{"role": "user", "content": [text("a"), text("bc", EPHEMERAL), text("d")]}]
    assert pins(system="S", messages=messages) == (
        CachePin(300, message_index=1, content_offset=4),  # "a\nbc" of "a\nbc\nd"
    )


def test_a_tool_results_breakpoint_ends_its_tool_message_and_a_tool_uses_the_text() -> None:
    """The tool_use breakpoint covers the assistant's whole text ("Let me\\nlook."), not the
    call rendered after it; a text block inside a tool_result ends in the tool message."""
    chat = tool_loop(
        {"cache_control": EPHEMERAL},
        {"content": [text("18", EPHEMERAL), text("C")], "cache_control": EPHEMERAL},
    )
    assert pins(messages=chat, tools=[TOOL]) == (
        CachePin(300, message_index=1, content_offset=12),  # "Let me\nlook."
        CachePin(300, message_index=2, content_offset=2),  # "18"
        CachePin(300, message_index=2, content_offset=4),  # "18\nC"
    )
    chat = tool_loop({}, {"content": "sunny", "cache_control": HOUR})
    assert pins(messages=chat, tools=[TOOL]) == (CachePin(3600, message_index=2, content_offset=5),)


def test_a_tools_breakpoint_is_where_the_first_message_after_system_starts() -> None:
    tools = [{**TOOL, "cache_control": HOUR}]
    assert pins(tools=tools) == (CachePin(3600, message_index=0),)
    assert pins(tools=tools, system="S") == (CachePin(3600, message_index=1),)


def test_with_tools_the_last_system_blocks_breakpoint_is_the_tools_place() -> None:
    """One pin per place: the tool's (1h, first) and the last system block's (5m)."""
    system = [text("A", EPHEMERAL), text("B", EPHEMERAL)]
    assert pins(system=system, tools=[TOOL]) == (
        CachePin(300, message_index=0, content_offset=1),
        CachePin(300, message_index=1),
    )
    tools = [{**TOOL, "cache_control": HOUR}]
    assert pins(system=[text("A", EPHEMERAL)], tools=tools) == (CachePin(3600, message_index=1),)


def test_the_requests_own_breakpoint_ends_the_last_message() -> None:
    chat = tool_loop({}, {"content": "sunny"})
    assert pins(messages=chat, tools=[TOOL], cache_control=EPHEMERAL) == (
        CachePin(300, message_index=3, content_offset=4),  # "And?"
    )


def test_generate_params_carry_the_pins_and_count_tokens_checks_the_same() -> None:
    body = {
        "model": "m",
        "system": [text("Be brief.", HOUR)],
        "messages": [{"role": "user", "content": "Hi"}],
    }
    params = generate_params(MessagesRequest.model_validate({**body, "max_tokens": 4}), "rid")
    assert params.cache_pins == (CachePin(3600, message_index=0, content_offset=9),)
    assert count_params(CountTokensRequest.model_validate(body)).cache_pins == ()
    body["messages"] = [{"role": "user", "content": [text("Hi", EPHEMERAL)] * 4}]
    with pytest.raises(TooManyBreakpoints):
        count_params(CountTokensRequest.model_validate(body))


def test_five_breakpoints_are_refused_in_anthropics_words() -> None:
    messages = [{"role": "user", "content": [text("a", EPHEMERAL)] * 4}]
    assert [pin.content_offset for pin in pins(messages=messages)] == [1, 3, 5, 7]
    with pytest.raises(TooManyBreakpoints) as refused:
        pins(messages=messages, cache_control=EPHEMERAL)
    message = "A maximum of 4 blocks with cache_control may be provided. Found 5."
    assert (str(refused.value), refused.value.field) == (message, "")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (
            {"messages": [{"role": "user", "content": [text("a", EPHEMERAL), text("b", HOUR)]}]},
            "messages.0.content.1.cache_control.ttl",
        ),
        ({"system": [text("a", EPHEMERAL)], "cache_control": HOUR}, "cache_control.ttl"),
        (
            {"tools": [TOOL, {**TOOL, "name": "t"} | {"cache_control": EPHEMERAL}]}
            | {"system": [text("a", HOUR)]},
            "system.0.cache_control.ttl",
        ),
    ],
)
def test_a_1h_breakpoint_after_a_5m_one_is_refused(body, field) -> None:
    assert refusal(**body) == f"{field}: {TTL_ORDER}"


def test_1h_before_5m_in_anthropics_order_is_accepted() -> None:
    tools = [{**TOOL, "cache_control": HOUR}]
    messages = [{"role": "user", "content": [text("a", EPHEMERAL)]}]
    assert [pin.ttl_s for pin in pins(tools=tools, messages=messages)] == [3600, 300]


def test_an_empty_text_block_takes_no_breakpoint() -> None:
    messages = [{"role": "user", "content": [text("a"), {**text(""), "cache_control": HOUR}]}]
    expected = "messages.0.content.1.text: cache_control cannot be set for empty text blocks"
    assert refusal(messages=messages) == expected
    system = [{**text(""), "cache_control": EPHEMERAL}]
    assert refusal(system=system).startswith("system.0.text: cache_control cannot be set")


@pytest.mark.parametrize(
    ("control", "field", "message"),
    [
        ({"type": "ephemeral", "ttl": "2h"}, "ttl", "Input should be '5m' or '1h'"),
        ({"type": "persistent"}, "type", "Input should be 'ephemeral'"),
        ({"type": "ephemeral", "scope": "global"}, "scope", "Extra inputs are not permitted"),
    ],
)
def test_a_message_blocks_cache_control_that_anthropic_refuses(control, field, message) -> None:
    messages = [{"role": "user", "content": [text("a"), text("b", control)]}]
    assert refusal(messages=messages) == f"messages.0.content.1.cache_control.{field}: {message}"
    with pytest.raises(ValidationError):  # the request's own, refused by its pydantic model
        pins(cache_control=control)


def test_the_pins_end_where_qwens_template_renders_each_breakpoint(tmp_path: Path) -> None:
    """Resolved by the frontend (zerolayer.frontend.prompt_cache) on Qwen2.5's template, which
    renders the tools after the system text, with a byte tokenizer (a token a character here):
    a system block's pin ends after its text, the tools' (and the last system block's) where
    the user's content starts, so that it holds the tools, a message block's after its text."""
    write_byte_level_tokenizer(tmp_path, model_max_length=4096)
    tokenizer = TextTokenizer.from_json(
        (tmp_path / "tokenizer.json").read_text(), (tmp_path / "tokenizer_config.json").read_text()
    )
    template = ChatTemplate(QWEN25, {})
    body = {
        "model": "m",
        "max_tokens": 4,
        "tools": [{**TOOL, "cache_control": HOUR}],
        "system": [text("Be brief.", HOUR), text("Be kind.", EPHEMERAL)],
        "messages": [{"role": "user", "content": [text("Weather?", EPHEMERAL), text("In Rome.")]}],
    }
    params = generate_params(MessagesRequest.model_validate(body), "rid")
    rendered = template.render(list(params.messages or ()), True, params.tools, {})
    prompt_token_ids = tokenizer.encode(rendered, add_special_tokens=False)
    assert len(prompt_token_ids) == len(rendered)
    plan = plan_pins(params, prompt_token_ids, template, tokenizer)
    user = rendered.index("Weather?")
    assert [(count, pin.ttl_s) for count, pin in plan.prefixes] == [
        (rendered.index("Be brief.") + len("Be brief."), 3600),
        (user, 3600),
        (user + len("Weather?"), 300),
    ]
    assert rendered.index('"name": "weather"') < user
