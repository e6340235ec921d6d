"""Tool calls end to end with the official ``openai`` client, on the tiny dummy model carrying the
published chat template of three families (Qwen3: hermes ``<tool_call>``; Llama 3.1: JSON;
Mistral Nemo: ``[TOOL_CALLS]``), one module-scoped stack per family (three stack starts, about
7 s each on a quiet machine).

The random model writes a call only when decoding is constrained (``tool_choice`` required or
named), so those are the calls checked here: each parsed call is compared with the raw text the
same greedy generation writes (the rendered prompt's ids from transformers, the same grammar,
over gRPC), parsed by the test on its own; each rendered prompt with transformers'
``apply_chat_template`` (byte-level tokenizer: the token count is the character count). ``auto``
parsing of real calls is covered by tests/frontend/chat's parser tests.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import anthropic
import grpc
import openai
import pytest
import transformers
from e2e.stack import free_port, running_stack, text_stub
from factories import family_chat_model

from zerolayer.common.generation import ToolDefinition
from zerolayer.frontend.chat.tool_formats import FORMATS
from zerolayer.frontend.chat.tool_grammar import tool_call_grammar
from zerolayer.v1 import generation_pb2 as pb

pytestmark = pytest.mark.e2e

FAMILIES = {
    "qwen3.jinja": "hermes",
    "llama3.1.jinja": "llama3_json",
    "mistral-nemo.jinja": "mistral",
}
"""Template file -> the tool-call format it writes."""
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"enum": ["Paris", "Rome"]}, "unit": {"enum": ["c", "f"]}},
                "required": ["city", "unit"],
                "additionalProperties": False,
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The time in a zone",
            "parameters": {
                "type": "object",
                "properties": {"tz": {"enum": ["UTC", "CET"]}},
                "required": ["tz"],
                "additionalProperties": False,
            },
        },
    },
]
QUESTION = [{"role": "user", "content": "What is the weather in Paris?"}]
MAX_TOKENS = 200


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    """(template file, model dir, stack) of one family."""
    model_dir = family_chat_model(
        dummy_model_dir, tmp_path_factory.mktemp("family") / "model", request.param
    )
    log_dir = tmp_path_factory.mktemp("logs")
    with running_stack(model_dir, log_dir, http_listen=f"127.0.0.1:{free_port()}") as stack:
        yield request.param, model_dir, stack


@pytest.fixture(scope="module")
def client(family, openai_spec) -> openai.OpenAI:
    """The official client; every answer it reads (each stream chunk too) is checked against
    OpenAI's pinned specification (tests/openai_conformance.py)."""
    return openai_spec.client(f"http://{family[2].config.http_listen}/v1", timeout=60)


def hf_prompt_ids(model_dir: Path, messages: list[dict], tools: list[dict] | None) -> list[int]:
    """transformers' rendering and tokenization (arguments of calls as dicts, as its templates
    take them; the client's null fields left out)."""
    tokenizer = transformers.PreTrainedTokenizerFast.from_pretrained(model_dir)
    history = []
    for message in messages:
        message = {k: v for k, v in message.items() if v is not None}
        if "tool_calls" in message:
            message["tool_calls"] = [
                {
                    **c,
                    "function": {
                        **c["function"],
                        "arguments": json.loads(c["function"]["arguments"]),
                    },
                }
                for c in message["tool_calls"]
            ]
        history.append(message)
    encoding = tokenizer.apply_chat_template(history, tools=tools, add_generation_prompt=True)
    return list(encoding["input_ids"])


def raw_output(stack, prompt_ids: list[int], fmt: str, tools: list[dict], parallel: bool, **fields):
    """The greedy text of ``prompt_ids`` under the call grammar of ``tools``, unparsed (gRPC)."""
    definitions = [
        ToolDefinition(t["function"]["name"], "", json.dumps(t["function"]["parameters"]))
        for t in tools
    ]
    grammar = tool_call_grammar(FORMATS[fmt], definitions, parallel)
    request = pb.GenerateRequest(
        prompt_token_ids=pb.TokenIds(ids=prompt_ids),
        max_new_tokens=MAX_TOKENS,
        structured_output=pb.StructuredOutput(grammar=grammar),
        **fields,
    )
    return text_stub(stack).Generate(request, timeout=60).text


