"""The tool-call and reasoning parsers on each family's output, whole and fed a character at a
time: the joined pieces are the same, no call's text leaks into the content."""

from __future__ import annotations

import pytest

from zerolayer.common.generation import GenerationChunk, join_tool_calls
from zerolayer.frontend.chat.output_parser import OutputPlan
from zerolayer.frontend.chat.reasoning import prompt_opens_thought, template_thinks
from zerolayer.frontend.chat.tool_formats import FORMATS, format_of_template, tool_format

WEATHER = '{"city": "Paris", "n": [1, {"a": "}\\" ]"}]}'
"""Arguments with brackets and an escaped quote inside a string."""
CASES = [
    # (format, output, content, calls)
    (
        "hermes",
        f'Let me look.<tool_call>\n{{"name": "get_weather", "arguments": {WEATHER}}}\n</tool_call>',
        "Let me look.",
        [("get_weather", WEATHER)],
    ),
    (
        "hermes",
        '<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n'
        '<tool_call>\n{"arguments": {"x": 1}, "name": "b"}\n</tool_call>',
        "",
        [("a", "{}"), ("b", '{"x": 1}')],
    ),
    (
        "hermes",
        "No call, only <b>text</b> and a <tool",
        "No call, only <b>text</b> and a <tool",
        [],
    ),
    (
        "llama3_json",
        f'{{"name": "get_weather", "parameters": {WEATHER}}}',
        "",
        [("get_weather", WEATHER)],
    ),
    (
        "llama3_json",
        '<|python_tag|>{"name": "a", "parameters": {"q": "x; y"}}; {"name": "b", "parameters": {}}',
        "",
        [("a", '{"q": "x; y"}'), ("b", "{}")],
    ),
    ("llama3_json", ' {"answer": {"name": 1}}', ' {"answer": {"name": 1}}', []),
    ("llama3_json", "Plain {text}", "Plain {text}", []),
    ("llama3_json", '{"\\u12": 1}', '{"\\u12": 1}', []),
    (
        "mistral",
        'Sure [TOOL_CALLS][{"name": "a", "arguments": {"k": "v"}}, '
        '{"name": "b", "arguments": {}, "id": "abcdefghi"}]',
        "Sure ",
        [("a", '{"k": "v"}'), ("b", "{}")],
    ),
    ("mistral", "[TOOL_CALL] is not [TOOL_CALLS", "[TOOL_CALL] is not [TOOL_CALLS", []),
    # [TOOL_CALLS] dropped by the detokenizer (a special token): the answer starts with the array
    ("mistral", '[{"name": "a", "arguments": {"k": [1]}}]', "", [("a", '{"k": [1]}')]),
    ("mistral", '[1, 2] {"name": "a"}', '[1, 2] {"name": "a"}', []),
    ("mistral", ' [{"x": 1}]', ' [{"x": 1}]', []),
]


def parse(plan: OutputPlan, output: str, by_char: bool, in_thought: bool = False):
    """(content, reasoning, calls, chunks) of ``output`` fed whole or a character at a time."""
    parser = plan.parser(in_thought)
    pieces = [parser.feed(c) for c in output] if by_char else [parser.feed(output)]
    pieces.append(parser.finish())
    chunks = [GenerationChunk("r", p.text, (), tool_call_deltas=p.tool_call_deltas) for p in pieces]
    calls = [(c.name, c.arguments) for c in join_tool_calls(chunks)]
    content = "".join(p.text for p in pieces)
    return content, "".join(p.reasoning_text for p in pieces), calls, chunks


@pytest.mark.parametrize("by_char", [False, True])
@pytest.mark.parametrize(("fmt", "output", "content", "calls"), CASES)
def test_calls_are_parsed_whole_and_streamed(fmt, output, content, calls, by_char) -> None:
    got = parse(OutputPlan(FORMATS[fmt]), output, by_char)
    assert got[:3] == (content, "", calls)


