"""Chat templates rendered as transformers' ``apply_chat_template`` renders them.

The reference is transformers' ``PreTrainedTokenizerFast.apply_chat_template(..., tokenize=False)``
over the same tokenizer_config.json. The five templates in chat_templates.json are the real ones
of their models' tokenizer_config.json (Llama 3, Qwen2.5, Gemma, Mixtral, SmolLM2).
"""

from __future__ import annotations

import json
from pathlib import Path

import jinja2
import pytest
import transformers

from zerolayer.checkpoints.byte_tokenizer import write_byte_level_tokenizer
from zerolayer.common.errors import InvalidArgument
from zerolayer.common.generation import ChatMessage
from zerolayer.frontend.text.chat_template import ChatTemplate, check_messages

TEMPLATES: dict[str, dict] = json.loads((Path(__file__).parent / "chat_templates.json").read_text())
CONVERSATIONS = {
    "user": [ChatMessage("user", "  Hello, who are you?  ")],
    "system_user": [
        ChatMessage("system", "You are terse."),
        ChatMessage("user", "Name a prime."),
    ],
    "multi_turn": [
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hello! How can I help?"),
        ChatMessage("user", 'Say "<b>&</b>" ünïcode'),
    ],
    "system_multi_turn": [
        ChatMessage("system", "Be kind."),
        ChatMessage("user", "Hi"),
        ChatMessage("assistant", "Hey."),
        ChatMessage("user", "Bye"),
    ],
    "tool": [
        ChatMessage("user", "Weather?"),
        ChatMessage("assistant", "Calling."),
        ChatMessage("tool", "sunny", tool_call_id="c1"),
    ],
}


def make_model_dir(path: Path, tokenizer_config: dict) -> Path:
    """The dummy model's byte tokenizer with ``tokenizer_config`` as its tokenizer_config.json."""
    write_byte_level_tokenizer(path, model_max_length=2048)
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokenizer_config}
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def as_dicts(messages: list[ChatMessage]) -> list[dict[str, str]]:
    dicts = []
    for m in messages:
        d = {"role": m.role, "content": m.content}
        if m.tool_call_id:
            d["tool_call_id"] = m.tool_call_id
        dicts.append(d)
    return dicts


def hf_render(model_dir: Path, messages: list[ChatMessage], add_generation_prompt: bool) -> str:
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    return tokenizer.apply_chat_template(
        as_dicts(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


@pytest.mark.parametrize("add_generation_prompt", [True, False])
@pytest.mark.parametrize("conversation", sorted(CONVERSATIONS))
@pytest.mark.parametrize("model", sorted(TEMPLATES))
def test_render_matches_transformers(
    tmp_path: Path, model: str, conversation: str, add_generation_prompt: bool
) -> None:
    model_dir = make_model_dir(tmp_path, TEMPLATES[model])
    template = ChatTemplate.from_model_files((model_dir / "tokenizer_config.json").read_text())
    assert template is not None
    messages = CONVERSATIONS[conversation]
    try:
        expected = hf_render(model_dir, messages, add_generation_prompt)
    except jinja2.TemplateError as exc:
        # Gemma and Mixtral refuse system (and tool) messages with raise_exception
        with pytest.raises(InvalidArgument) as refused:
            template.render(messages, add_generation_prompt)
        assert refused.value.field == "messages"
        assert str(refused.value) == f"messages: the model's chat template failed: {exc}"
        return
    assert template.render(messages, add_generation_prompt) == expected


def test_block_whitespace_is_trimmed_as_transformers_does(tmp_path: Path) -> None:
    source = (
        "{% for message in messages %}\n"
        "    {% if message.role == 'user' %}\n"
        "U: {{ message.content }}\n"
        "    {% else %}\n"
        "{{ message.role }}: {{ message.content }}\n"
        "    {% endif %}\n"
        "{% endfor %}\n"
        "{% if add_generation_prompt %}A:{% endif %}"
    )
    model_dir = make_model_dir(tmp_path, {"chat_template": source})
    messages = CONVERSATIONS["system_multi_turn"]
    expected = hf_render(model_dir, messages, True)
    assert expected.startswith("system: Be kind.\nU: Hi\n")
    assert ChatTemplate(source, {}).render(messages, True) == expected


def test_gemma_and_mixtral_refusals_are_the_templates_messages(tmp_path: Path) -> None:
    gemma = ChatTemplate.from_model_files(json.dumps(TEMPLATES["google/gemma-7b-it"]))
    with pytest.raises(InvalidArgument, match=r"^messages: .*System role not supported$"):
        gemma.render(CONVERSATIONS["system_user"], True)
    mixtral = ChatTemplate.from_model_files(
        json.dumps(TEMPLATES["mistralai/Mixtral-8x7B-Instruct-v0.1"])
    )
    with pytest.raises(InvalidArgument, match=r"Conversation roles must alternate"):
        mixtral.render([ChatMessage("assistant", "hi")], True)


def test_llama3_rendering_exact_text() -> None:
    template = ChatTemplate.from_model_files(
        json.dumps(TEMPLATES["meta-llama/Meta-Llama-3-8B-Instruct"])
    )
    assert template.render(CONVERSATIONS["system_user"], True) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nName a prime.<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_chat_template_jinja_wins_over_tokenizer_config() -> None:
    config = json.dumps({"chat_template": "config", "bos_token": "<s>"})
    template = ChatTemplate.from_model_files(config, "{{ bos_token }}jinja")
    assert template.render([ChatMessage("user", "x")], True) == "<s>jinja"


def test_named_templates_use_default() -> None:
    config = json.dumps(
        {
            "chat_template": [
                {"name": "tool_use", "template": "T"},
                {"name": "default", "template": "D"},
            ]
        }
    )
    assert ChatTemplate.from_model_files(config).render([ChatMessage("user", "x")], True) == "D"
    only_tools = json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}]})
    assert ChatTemplate.from_model_files(only_tools) is None