def calls_of(raw: str, fmt: str) -> list[tuple[str, str]]:
    """(name, arguments) of each whole call in ``raw``, parsed by the test alone."""
    if fmt == "hermes":
        objects = [
            json.loads(o) for o in re.findall(r"<tool_call>\n(.*?)\n</tool_call>", raw, re.S)
        ]
        key = "arguments"
    elif fmt == "llama3_json":
        objects = [json.loads(o) for o in raw.split("; ") if o.endswith("}}")]
        key = "parameters"
    else:
        body = raw.removeprefix("[TOOL_CALLS][").removesuffix("]")
        objects = [json.loads(o) for o in re.findall(r'\{"name".*?\}\}', body)]
        key = "arguments"
    return [(o["name"], json.dumps(o[key], separators=(",", ":"))) for o in objects]


def chat(client, messages, **fields):
    model = client.models.list().data[0].id
    body = {"temperature": 0, "max_tokens": MAX_TOKENS, "tools": TOOLS, **fields}
    return client.chat.completions.create(model=model, messages=messages, **body)


def named(name: str) -> dict:
    return {"type": "function", "function": {"name": name}}


@pytest.mark.parametrize(
    ("tool_choice", "tools"),
    [("required", TOOLS), (named("get_time"), TOOLS[1:])],
)
def test_a_required_or_named_call_is_parsed_exactly(family, client, tool_choice, tools) -> None:
    template, model_dir, stack = family
    fmt = FAMILIES[template]
    prompt_ids = hf_prompt_ids(model_dir, QUESTION, TOOLS)
    answer = chat(client, QUESTION, tool_choice=tool_choice, parallel_tool_calls=False)
    choice = answer.choices[0]
    assert answer.usage.prompt_tokens == len(prompt_ids)
    assert (choice.finish_reason, choice.message.content) == ("tool_calls", None)
    expected = calls_of(raw_output(stack, prompt_ids, fmt, tools, parallel=False), fmt)
    assert len(expected) == 1
    calls = choice.message.tool_calls
    assert [(c.function.name, c.function.arguments) for c in calls] == expected
    assert calls[0].type == "function"
    assert re.fullmatch(r"[A-Za-z0-9]{9}" if fmt == "mistral" else r"call_\w{24}", calls[0].id)


def test_parallel_calls_are_all_parsed_and_stream_as_openai_deltas(family, client) -> None:
    template, model_dir, stack = family
    fmt = FAMILIES[template]
    prompt_ids = hf_prompt_ids(model_dir, QUESTION, TOOLS)
    whole = chat(client, QUESTION, tool_choice="required")
    expected = calls_of(raw_output(stack, prompt_ids, fmt, TOOLS, parallel=True), fmt)
    calls = [(c.function.name, c.function.arguments) for c in whole.choices[0].message.tool_calls]
    assert len(expected) >= 2  # the greedy model repeats its call until max_tokens
    assert calls[: len(expected)] == expected
    assert all(not _is_json(arguments) for _, arguments in calls[len(expected) :])
    stream = chat(client, QUESTION, tool_choice="required", stream=True)
    joined: dict[int, list[str]] = {}
    finish_reasons, contents = [], []
    for event in stream:
        delta = event.choices[0].delta
        contents.append(delta.content or "")
        finish_reasons.append(event.choices[0].finish_reason)
        for piece in delta.tool_calls or ():
            if piece.index not in joined:
                assert piece.id and piece.type == "function" and piece.function.name
                joined[piece.index] = [piece.function.name, piece.function.arguments or ""]
            else:
                assert (piece.id, piece.function.name) == (None, None)
                joined[piece.index][1] += piece.function.arguments
    assert [tuple(joined[i]) for i in sorted(joined)] == calls
    assert "".join(contents) == ""
    assert finish_reasons[-1] == whole.choices[0].finish_reason


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def test_auto_without_a_call_is_plain_text(family, client) -> None:
    answer = chat(client, QUESTION, tool_choice="auto", max_tokens=8)
    message = answer.choices[0].message
    assert message.tool_calls is None
    assert message.content and answer.choices[0].finish_reason == "length"