@pytest.mark.parametrize(("fmt", "output", "content", "calls"), CASES)
def test_a_stream_gives_each_call_its_id_and_name_first_then_arguments(
    fmt, output, content, calls
) -> None:
    *_, chunks = parse(OutputPlan(FORMATS[fmt]), output, by_char=True)
    deltas = [d for c in chunks for d in c.tool_call_deltas]
    firsts = [d for d in deltas if d.id]
    assert [(d.index, d.name) for d in firsts] == [(i, name) for i, (name, _) in enumerate(calls)]
    assert all(d.name == "" for d in deltas if not d.id)
    ids = [d.id for d in firsts]
    assert len(set(ids)) == len(ids)
    if fmt == "mistral":
        assert all(len(i) == 9 and i.isalnum() for i in ids)
    else:
        assert all(i.startswith("call_") for i in ids)
    # NOTE: the arguments stream while the model writes them: more pieces than calls
    if calls and fmt != "hermes":
        assert len(deltas) > len(calls)


def test_parallel_tool_calls_false_keeps_the_first_call() -> None:
    output = '[TOOL_CALLS][{"name": "a", "arguments": {}}, {"name": "b", "arguments": {}}]'
    plan = OutputPlan(FORMATS["mistral"], max_calls=1)
    assert parse(plan, output, by_char=True)[2] == [("a", "{}")]
    assert plan.parser(False).num_calls == 0


@pytest.mark.parametrize("by_char", [False, True])
@pytest.mark.parametrize(
    ("output", "in_thought", "content", "reasoning"),
    [
        ("<think>\nLet me see.\n</think>\n\nParis.", False, "Paris.", "\nLet me see.\n"),
        (
            "Plain answer <think>not a thought</think>",
            False,
            "Plain answer <think>not a thought</think>",
            "",
        ),
        ("Still thinking </think>\n\nDone", True, "Done", "Still thinking "),
        ("<think>cut by max_tokens </thi", False, "", "cut by max_tokens </thi"),
        ("<thin", False, "<thin", ""),
    ],
)
def test_reasoning_is_split_from_the_answer(output, in_thought, content, reasoning, by_char):
    got = parse(OutputPlan(thinks=True), output, by_char, in_thought)
    assert got[:3] == (content, reasoning, [])


def test_a_call_after_a_thought_is_parsed_and_one_inside_it_is_not() -> None:
    output = (
        '<think><tool_call>{"name": "x", "arguments": {}}</tool_call></think>\n\n'
        'Calling.<tool_call>\n{"name": "y", "arguments": {}}\n</tool_call>'
    )
    plan = OutputPlan(FORMATS["hermes"], thinks=True)
    for by_char in (False, True):
        content, reasoning, calls, _ = parse(plan, output, by_char)
        assert (content, calls) == ("Calling.", [("y", "{}")])
        assert reasoning == '<tool_call>{"name": "x", "arguments": {}}</tool_call>'


def test_the_format_is_the_templates_or_the_flags() -> None:
    assert format_of_template("{{ '<tool_call>\\n' }}") is FORMATS["hermes"]
    assert format_of_template('{{- "[TOOL_CALLS] [" }}') is FORMATS["mistral"]
    llama = "{%- set tool_call = m.tool_calls[0] %}{{- '\"parameters\": ' }}"
    assert format_of_template(llama) is FORMATS["llama3_json"]
    assert format_of_template("{{ messages[0].content }}") is None
    assert tool_format("auto", "{{ messages }}") is None
    assert tool_format("mistral", "{{ messages }}") is FORMATS["mistral"]
    assert tool_format("none", "<tool_call>") is None


def test_thoughts_are_found_in_templates_and_prompts() -> None:
    assert template_thinks("{{ '<think>\\n\\n</think>\\n\\n' }}")
    assert not template_thinks("{{ messages }}")
    assert prompt_opens_thought("<|Assistant|><think>\n")
    assert not prompt_opens_thought("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert not prompt_opens_thought("<|im_start|>assistant\n")