@pytest.mark.parametrize("config", ["", "{}", '{"chat_template": null}', '{"chat_template": ""}'])
def test_no_template_is_none(config: str) -> None:
    assert ChatTemplate.from_model_files(config) is None


@pytest.mark.parametrize("value", ["1", "[1]", '{"a": "b"}'])
def test_malformed_chat_template_field_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="chat_template must be"):
        ChatTemplate.from_model_files(f'{{"chat_template": {value}}}')


def test_syntax_error_is_reported_at_render_with_jinja2s_message() -> None:
    template = ChatTemplate.from_model_files('{"chat_template": "{% for m in messages %}x"}')
    with pytest.raises(jinja2.TemplateSyntaxError) as jinja_error:
        jinja2.Environment().from_string("{% for m in messages %}x")
    with pytest.raises(InvalidArgument) as refused:
        template.render([ChatMessage("user", "x")], True)
    assert str(refused.value) == (
        f"messages: the model's chat template is invalid: {jinja_error.value.message} (line 1)"
    )


def test_sandbox_refuses_unsafe_access() -> None:
    template = ChatTemplate("{{ messages.__class__.__mro__ }}", {})
    with pytest.raises(InvalidArgument, match="messages: the model's chat template failed"):
        template.render([ChatMessage("user", "x")], True)


def test_transformers_helpers_are_available() -> None:
    source = (
        "{{ messages[0] | tojson }}|{{ strftime_now('%Y') | length }}|"
        "{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}"
        "{{ m.role }}{% endfor %}|"
        "{% set ns = namespace(n=0) %}{% set ns.n = 2 %}{{ ns.n }}|{{ dict(a=1).a }}|"
        "{% generation %}g{% endgeneration %}"
    )
    messages = [ChatMessage("user", "<&>"), ChatMessage("assistant", "y", name="bot")]
    assert ChatTemplate(source, {}).render(messages, True) == (
        '{"role": "user", "content": "<&>"}|4|assistant|2|1|g'
    )


def test_check_messages() -> None:
    check_messages([ChatMessage(role, "x") for role in ("system", "user", "assistant", "tool")])
    with pytest.raises(InvalidArgument, match=r"^messages: empty"):
        check_messages([])
    with pytest.raises(InvalidArgument, match=r"^messages\[1\]\.role: must be one of"):
        check_messages([ChatMessage("user", "x"), ChatMessage("robot", "y")])
