"""``zerolayer generate``'s flags become exactly the GenerateRequest they describe, and its output
says why generation stopped. Against a real stack: tests/e2e/test_generate.py."""

from __future__ import annotations

import io
import json

import pytest

from zerolayer.cli.client import UsageError
from zerolayer.cli.generate_output import print_response, print_stream, summary_line
from zerolayer.cli.generate_request import request_from_args
from zerolayer.cli.main import build_parser
from zerolayer.cli.main import main as zerolayer_main
from zerolayer.v1 import generation_pb2 as pb


def parse(*argv: str):
    return build_parser().parse_args(["generate", *argv])


def test_every_request_flag_sets_its_field() -> None:
    args = parse(
        "hi",
        "--max-new-tokens=9",
        "--min-new-tokens=2",
        "--temperature=0.5",
        "--top-p=0.75",
        "--top-k=3",
        "--min-p=0.25",
        "--seed=7",
        "--repetition-penalty=1.5",
        "--presence-penalty=-0.5",
        "--frequency-penalty=0.25",
        "--logit-bias=5=-100",
        "--logit-bias=6=2.5",
        "--stop=.",
        "--stop-token-id=13",
        "--ignore-eos",
        "-n",
        "3",
        "--logprobs=2",
        "--prompt-logprobs=1",
        "--regex=[a-z]+",
        "--cache-salt=s",
        "--request-id=r1",
        "--model=m",
    )
    expected = pb.GenerateRequest(
        prompt="hi",
        max_new_tokens=9,
        min_new_tokens=2,
        temperature=0.5,
        top_p=0.75,
        top_k=3,
        min_p=0.25,
        seed=7,
        repetition_penalty=1.5,
        presence_penalty=-0.5,
        frequency_penalty=0.25,
        logit_bias={5: -100.0, 6: 2.5},
        stop=["."],
        stop_token_ids=[13],
        ignore_eos=True,
        n=3,
        logprobs=2,
        prompt_logprobs=1,
        structured_output=pb.StructuredOutput(regex="[a-z]+"),
        cache_salt="s",
        request_id="r1",
        model="m",
    )
    assert request_from_args(args) == expected


def test_unset_flags_leave_optional_fields_unset() -> None:
    request = request_from_args(parse("hi"))
    assert request == pb.GenerateRequest(prompt="hi")
    for field in ("temperature", "seed", "logprobs", "min_p", "repetition_penalty"):
        assert not request.HasField(field)


def test_messages_make_a_chat_request(tmp_path) -> None:
    schema = tmp_path / "schema.json"
    schema.write_text('{"type": "object"}')
    args = parse(
        "--message=system=Be brief.",
        "--message",
        "user=a=b",
        "--no-generation-prompt",
        f"--json-schema=@{schema}",
    )
    request = request_from_args(args)
    assert [(m.role, m.content) for m in request.messages.messages] == [
        ("system", "Be brief."),
        ("user", "a=b"),
    ]
    assert request.messages.add_generation_prompt is False
    assert request.structured_output.json_schema == '{"type": "object"}'


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([], "prompt: missing (give a prompt, or chat messages with --message)"),
        (["hi", "--message=user=x"], "--message: give messages or a prompt, not both"),
        (["--message=x"], "--message: 'x' is not ROLE=TEXT"),
        (["--message=bot=x"], "--message: role 'bot' is not one of system, user, assistant"),
        (["hi", "--logit-bias=5"], "--logit-bias: '5' is not ID=VALUE"),
        (["hi", "--logit-bias=a=1"], "--logit-bias: 'a=1' is not ID=VALUE (numbers)"),
        (["hi", "--json-schema={"], "--json-schema: not JSON"),
        (["hi", "--grammar=@/no/such/file"], "--grammar: cannot read /no/such/file"),
        (["hi", "--no-generation-prompt"], "--no-generation-prompt: only with --message"),
    ],
)
def test_what_cannot_be_said_is_a_usage_error(argv, message, capsys) -> None:
    with pytest.raises(UsageError) as refused:
        request_from_args(parse(*argv))
    assert str(refused.value).startswith(message)
    # ...and the command exits 2 with it, before connecting anywhere
    assert zerolayer_main(["generate", *argv, "--address", "127.0.0.1:1"]) == 2
    assert capsys.readouterr().err.startswith(f"zerolayer generate: error: {message}")


@pytest.mark.parametrize(
    ("flag", "message"), [("-n=17", "must be in [0, 16]"), ("--logprobs=21", "must be in [0, 20]")]
)
def test_documented_ranges_are_checked_before_calling(flag: str, message: str, capsys) -> None:
    with pytest.raises(SystemExit) as exited:
        parse("hi", flag)
    assert exited.value.code == 2 and message in capsys.readouterr().err


def test_constraints_are_mutually_exclusive(capsys) -> None:
    with pytest.raises(SystemExit):
        parse("hi", "--regex=a", "--json-object")
    assert "not allowed with argument" in capsys.readouterr().err


def usage(prompt: int, completion: int, cached: int = 0) -> pb.Usage:
    return pb.Usage(prompt_tokens=prompt, completion_tokens=completion, cached_prompt_tokens=cached)


def test_the_summary_says_why_and_how_many() -> None:
    assert summary_line([pb.FINISH_REASON_LENGTH], usage(5, 16, 2), ["abc"]) == (
        "zerolayer generate: finish_reason length; prompt_tokens 5, completion_tokens 16, "
        "cached_prompt_tokens 2"
    )
    # --stop "." --stop "," once printed an empty line with no word of why
    assert summary_line([pb.FINISH_REASON_STOP], usage(5, 1), [""]).endswith(
        "(a stop string or stop token came first: the text is empty)"
    )