def test_a_three_turn_tool_loop(family, client) -> None:
    template, model_dir, _ = family
    tools = TOOLS[1:]  # one short tool: Llama 3.1's prompt of both would fill the context
    messages: list[dict] = [{"role": "user", "content": "What time is it?"}]
    first = chat(client, messages, tools=tools, tool_choice="required", parallel_tool_calls=False)
    call = first.choices[0].message.tool_calls[0]
    messages.append(first.choices[0].message.model_dump())
    messages.append({"role": "tool", "tool_call_id": call.id, "content": '{"time": "12:00"}'})
    second = chat(client, messages, tools=tools, max_tokens=8)
    assert second.usage.prompt_tokens == len(hf_prompt_ids(model_dir, messages, tools))
    assert second.choices[0].message.tool_calls is None
    messages.append(second.choices[0].message.model_dump())
    messages.append({"role": "user", "content": "And now?"})
    third = chat(client, messages, tools=tools, tool_choice=named("get_time"), max_tokens=100)
    assert third.usage.prompt_tokens == len(hf_prompt_ids(model_dir, messages, tools))
    assert [c.function.name for c in third.choices[0].message.tool_calls] == ["get_time"]
    assert third.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    ("fields", "param"),
    [
        (
            {
                "tools": [
                    {**TOOLS[1], "function": {"name": "f", "parameters": {"type": "nonsense"}}}
                ]
            },
            "tools[0].function.parameters",
        ),
        ({"tool_choice": named("get_news")}, "tool_choice"),
        (
            {"messages": [*QUESTION, {"role": "tool", "tool_call_id": "nobody", "content": "1"}]},
            "messages[1].tool_call_id",
        ),
    ],
)
def test_bad_tool_input_is_a_400_naming_the_param(family, client, fields, param) -> None:
    body = {"messages": QUESTION, **fields}
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, **body)
    assert refused.value.body["param"] == param
    assert chat(client, QUESTION, max_tokens=2).choices[0].finish_reason == "length"


def test_grpc_generate_returns_the_calls_and_reasoning(family) -> None:
    template, _, stack = family
    call = pb.ToolCall(id="abcdefghi", name="get_time", arguments='{"tz": "UTC"}')
    chat_messages = pb.ChatMessages(
        messages=[
            pb.ChatMessage(role="user", content="Time?"),
            pb.ChatMessage(role="assistant", tool_calls=[call]),
            pb.ChatMessage(role="tool", tool_call_id="abcdefghi", content="12:00"),
            pb.ChatMessage(role="assistant", content="It is noon."),
            pb.ChatMessage(role="user", content="Again?"),
        ]
    )
    tools = [
        pb.ToolDefinition(
            name=t["function"]["name"], parameters_json=json.dumps(t["function"]["parameters"])
        )
        for t in TOOLS
    ]
    request = pb.GenerateRequest(
        messages=chat_messages,
        tools=tools,
        tool_choice=pb.ToolChoice(mode="function", name="get_weather"),
        max_new_tokens=MAX_TOKENS,
    )
    response = text_stub(stack).Generate(request, timeout=60)
    assert response.finish_reason == pb.FINISH_REASON_TOOL_CALLS
    bad = pb.GenerateRequest(
        messages=chat_messages, tools=[pb.ToolDefinition(name="f", parameters_json="[1]")]
    )
    with pytest.raises(grpc.RpcError) as refused:
        text_stub(stack).Generate(bad, timeout=60)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("tools[0].parameters_json: ")
    assert [(d.index, d.name) for d in response.tool_call_deltas] == [(0, "get_weather")]
    assert json.loads(response.tool_call_deltas[0].arguments).keys() == {"city", "unit"}
    if template == "qwen3.jinja":
        # a thought the template's format writes, forced by a regex: parsed apart from the answer
        thought = pb.GenerateRequest(
            messages=pb.ChatMessages(messages=[pb.ChatMessage(role="user", content="Hi")]),
            structured_output=pb.StructuredOutput(regex="<think>\nabc\n</think>\n\nok"),
            parse_output=True,
            max_new_tokens=64,
        )
        answer = text_stub(stack).Generate(thought, timeout=60)
        assert (answer.reasoning_text, answer.text) == ("\nabc\n", "ok")


def doc_example(language: str, index: int = 0) -> str:
    """The ``index``-th ``language`` code block of docs/tools-and-reasoning.md."""
    doc = (Path(__file__).parents[2] / "docs" / "tools-and-reasoning.md").read_text()
    return re.findall(rf"```{language}\n(.*?)```", doc, re.S)[index]


