"""The Responses API with function tools, end to end with the official ``openai`` client, on the
tiny dummy model carrying Qwen3's published chat template (hermes ``<tool_call>``): a required
call is the chat completion's call of the same conversation, whole and streamed (its argument
deltas join to the call), and a tool loop continued by ``previous_response_id`` with a
``function_call_output`` renders the same prompt as the chat completion of the whole loop."""

from __future__ import annotations

import json
from pathlib import Path

import openai
import pytest
from e2e.stack import free_port, running_stack
from factories import family_chat_model, responses_event_schema

pytestmark = pytest.mark.e2e

WEATHER = {
    "name": "get_weather",
    "description": "The weather of a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"enum": ["Paris", "Rome"]}},
        "required": ["city"],
        "additionalProperties": False,
    },
}
QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def client(dummy_model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    model_dir = family_chat_model(
        dummy_model_dir, tmp_path_factory.mktemp("qwen3") / "model", "qwen3.jinja"
    )
    log_dir = tmp_path_factory.mktemp("logs")
    with running_stack(model_dir, log_dir, http_listen=f"127.0.0.1:{free_port()}") as stack:
        yield openai.OpenAI(
            base_url=f"http://{stack.config.http_listen}/v1", api_key="-", max_retries=0
        )


def test_a_required_call_is_the_chat_completions_call(client, openai_spec) -> None:
    model = client.models.list().data[0].id
    raw = client.responses.with_raw_response.create(
        model=model,
        input=QUESTION,
        tools=[{"type": "function", **WEATHER}],
        tool_choice="required",
        temperature=0,
        max_output_tokens=200,
        parallel_tool_calls=False,
    )
    openai_spec("Response", raw.http_response.json())
    response = raw.parse()
    chat = client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": QUESTION}],
        tools=[{"type": "function", "function": WEATHER}],
        tool_choice="required",
        temperature=0,
        max_tokens=200,
        parallel_tool_calls=False,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        (c.function.name, json.loads(c.function.arguments))
        for c in chat.choices[0].message.tool_calls
    ]
    assert response.usage.input_tokens == chat.usage.prompt_tokens
    events = list(
        client.responses.create(
            model=model,
            input=QUESTION,
            tools=[{"type": "function", **WEATHER}],
            tool_choice="required",
            temperature=0,
            max_output_tokens=200,
            stream=True,
            parallel_tool_calls=False,
        )
    )
    for event in events:
        openai_spec(responses_event_schema(event.type), event.to_dict())
    done = [
        e.item
        for e in events
        if e.type == "response.output_item.done" and e.item.type == "function_call"
    ]
    assert [(c.name, c.arguments) for c in done] == [(c.name, c.arguments) for c in calls]
    for c in done:
        deltas = "".join(
            e.delta
            for e in events
            if e.type == "response.function_call_arguments.delta" and e.item_id == c.id
        )
        assert deltas == c.arguments
    assert events[-1].type == "response.completed"


def test_a_tool_loop_by_previous_response_id_is_the_whole_loops_prompt(client) -> None:
    model = client.models.list().data[0].id
    tools = [{"type": "function", **WEATHER}]
    first = client.responses.create(
        model=model,
        input=QUESTION,
        tools=tools,
        tool_choice="required",
        temperature=0,
        max_output_tokens=200,
        parallel_tool_calls=False,
    )
    (call,) = [item for item in first.output if item.type == "function_call"]
    second = client.responses.create(
        model=model,
        previous_response_id=first.id,
        tools=tools,
        temperature=0,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "sunny"}],
        max_output_tokens=5,
        store=False,
    )
    chat = client.chat.completions.create(
        model=model,
        messages=[
            {"role": "user", "content": QUESTION},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": call.call_id,
                        "type": "function",
                        "function": {"name": call.name, "arguments": call.arguments},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": call.call_id, "content": "sunny"},
        ],
        tools=[{"type": "function", "function": WEATHER}],
        temperature=0,
        max_tokens=5,
    )
    assert second.usage.input_tokens == chat.usage.prompt_tokens
    assert second.usage.input_tokens_details.cached_tokens > 0