def test_a_unary_response_prints_text_logprobs_and_samples(capsys) -> None:
    top = [pb.TopLogprob(token_id=7, logprob=-0.5, token="a")]
    entry = pb.TokenLogprobs(chosen=top[0], rank=1, top=top)
    response = pb.GenerateResponse(
        text="a",
        finish_reason=pb.FINISH_REASON_EOS,
        usage=usage(3, 2),
        choices=[
            pb.Choice(index=0, text="a", finish_reason=pb.FINISH_REASON_EOS, logprobs=[entry]),
            pb.Choice(index=1, text="b", finish_reason=pb.FINISH_REASON_LENGTH),
        ],
    )
    print_response(response, as_json=False)
    out, err = capsys.readouterr()
    assert out == "--- sample 0 ---\na\n7\t'a'\t-0.5000\trank 1\t'a'=-0.5000\n--- sample 1 ---\nb\n"
    assert err == (
        "zerolayer generate: finish_reason eos, length; prompt_tokens 3, completion_tokens 2, "
        "cached_prompt_tokens 0\n"
    )
    print_response(response, as_json=True)
    document = json.loads(capsys.readouterr().out)
    assert document["finish_reason"] == "FINISH_REASON_EOS"
    assert document["usage"]["cached_prompt_tokens"] == 0  # zero values are printed too
    assert [c["text"] for c in document["choices"]] == ["a", "b"]


def test_a_stream_of_several_samples_prints_each_when_it_ends(capsys) -> None:
    parts = [
        pb.GenerateResponse(text="x", index=1),
        pb.GenerateResponse(text="y", index=0, finish_reason=pb.FINISH_REASON_LENGTH),
        pb.GenerateResponse(
            text="z", index=1, finish_reason=pb.FINISH_REASON_EOS, usage=usage(2, 3)
        ),
    ]
    out = io.StringIO()
    print_stream(parts, 2, as_json=False, out=out)
    assert out.getvalue() == "--- sample 0 ---\ny\n--- sample 1 ---\nxz\n"
    assert "finish_reason length, eos; prompt_tokens 2, completion_tokens 3" in (
        capsys.readouterr().err
    )
    out = io.StringIO()
    print_stream(parts, 2, as_json=True, out=out)
    assert [json.loads(line).get("index", 0) for line in out.getvalue().splitlines()] == [1, 0, 1]


def test_chat_flags_set_tools_calls_and_template_variables(tmp_path) -> None:
    messages = tmp_path / "messages.json"
    messages.write_text(
        json.dumps(
            [
                {"role": "user", "content": "Time?"},
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "t", "arguments": "{}"},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": "12:00"},
            ]
        )
    )
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([{"type": "function", "function": {"name": "t"}}]))
    request = request_from_args(
        parse(
            f"--messages={messages}",
            f"--tools={tools}",
            "--tool-choice=t",
            "--no-parallel-tool-calls",
            '--chat-template-kwargs={"enable_thinking": false}',
        )
    )
    assert [m.role for m in request.messages.messages] == ["user", "assistant", "tool"]
    assert request.messages.messages[1].tool_calls == [
        pb.ToolCall(id="c1", name="t", arguments="{}")
    ]
    assert list(request.tools) == [
        pb.ToolDefinition(name="t", parameters_json='{"type": "object"}')
    ]
    assert request.tool_choice == pb.ToolChoice(mode="function", name="t")
    assert (request.parallel_tool_calls, request.chat_template_kwargs_json) == (
        False,
        '{"enable_thinking": false}',
    )
    assert not request.HasField("prompt")


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["hi", "--tool-choice=required"], "--tool-choice"),
        (["hi", "--chat-template-kwargs=[1]"], "--chat-template-kwargs"),
        (["--messages=/nonexistent.json"], "--messages"),
        (["hi", "--messages=/nonexistent.json"], "--messages"),
    ],
)
def test_bad_chat_flags_are_refused_naming_the_flag(argv, flag) -> None:
    with pytest.raises(UsageError, match=f"^{flag}:"):
        request_from_args(parse(*argv))


def test_tool_calls_and_reasoning_are_printed_after_and_before_the_answer() -> None:
    response = pb.GenerateResponse(
        text="ok",
        reasoning_text="hm",
        finish_reason=pb.FINISH_REASON_TOOL_CALLS,
        tool_call_deltas=[pb.ToolCallDelta(index=0, id="c1", name="t", arguments="{}")],
    )
    out = io.StringIO()
    print_response(response, as_json=False, out=out)
    assert out.getvalue() == (
        '--- reasoning ---\nhm\n--- answer ---\nok\n{"id": "c1", "name": "t", "arguments": "{}"}\n'
    )
    parts = [
        pb.GenerateResponse(tool_call_deltas=[pb.ToolCallDelta(index=0, id="c1", name="t")]),
        pb.GenerateResponse(
            tool_call_deltas=[pb.ToolCallDelta(index=0, arguments="{}")],
            finish_reason=pb.FINISH_REASON_TOOL_CALLS,
        ),
    ]
    out = io.StringIO()
    print_stream(parts, 1, as_json=False, out=out)
    assert out.getvalue() == '\n{"id": "c1", "name": "t", "arguments": "{}"}\n'
    assert summary_line([pb.FINISH_REASON_TOOL_CALLS], pb.Usage(), [""]).startswith(
        "zerolayer generate: finish_reason tool_calls;"
    )