def test_the_docs_examples_run(family, capsys) -> None:
    template, _, stack = family
    if template != "qwen3.jinja":
        pytest.skip("one family runs the docs' examples")
    url = f"http://{stack.config.http_listen}/v1"
    exec(doc_example("python", 0).replace("http://127.0.0.1:8000/v1", url), {})  # noqa: S102
    answer = capsys.readouterr().out
    assert answer.strip()
    exec(doc_example("python", 1), {"stub": text_stub(stack)})  # noqa: S102
    calls, reason = capsys.readouterr().out.rsplit(" ", 1)
    assert calls.startswith("[('get_time', ") and int(reason) == pb.FINISH_REASON_TOOL_CALLS


def test_zerolayer_generate_prints_the_calls(family, tmp_path, capsys) -> None:
    from zerolayer.cli.main import main as zerolayer_main

    template, model_dir, stack = family
    (tmp_path / "chat.json").write_text(json.dumps(QUESTION))
    (tmp_path / "tools.json").write_text(json.dumps(TOOLS))
    argv = ["generate", "--messages", str(tmp_path / "chat.json"), "--tools"]
    argv += [str(tmp_path / "tools.json"), "--tool-choice", "get_time", "--max-new-tokens=200"]
    for stream in ([], ["--stream"]):
        assert zerolayer_main([*argv, *stream, "--address", stack.config.listen]) == 0
        out, err = capsys.readouterr()
        call = json.loads(out.strip())
        assert (call["name"], json.loads(call["arguments"])["tz"] in ("UTC", "CET")) == (
            "get_time",
            True,
        )
        prompt_tokens = len(hf_prompt_ids(model_dir, QUESTION, TOOLS))
        assert f"finish_reason tool_calls; prompt_tokens {prompt_tokens}," in err


def test_tools_on_a_template_without_a_call_format_are_a_400(shared_stack) -> None:
    url = f"http://{shared_stack.stack.config.http_listen}/v1"
    client = openai.OpenAI(base_url=url, api_key="-", max_retries=0, timeout=60)
    with pytest.raises(openai.BadRequestError) as refused:
        chat(client, QUESTION)
    assert refused.value.body["param"] == "tools"
    assert "no tool-call format" in refused.value.body["message"]
    assert chat(client, QUESTION, tools=None, max_tokens=2).choices[0].finish_reason == "length"


def test_auto_parses_a_call_the_model_wrote(family, client) -> None:
    template, _, _ = family
    fmt = FAMILIES[template]
    if fmt == "hermes":
        pytest.skip("a JSON schema cannot make the model write <tool_call> tags")
    # NOTE: the random model writes a call only when made to: here by a JSON schema of the call
    # (Llama's object; Mistral's array, its [TOOL_CALLS] being a special token), which auto
    # parses as what the model wrote.
    key = FORMATS[fmt].arguments_key
    call = {
        "type": "object",
        "properties": {"name": {"const": "get_time"}, key: TOOLS[1]["function"]["parameters"]},
        "required": ["name", key],
        "additionalProperties": False,
    }
    schema = (
        call
        if fmt == "llama3_json"
        else {"type": "array", "items": call, "minItems": 1, "maxItems": 1}
    )
    response_format = {"type": "json_schema", "json_schema": {"name": "call", "schema": schema}}
    for stream in (False, True):
        answer = chat(client, QUESTION, response_format=response_format, stream=stream)
        if stream:
            events = list(answer)
            pieces = [p for e in events for p in e.choices[0].delta.tool_calls or ()]
            calls = [(pieces[0].function.name, "".join(p.function.arguments for p in pieces))]
            contents = "".join(e.choices[0].delta.content or "" for e in events)
            finish_reason = events[-1].choices[0].finish_reason
        else:
            message = answer.choices[0].message
            calls = [(c.function.name, c.function.arguments) for c in message.tool_calls]
            contents, finish_reason = message.content or "", answer.choices[0].finish_reason
        assert (contents, finish_reason) == ("", "tool_calls")
        assert len(calls) == 1 and calls[0][0] == "get_time"
        assert json.loads(calls[0][1])["tz"] in ("UTC", "CET")


def anthropic_tools(tools: list[dict]) -> list[dict]:
    """``tools`` (OpenAI's shape) in Anthropic's: name, description, input_schema."""
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "input_schema": t["function"]["parameters"],
        }
        for t in tools
    ]


