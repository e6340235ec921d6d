"""A request's pins: checked, resolved to prompt prefixes (chat breakpoints by rendering), and
counted in its usage (zerolayer.frontend.prompt_cache). The kvstore side runs in
tests/e2e/test_prompt_caching.py."""

from __future__ import annotations

import asyncio

import pytest

from zerolayer.checkpoints.byte_tokenizer import build_byte_level_tokenizer
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import (
    PIN_KVSTORE_UNAVAILABLE,
    CachePin,
    ChatMessage,
    GenerateParams,
    Usage,
)
from zerolayer.frontend.kv_pin_client import KVPins, MadePin
from zerolayer.frontend.prompt_cache import RequestPins, check_cache_pins, plan_pins
from zerolayer.frontend.text.chat_template import ChatTemplate
from zerolayer.frontend.text.tokenizer import TextTokenizer

TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
MESSAGES = (ChatMessage("system", "be brief"), ChatMessage("user", "hello there"))


def tokenizer() -> TextTokenizer:
    return TextTokenizer.from_json(build_byte_level_tokenizer().to_str(), '{"bos_token": "<s>"}')


def chat_template() -> ChatTemplate:
    return ChatTemplate(TEMPLATE, {"bos_token": "<s>"})


def prompt_ids(params: GenerateParams) -> list[int]:
    text = chat_template().render(params.messages or (), True)
    return tokenizer().encode(text, add_special_tokens=False)


@pytest.mark.parametrize(
    ("pins", "messages", "field"),
    [
        ((CachePin(60),) * 5, None, "cache_pins"),
        ((CachePin(0),), None, "cache_pins[0].ttl_s"),
        ((CachePin(60), CachePin(86401)), None, "cache_pins[1].ttl_s"),
        ((CachePin(60, key="é" * 129),), None, "cache_pins[0].key"),
        ((CachePin(60, message_index=0),), None, "cache_pins[0].message_index"),
        ((CachePin(60, message_index=2),), MESSAGES, "cache_pins[0].message_index"),
        (
            (CachePin(60, message_index=0, content_offset=9),),
            MESSAGES,
            "cache_pins[0].content_offset",
        ),
        ((CachePin(60, 3, message_index=0),), MESSAGES, "cache_pins[0].num_prompt_tokens"),
        ((CachePin(60, content_offset=2),), MESSAGES, "cache_pins[0].content_offset"),
    ],
)
def test_pins_that_cannot_be_made_as_asked_are_refused_naming_the_field(
    pins, messages, field
) -> None:
    params = GenerateParams(prompt="x", cache_pins=pins, messages=messages)
    with pytest.raises(InvalidArgument) as raised:
        check_cache_pins(params)
    assert raised.value.field == field


def test_a_chat_breakpoint_resolves_to_the_tokens_before_it_in_the_rendered_prompt() -> None:
    pins = (
        CachePin(60, message_index=0, content_offset=len("be brief")),  # end of the system's
        CachePin(60, message_index=1, content_offset=0),  # where the user's content starts
        CachePin(60),  # the whole prompt
        CachePin(60, include_output=True),
    )
    params = GenerateParams(messages=MESSAGES, cache_pins=pins)
    ids = prompt_ids(params)
    plan = plan_pins(params, ids, chat_template(), tokenizer())
    text = "<s><|system|>be brief\n<|user|>hello there\n<|assistant|>"
    assert tokenizer().decode(ids, skip_special_tokens=False) == text
    expected = [
        len(tokenizer().encode("<s><|system|>be brief", add_special_tokens=False)),
        len(tokenizer().encode("<s><|system|>be brief\n<|user|>", add_special_tokens=False)),
        len(ids),
    ]
    assert [n for n, _ in plan.prefixes] == expected
    assert plan.with_output == (pins[3],)


def test_a_breakpoint_the_template_renders_otherwise_moves_back_to_where_they_part() -> None:
    trimming = ChatTemplate(TEMPLATE.replace("m.content", "m.content | trim"), {})
    messages = (ChatMessage("system", "be brief  "), ChatMessage("user", "hi"))
    pins = (CachePin(60, message_index=0, content_offset=len("be brief  ")),)
    params = GenerateParams(messages=messages, cache_pins=pins)
    text = trimming.render(messages, True)
    ids = tokenizer().encode(text, add_special_tokens=False)
    [(n, _)] = plan_pins(params, ids, trimming, tokenizer()).prefixes
    # With the marker after the spaces, trim keeps them: the renderings part at "be brief".
    assert n == len(tokenizer().encode("<|system|>be brief", add_special_tokens=False))


def test_num_prompt_tokens_past_the_prompt_is_refused() -> None:
    params = GenerateParams(prompt="abc", cache_pins=(CachePin(60, num_prompt_tokens=4),))
    with pytest.raises(InvalidArgument) as raised:
        plan_pins(params, [1, 2, 3], None, tokenizer())
    assert raised.value.field == "cache_pins[0].num_prompt_tokens"


def test_usage_counts_the_longest_pin_less_what_was_read_and_the_first_refusal() -> None:
    plan = plan_pins(GenerateParams(prompt="x"), [1], None, None)
    pins = RequestPins(KVPins(""), plan, "", tuple(range(100)))
    usage = Usage(100, 5, 32)
    assert pins.usage(usage) == usage  # nothing pinned yet
    pins.made = [MadePin("a", 64), MadePin(refusal="pin-over-budget"), MadePin("b", 96)]
    assert pins.usage(usage) == Usage(100, 5, 32, 64, 96, "pin-over-budget")
    assert pins.pin_ids == ("a", "b")
    pins.made = [MadePin("c", 112)]  # a pin of prompt and output: the prompt's part counts
    assert pins.usage(usage) == Usage(100, 5, 32, 68, 100, "")


def test_without_a_kvstore_every_pin_is_refused_and_nothing_raises() -> None:
    made = asyncio.run(KVPins("").pin([1, 2, 3], "salt", 60))
    assert made == MadePin(refusal=PIN_KVSTORE_UNAVAILABLE)
    asyncio.run(KVPins("").release(["x"]))
