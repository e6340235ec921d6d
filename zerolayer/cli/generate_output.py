"""How ``zerolayer generate`` shows a response: the text on stdout (each sample under a header
when there are several; with ``--logprobs``, a line per token), and on stderr one line saying why
generation stopped and how many tokens it took. ``--json`` prints the response (or each stream
message) as JSON instead."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import TextIO

from google.protobuf import json_format

from zerolayer.cli.client import printable
from zerolayer.v1 import generation_pb2


def reason_name(reason: int) -> str:
    """``FINISH_REASON_LENGTH`` -> ``length``."""
    return generation_pb2.FinishReason.Name(reason).removeprefix("FINISH_REASON_").lower()


def summary_line(reasons: Sequence[int], usage: generation_pb2.Usage, texts: Sequence[str]) -> str:
    """The stderr line: why each sample stopped, and the token counts."""
    line = (
        f"zerolayer generate: finish_reason {', '.join(reason_name(r) for r in reasons)}; "
        f"prompt_tokens {usage.prompt_tokens}, completion_tokens {usage.completion_tokens}, "
        f"cached_prompt_tokens {usage.cached_prompt_tokens}"
    )
    stopped_at_once = [
        i
        for i, (r, t) in enumerate(zip(reasons, texts, strict=True))
        if r == generation_pb2.FINISH_REASON_STOP and not t
    ]
    if stopped_at_once:
        line += " (a stop string or stop token came first: the text is empty)"
    return line


def logprob_lines(entries: Iterable[generation_pb2.TokenLogprobs]) -> list[str]:
    """One line per position: token id, its piece, its logprob and rank, then the alternatives
    as ``piece=logprob``."""
    lines = []
    for e in entries:
        top = " ".join(f"{t.token!r}={t.logprob:.4f}" for t in e.top)
        chosen = e.chosen
        lines.append(
            f"{chosen.token_id}\t{chosen.token!r}\t{chosen.logprob:.4f}\trank {e.rank}\t{top}"
        )
    return lines


def tool_call_lines(deltas: Iterable[generation_pb2.ToolCallDelta]) -> list[str]:
    """One JSON line ``{"id", "name", "arguments"}`` per tool call of ``deltas`` (joined by
    index)."""
    joined: dict[int, dict[str, str]] = {}
    for d in deltas:
        call = joined.setdefault(d.index, {"id": "", "name": "", "arguments": ""})
        call["id"] = call["id"] or d.id
        call["name"] = call["name"] or d.name
        call["arguments"] += d.arguments
    return [json.dumps(joined[i]) for i in sorted(joined)]


def json_line(message: generation_pb2.GenerateResponse) -> str:
    """A response as one line of JSON (proto field names; fields at their default values are
    written too, e.g. ``"cached_prompt_tokens": 0``, except unset optional ones)."""
    return json_format.MessageToJson(
        message,
        preserving_proto_field_name=True,
        always_print_fields_with_no_presence=True,
        indent=None,
    )


def print_response(
    response: generation_pb2.GenerateResponse, as_json: bool, out: TextIO | None = None
) -> None:
    """Prints a unary response (see the module) to ``out`` (None: stdout)."""
    out = out or sys.stdout
    if as_json:
        print(json_line(response), file=out)
        return
    choices = list(response.choices) or [
        generation_pb2.Choice(
            index=0,
            text=response.text,
            token_ids=response.token_ids,
            finish_reason=response.finish_reason,
            logprobs=response.logprobs,
            reasoning_text=response.reasoning_text,
            tool_call_deltas=response.tool_call_deltas,
        )
    ]
    _print_prompt_logprobs(response.prompt_logprobs, out)
    for choice in choices:
        if choice.reasoning_text:
            print(
                f"--- reasoning ---\n{printable(choice.reasoning_text)}\n--- answer ---", file=out
            )
        _print_sample(choice.index, len(choices), choice.text, choice.logprobs, out)
        for line in tool_call_lines(choice.tool_call_deltas):
            print(line, file=out)
    reasons = [c.finish_reason for c in choices]
    print(summary_line(reasons, response.usage, [c.text for c in choices]), file=sys.stderr)


def print_stream(
    parts: Iterable[generation_pb2.GenerateResponse],
    num_samples: int,
    as_json: bool,
    out: TextIO | None = None,
) -> None:
    """Prints a stream as it arrives to ``out`` (None: stdout): one sample's text live; several
    samples each as a block once it has finished (their messages interleave)."""
    out = out or sys.stdout
    texts: dict[int, list[str]] = {}
    logprobs: dict[int, list[generation_pb2.TokenLogprobs]] = {}
    reasons: dict[int, int] = {}
    calls: dict[int, list[generation_pb2.ToolCallDelta]] = {}
    usage = generation_pb2.Usage()
    for part in parts:
        if as_json:
            print(json_line(part), file=out, flush=True)
            continue
        _print_prompt_logprobs(part.prompt_logprobs, out)
        calls.setdefault(part.index, []).extend(part.tool_call_deltas)
        if part.reasoning_text and num_samples <= 1:
            out.write(printable(part.reasoning_text))  # the thought comes before the answer
        texts.setdefault(part.index, []).append(part.text)
        logprobs.setdefault(part.index, []).extend(part.logprobs)
        if part.HasField("usage"):
            usage = part.usage
        if num_samples <= 1:
            out.write(printable(part.text))
            out.flush()
        if part.finish_reason:
            reasons[part.index] = part.finish_reason
            if num_samples > 1:
                text = "".join(texts[part.index])
                _print_sample(part.index, num_samples, text, logprobs[part.index], out)
    if as_json:
        return
    if num_samples <= 1:
        out.write("\n")
        if logprobs.get(0):
            print("\n".join(logprob_lines(logprobs[0])), file=out)
    for index in sorted(calls):
        for line in tool_call_lines(calls[index]):
            print(line, file=out)
    order = sorted(reasons)
    joined = ["".join(texts.get(i, [])) for i in order]
    print(summary_line([reasons[i] for i in order], usage, joined), file=sys.stderr)


def _print_sample(
    index: int,
    num_samples: int,
    text: str,
    logprobs: Sequence[generation_pb2.TokenLogprobs],
    out: TextIO,
) -> None:
    if num_samples > 1:
        print(f"--- sample {index} ---", file=out)
    print(printable(text), file=out)
    if logprobs:
        print("\n".join(logprob_lines(logprobs)), file=out)


def _print_prompt_logprobs(entries: Sequence[generation_pb2.TokenLogprobs], out: TextIO) -> None:
    if entries:
        print("--- prompt logprobs ---", file=out)
        print("\n".join(logprob_lines(entries)), file=out)
