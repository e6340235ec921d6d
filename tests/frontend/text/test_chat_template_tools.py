"""Chat templates with tools, tool calls in the history, tool results, reasoning and template
variables, rendered as transformers' ``apply_chat_template`` renders them, on the published
templates of Llama 3.1, Qwen2.5, Qwen3 and Mistral Nemo (tests/frontend/chat/templates and
chat_templates.json)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers
from factories import FAMILY_TEMPLATES

from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage, ToolCall, ToolDefinition
from zerolayer.frontend.text.chat_template import ChatTemplate, check_messages
from zerolayer.frontend.text.chat_variables import template_kwargs

TEMPLATES = {
    "llama3.1": (FAMILY_TEMPLATES / "llama3.1.jinja").read_text(),
    "qwen3": (FAMILY_TEMPLATES / "qwen3.jinja").read_text(),
    "mistral-nemo": (FAMILY_TEMPLATES / "mistral-nemo.jinja").read_text(),
    "qwen2.5": json.loads((Path(__file__).parent / "chat_templates.json").read_text())[
        "Qwen/Qwen2.5-0.5B-Instruct"
    ]["chat_template"],
}
TOOLS = (
    ToolDefinition(
        "get_weather",
        "The weather of a city",
        json.dumps({"type": "object", "properties": {"city": {"type": "string"}}}),
    ),
    ToolDefinition("get_time"),
)
CALL = ToolCall("abcDEF123", "get_weather", '{"city": "Paris", "days": [1, 2]}')
CONVERSATIONS = {
    "question": [ChatMessage("system", "Be brief."), ChatMessage("user", "Weather in Paris?")],
    "tool_loop": [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", "", tool_calls=(CALL,)),
        ChatMessage("tool", '{"temp": 21}', tool_call_id="abcDEF123"),
        ChatMessage("assistant", "It is 21."),
        ChatMessage("user", "Thanks"),
    ],
    "thought": [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello.", reasoning_content="Greet back."),
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "", tool_calls=(CALL,), reasoning_content="Call it."),
        ChatMessage("tool", "sunny", tool_call_id="abcDEF123"),
    ],
}


def hf_render(
    model_dir: Path, template: str, messages: list[ChatMessage], tools, **kwargs: object
) -> tuple[str, str]:
    """(transformers' rendering, the tokenizer_config.json it used)."""
    write_byte_level_tokenizer(model_dir, model_max_length=4096)
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "chat_template": template,
    }
    (model_dir / "tokenizer_config.json").write_text(json.dumps(config))
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    dicts = []
    for m in messages:
        d: dict = {"role": m.role, "content": m.content}
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        if m.tool_calls:
            d["tool_calls"] = [
                {
                    "id": c.id,
                    "type": "function",
                    "function": {"name": c.name, "arguments": json.loads(c.arguments)},
                }
                for c in m.tool_calls
            ]
        if m.reasoning_content:
            d["reasoning_content"] = m.reasoning_content
        dicts.append(d)
    tool_dicts = [
        {
            "type": "function",
            "function": {
                "name": t.name,
                **({"description": t.description} if t.description else {}),
                "parameters": json.loads(t.parameters_json),
            },
        }
        for t in tools
    ]
    text = tokenizer.apply_chat_template(
        dicts, tools=tool_dicts or None, tokenize=False, add_generation_prompt=True, **kwargs
    )
    return text, json.dumps(config)


@pytest.mark.parametrize("with_tools", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("family", sorted(TEMPLATES))
def test_tools_and_calls_render_as_transformers(
    tmp_path: Path, family: str, conversation: str, with_tools: bool
) -> None:
    messages = CONVERSATIONS[conversation]
    tools = TOOLS if with_tools else ()
    expected, config = hf_render(tmp_path, TEMPLATES[family], messages, tools)
    template = ChatTemplate.from_model_files(config)
    assert template.render(messages, True, tools) == expected


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_template_variables_render_as_transformers_kwargs(tmp_path: Path, enable_thinking) -> None:
    messages = CONVERSATIONS["question"]
    kwargs = {"enable_thinking": enable_thinking}
    expected, config = hf_render(tmp_path, TEMPLATES["qwen3"], messages, TOOLS, **kwargs)
    rendered = ChatTemplate.from_model_files(config).render(messages, True, TOOLS, kwargs)
    assert rendered == expected
    assert rendered.endswith("<think>\n\n</think>\n\n") is not enable_thinking


def test_a_variable_may_not_replace_what_the_renderer_sets() -> None:
    assert template_kwargs('{"enable_thinking": false}') == {"enable_thinking": False}
    for bad in ('{"tools": []}', "[1]", "{"):
        with pytest.raises(InvalidArgument) as refused:
            template_kwargs(bad)
        assert refused.value.field == "chat_template_kwargs"


def test_a_tool_result_must_answer_an_earlier_call_once_calls_are_in_the_history() -> None:
    check_messages([ChatMessage("user", "a"), ChatMessage("tool", "r", tool_call_id="x")])
    bad = [*CONVERSATIONS["tool_loop"][:2], ChatMessage("tool", "r", tool_call_id="other")]
    with pytest.raises(InvalidArgument) as refused:
        check_messages(bad)
    assert refused.value.field == "messages[2].tool_call_id"
    with pytest.raises(InvalidArgument) as refused:
        check_messages([ChatMessage("user", "a", tool_calls=(CALL,))])
    assert refused.value.field == "messages[0].tool_calls"