def test_anthropic_tool_use_is_the_same_call_whole_streamed_and_in_a_loop(family, client) -> None:
    """Anthropic's Messages API on the same family: a named tool (``tool_choice: tool``) is the
    call OpenAI's named call gives, its ``input_json_delta`` pieces join to it, and a tool loop
    (the ``tool_use`` echoed back, a ``tool_result``) renders as transformers renders it."""
    template, model_dir, stack = family
    url = f"http://{stack.config.http_listen}"
    messages = anthropic.Anthropic(base_url=url, api_key="-", max_retries=0, timeout=60).messages
    model = client.models.list().data[0].id
    body = {
        "model": model,
        "max_tokens": MAX_TOKENS,
        "messages": QUESTION,
        "tools": anthropic_tools(TOOLS),
        "tool_choice": {"type": "tool", "name": "get_weather"},
        "extra_body": {"temperature": 0},  # NOTE: anthropic 2.15's create takes no temperature
    }
    answer = messages.create(**body)
    openai_call = chat(
        client, QUESTION, tool_choice=named("get_weather"), parallel_tool_calls=False
    )
    [expected] = openai_call.choices[0].message.tool_calls
    [tool_use] = answer.content
    assert (answer.stop_reason, tool_use.type, tool_use.name) == (
        "tool_use",
        "tool_use",
        "get_weather",
    )
    assert tool_use.input == json.loads(expected.function.arguments)
    assert answer.usage.input_tokens + (answer.usage.cache_read_input_tokens or 0) == len(
        hf_prompt_ids(model_dir, QUESTION, TOOLS)
    )
    pieces = []
    with messages.stream(**body) as stream:
        for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "input_json_delta":
                pieces.append(event.delta.partial_json)
        streamed = stream.get_final_message()
    assert json.loads("".join(pieces)) == tool_use.input
    assert streamed.content[0].input == tool_use.input and streamed.stop_reason == "tool_use"
    loop = [
        *QUESTION,
        {"role": "assistant", "content": [tool_use.model_dump(exclude_none=True)]},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "Sunny"}],
        },
    ]
    after = messages.create(
        **{**body, "messages": loop, "tool_choice": {"type": "none"}, "max_tokens": 8}
    )
    assert after.stop_reason in ("end_turn", "max_tokens")
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": tool_use.id,
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": json.dumps(tool_use.input)},
                }
            ],
        },
        {"role": "tool", "tool_call_id": tool_use.id, "content": "Sunny"},
    ]
    usage = after.usage
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) == len(
        hf_prompt_ids(model_dir, history, TOOLS)
    )


def test_a_stop_string_inside_a_call_ends_it_with_stop_not_tool_calls(family, client) -> None:
    # Found from outside: the cut call came back as a finished one (finish_reason tool_calls,
    # arguments '{"'), and an agent would have run the tool with them.
    answer = chat(client, QUESTION, tool_choice=named("get_time"), stop=["tz"])
    assert answer.choices[0].finish_reason == "stop"
    url = f"http://{family[2].config.http_listen}"
    messages = anthropic.Anthropic(base_url=url, api_key="-", max_retries=0, timeout=60).messages
    cut = messages.create(
        model=client.models.list().data[0].id,
        max_tokens=MAX_TOKENS,
        messages=QUESTION,
        tools=anthropic_tools(TOOLS[1:]),
        tool_choice={"type": "any"},
        stop_sequences=["tz"],
        extra_body={"temperature": 0},
    )
    assert (cut.stop_reason, cut.stop_sequence) == ("stop_sequence", "tz")


@pytest.mark.parametrize(
    "arguments",
    ['{"tz": ' + "9" * 5000 + "}", '{"tz": "\\ud800"}'],
    ids=["an integer over 4300 digits", "a lone surrogate"],
)
def test_odd_arguments_in_the_history_are_never_a_500(family, client, arguments) -> None:
    # Found from outside: both were a 500 with an ERROR traceback.
    history = [
        *QUESTION,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_time", "arguments": arguments},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
    ]
    body = {"model": client.models.list().data[0].id, "messages": history, "max_tokens": 2}
    # A 400 either way: the digits overflow the tiny model's context, the surrogate is no text.
    with pytest.raises(openai.BadRequestError) as refused:
        client.post("/chat/completions", body=body, cast_to=object)
    assert refused.value.body["param"] in ("messages", "max_tokens")
