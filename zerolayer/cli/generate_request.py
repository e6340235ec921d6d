"""``zerolayer generate``'s flags: the parser, and the GenerateRequest they describe.

Every field of the public GenerateRequest has a flag; values are range-checked by the server,
which names the field in its INVALID_ARGUMENT. What this module refuses (exit 2, one line naming
the flag) is what cannot be said at all: a malformed ``ROLE=TEXT`` or ``ID=VALUE``, both a prompt
and messages, a schema file that cannot be read.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path

from zerolayer.cli.arg_types import utf8_text
from zerolayer.cli.chat_request import add_chat_arguments, apply_chat_args
from zerolayer.cli.client import UsageError
from zerolayer.frontend.text.sampling_controls import MAX_LOGPROBS, MAX_N
from zerolayer.v1 import generation_pb2

ROLES = ("system", "user", "assistant", "tool")
"""Roles a ``--message`` may have (GenerateRequest.messages)."""


def add_generate_arguments(
    p: argparse.ArgumentParser,
    uint32: Callable[[str], int],
    up_to: Callable[[int], Callable[[str], int]],
    float32: Callable[[str], float],
) -> None:
    """The request flags of ``zerolayer generate`` (the connection flags are added elsewhere).

    Args:
        uint32, float32: argparse types that refuse values the proto fields cannot hold.
        up_to: ``up_to(m)`` is the argparse type of an integer in [0, m].
    """
    uint64 = up_to(2**64 - 1)
    p.add_argument(
        "prompt",
        nargs="?",
        type=utf8_text,
        help="prompt text (tokenized with the model's rules, BOS included); or give --message",
    )
    p.add_argument(
        "--message",
        action="append",
        default=[],
        type=utf8_text,
        metavar="ROLE=TEXT",
        help=f"a chat message (repeatable, in order; ROLE one of {', '.join(ROLES)}), rendered "
        "with the model's chat template instead of a prompt",
    )
    p.add_argument(
        "--no-generation-prompt",
        action="store_true",
        help="with --message: do not open an assistant turn at the end",
    )
    p.add_argument("--stream", action="store_true", help="print tokens as they arrive")
    p.add_argument(
        "--json",
        action="store_true",
        help="print the whole response as JSON (with --stream: one JSON object per message)",
    )
    p.add_argument("--max-new-tokens", type=uint32, default=0, help="0: the server's default (64)")
    p.add_argument(
        "--min-new-tokens",
        type=uint32,
        default=0,
        help="end-of-sequence and --stop-token-id cannot end generation before this many tokens",
    )
    p.add_argument("--temperature", type=float32, default=None, help="default 0 (greedy)")
    p.add_argument(
        "--top-p", type=float32, default=None, help="nucleus sampling mass in (0, 1] (default 1)"
    )
    p.add_argument(
        "--top-k", type=uint32, default=None, help="sample among the K likeliest; 0: all"
    )
    p.add_argument(
        "--min-p",
        type=float32,
        default=None,
        help="drop tokens less likely than MIN_P times the likeliest, in [0, 1] (default 0)",
    )
    p.add_argument(
        "--seed",
        type=uint64,
        default=None,
        help="seed of a sampled request, for a repeatable answer (default: a random one)",
    )
    p.add_argument(
        "--repetition-penalty",
        type=float32,
        default=None,
        help="> 0; penalises tokens of the prompt and output (default 1: off)",
    )
    p.add_argument(
        "--presence-penalty",
        type=float32,
        default=None,
        help="in [-2, 2]; subtracted once per token already generated (default 0)",
    )
    p.add_argument(
        "--frequency-penalty",
        type=float32,
        default=None,
        help="in [-2, 2]; subtracted per occurrence of a token already generated (default 0)",
    )
    p.add_argument(
        "--logit-bias",
        action="append",
        default=[],
        metavar="ID=VALUE",
        help="add VALUE (in [-100, 100]) to token ID's logit (repeatable)",
    )
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument(
        "--stop-token-id",
        action="append",
        type=uint32,
        default=[],
        metavar="ID",
        help="a token id that ends generation (repeatable)",
    )
    p.add_argument(
        "--ignore-eos",
        action="store_true",
        help="keep generating past end-of-sequence tokens (until --max-new-tokens)",
    )
    p.add_argument(
        "-n",
        "--n",
        dest="n",
        type=up_to(MAX_N),
        default=0,
        help="samples of the prompt (1 to 16; sample i is drawn with seed + i)",
    )
    p.add_argument(
        "--logprobs",
        type=up_to(MAX_LOGPROBS),
        default=None,
        metavar="N",
        help="print each token's logprob and the N likeliest alternatives (0 to 20)",
    )
    p.add_argument(
        "--prompt-logprobs",
        type=up_to(MAX_LOGPROBS),
        default=None,
        metavar="N",
        help="also for each prompt token (0 to 20; the prompt is then computed whole)",
    )
    constraint = p.add_mutually_exclusive_group()
    constraint.add_argument(
        "--json-schema",
        metavar="SCHEMA",
        help="constrain the output to JSON valid against SCHEMA (JSON text, or @FILE)",
    )
    constraint.add_argument(
        "--json-object", action="store_true", help="constrain the output to a JSON object"
    )
    constraint.add_argument("--regex", help="constrain the output to text the regex matches whole")
    constraint.add_argument(
        "--grammar",
        metavar="LARK",
        help="constrain the output to a Lark grammar (llguidance's dialect; text or @FILE)",
    )
    p.add_argument(
        "--cache-salt",
        default="",
        help="prefix-cache namespace: requests with different salts never share cached KV",
    )
    p.add_argument("--request-id", default="", help="id echoed in the response, logs and traces")
    p.add_argument("--model", default="", help="model name to check against the served one")
    add_chat_arguments(p)


def request_from_args(args: argparse.Namespace) -> generation_pb2.GenerateRequest:
    """The GenerateRequest of ``zerolayer generate``'s parsed flags (optional fields set only
    when given).

    Raises:
        UsageError: neither or both of a prompt and ``--message``; a malformed ``--message``
            or ``--logit-bias``; an ``@FILE`` that cannot be read.
    """
    request = generation_pb2.GenerateRequest(
        max_new_tokens=args.max_new_tokens,
        min_new_tokens=args.min_new_tokens,
        stop=args.stop,
        stop_token_ids=args.stop_token_id,
        ignore_eos=args.ignore_eos,
        n=args.n,
        cache_salt=args.cache_salt,
        request_id=args.request_id,
        model=args.model,
    )
    if args.message and args.prompt is not None:
        raise UsageError("--message: give messages or a prompt, not both")
    if args.no_generation_prompt and not (args.message or args.messages):
        raise UsageError("--no-generation-prompt: only with --message or --messages")
    if args.message:
        request.messages.messages.extend(_message(text) for text in args.message)
        if args.no_generation_prompt:
            request.messages.add_generation_prompt = False
    elif args.messages is not None:
        pass  # apply_chat_args reads the file
    elif args.prompt is None:
        raise UsageError("prompt: missing (give a prompt, or chat messages with --message)")
    else:
        request.prompt = args.prompt
    for name in (
        "temperature",
        "top_p",
        "top_k",
        "min_p",
        "seed",
        "repetition_penalty",
        "presence_penalty",
        "frequency_penalty",
        "logprobs",
        "prompt_logprobs",
    ):
        value = getattr(args, name)
        if value is not None:
            setattr(request, name, value)
    for entry in args.logit_bias:
        token_id, value = _pair("--logit-bias", entry, "ID=VALUE")
        try:
            request.logit_bias[int(token_id)] = float(value)
        except (ValueError, OverflowError):
            raise UsageError(f"--logit-bias: {entry!r} is not ID=VALUE (numbers)") from None
    if args.json_schema is not None:
        schema = _text_or_file("--json-schema", args.json_schema)
        check_json("--json-schema", schema)
        request.structured_output.json_schema = schema
    elif args.json_object:
        request.structured_output.json_object = True
    elif args.regex is not None:
        request.structured_output.regex = args.regex
    elif args.grammar is not None:
        request.structured_output.grammar = _text_or_file("--grammar", args.grammar)
    apply_chat_args(request, args)
    return request


def _pair(flag: str, text: str, form: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise UsageError(f"{flag}: {text!r} is not {form}")
    return key, value


def _message(text: str) -> generation_pb2.ChatMessage:
    role, content = _pair("--message", text, "ROLE=TEXT")
    if role not in ROLES:
        raise UsageError(f"--message: role {role!r} is not one of {', '.join(ROLES)}")
    return generation_pb2.ChatMessage(role=role, content=content)


def _text_or_file(flag: str, value: str) -> str:
    """``value`` itself, or the text of the file ``@PATH`` names."""
    if not value.startswith("@"):
        return value
    try:
        return Path(value[1:]).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{flag}: cannot read {value[1:]}: {exc}") from None


def check_json(flag: str, text: str) -> None:
    """Refuses text that is not JSON (a schema given inline or in a file).

    Raises:
        UsageError: naming ``flag``.
    """
    try:
        json.loads(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: not JSON ({exc})") from None
