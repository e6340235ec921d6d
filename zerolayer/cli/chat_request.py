"""``zerolayer generate``'s chat flags beyond ``--message``: a conversation from a file (with tool
calls and results), tools, tool choice, template variables (docs/tools-and-reasoning.md).

Files hold OpenAI's shapes: ``--messages`` a JSON list of chat messages (``role``, ``content``,
``tool_call_id``, ``tool_calls`` of ``{"id", "function": {"name", "arguments"}}``,
``reasoning_content``), ``--tools`` a JSON list of ``{"type": "function", "function": {"name",
"description", "parameters"}}``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from zerolayer.cli.client import UsageError
from zerolayer.v1 import generation_pb2

TOOL_CHOICE_MODES = ("auto", "none", "required")
"""``--tool-choice`` values besides a function's name."""


def add_chat_arguments(p: argparse.ArgumentParser) -> None:
    """The flags (see the module docstring)."""
    p.add_argument(
        "--messages",
        metavar="FILE.json",
        help="a chat from a JSON file (OpenAI's messages, tool calls and results included), "
        "instead of a prompt or --message",
    )
    p.add_argument(
        "--tools",
        metavar="FILE.json",
        help="functions the model may call (a JSON file of OpenAI's tools); the answer's calls "
        "are printed after its text, one JSON line each",
    )
    p.add_argument(
        "--tool-choice",
        metavar="MODE",
        help="auto (default with --tools), none, required, or a function's name (that one)",
    )
    p.add_argument(
        "--no-parallel-tool-calls", action="store_true", help="with --tools: at most one call"
    )
    p.add_argument(
        "--chat-template-kwargs",
        metavar="JSON",
        help="further chat template variables, a JSON object (e.g. '{\"enable_thinking\": false}')",
    )
    p.add_argument(
        "--parse-output",
        action="store_true",
        help="split the model's reasoning (<think>) and tool calls out of the text "
        "(on with --tools)",
    )


def apply_chat_args(request: generation_pb2.GenerateRequest, args: argparse.Namespace) -> None:
    """Sets ``request``'s chat fields from the flags.

    Raises:
        UsageError: a file that cannot be read or is not the JSON expected, flags that need
            ``--tools`` without it.
    """
    if args.messages is not None:
        if args.message or args.prompt is not None:
            raise UsageError("--messages: give a messages file, --message or a prompt, one of them")
        entries = _json_list("--messages", args.messages)
        request.messages.messages.extend(_message(i, m) for i, m in enumerate(entries))
        if args.no_generation_prompt:
            request.messages.add_generation_prompt = False
    if args.tools is not None:
        for i, tool in enumerate(_json_list("--tools", args.tools)):
            function = tool.get("function", tool) if isinstance(tool, dict) else None
            if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                raise UsageError(f"--tools: entry {i} is not a function tool with a name")
            request.tools.append(
                generation_pb2.ToolDefinition(
                    name=function["name"],
                    description=str(function.get("description", "")),
                    parameters_json=json.dumps(function.get("parameters", {"type": "object"})),
                )
            )
    elif args.tool_choice is not None or args.no_parallel_tool_calls:
        raise UsageError("--tool-choice: only with --tools")
    if args.tool_choice is not None:
        mode = args.tool_choice if args.tool_choice in TOOL_CHOICE_MODES else "function"
        name = "" if mode != "function" else args.tool_choice
        request.tool_choice.CopyFrom(generation_pb2.ToolChoice(mode=mode, name=name))
    if args.no_parallel_tool_calls:
        request.parallel_tool_calls = False
    if args.chat_template_kwargs is not None:
        check_object("--chat-template-kwargs", args.chat_template_kwargs)
        request.chat_template_kwargs_json = args.chat_template_kwargs
    request.parse_output = args.parse_output


def check_object(flag: str, text: str) -> None:
    """Refuses text that is not a JSON object."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UsageError(f"{flag}: not JSON ({exc})") from None
    if not isinstance(value, dict):
        raise UsageError(f"{flag}: not a JSON object")


def _json_list(flag: str, path: str) -> list[Any]:
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{flag}: cannot read {path}: {exc}") from None
    if not isinstance(value, list):
        raise UsageError(f"{flag}: {path} does not hold a JSON list")
    return value


def _message(index: int, entry: Any) -> generation_pb2.ChatMessage:
    if not isinstance(entry, dict) or not isinstance(entry.get("role"), str):
        raise UsageError(f"--messages: message {index} is not an object with a role")
    calls = []
    for call in entry.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, dict) else {}
        calls.append(
            generation_pb2.ToolCall(
                id=str(call.get("id", "")),
                name=str(function.get("name", "")),
                arguments=str(function.get("arguments", "{}")),
            )
        )
    return generation_pb2.ChatMessage(
        role=entry["role"],
        content=entry.get("content") or "",
        name=entry.get("name") or "",
        tool_call_id=entry.get("tool_call_id") or "",
        tool_calls=calls,
        reasoning_content=entry.get("reasoning_content") or "",
    )
