"""Tests for validate() of chat requests (``messages``): rendered, tokenized without another BOS."""

from __future__ import annotations

import pytest
from frontend.text.test_validation import MAX_MODEL_LEN, make_config, make_model, make_tokenizer

from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage, EngineRequest, GenerateParams
from zerolayer.frontend.text.chat_template import ChatTemplate
from zerolayer.frontend.text.validation import validate

TEMPLATE = ChatTemplate(
    "{{ bos_token }}{% for m in messages %}{{ m.role[0] }}:{{ m.content }};{% endfor %}"
    "{% if add_generation_prompt %}a:{% endif %}",
    {"bos_token": "<s>"},
)


def run(params: GenerateParams, template: ChatTemplate | None = TEMPLATE) -> EngineRequest:
    return validate(params, make_model(), make_tokenizer(), make_config(), template)


def chat(*messages: ChatMessage, add_generation_prompt: bool | None = None) -> GenerateParams:
    return GenerateParams(messages=messages, add_generation_prompt=add_generation_prompt)


def byte_ids(text: str) -> list[int]:
    return [b + 3 for b in text.encode()]


def test_messages_are_rendered_and_tokenized_with_the_templates_bos_only() -> None:
    request = run(chat(ChatMessage("user", "hi")))
    assert request.prompt_token_ids == (1, *byte_ids("u:hi;a:"))


def test_add_generation_prompt_false_leaves_it_out() -> None:
    request = run(chat(ChatMessage("user", "hi"), add_generation_prompt=False))
    assert request.prompt_token_ids == (1, *byte_ids("u:hi;"))


@pytest.mark.parametrize(
    ("params", "template", "field", "message"),
    [
        (chat(), TEMPLATE, "messages", "empty"),
        (chat(ChatMessage("user", "x"), ChatMessage("bot", "y")), TEMPLATE, "messages[1].role", ""),
        (chat(ChatMessage("user", "x")), None, "messages", "the model has no chat template"),
        (chat(ChatMessage("user", "x" * 20)), TEMPLATE, "messages", "tokens; the model's context"),
        (
            chat(ChatMessage("user", "x" * (MAX_MODEL_LEN * 64 + 1))),
            TEMPLATE,
            "messages",
            "characters; at most",
        ),
        (
            chat(ChatMessage("user", "x")),
            ChatTemplate("{{ raise_exception('no ' + messages[0].role) }}", {}),
            "messages",
            "the model's chat template failed: no user",
        ),
        (
            chat(ChatMessage("user", "x")),
            ChatTemplate("{% if %}", {}),
            "messages",
            "the model's chat template is invalid: ",
        ),
        (chat(ChatMessage("user", "x")), ChatTemplate("", {}), "messages", "renders no tokens"),
    ],
)
def test_invalid_chat_is_refused(
    params: GenerateParams, template: ChatTemplate | None, field: str, message: str
) -> None:
    with pytest.raises(InvalidArgument) as info:
        run(params, template)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ") and message in str(info.value)
