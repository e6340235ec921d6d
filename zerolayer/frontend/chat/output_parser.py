"""One sample's output split into answer, thought and tool calls, as it is generated: the
reasoning parser first (``<think>``), then the tool-call parser on the answer."""

from __future__ import annotations

from dataclasses import dataclass, replace

from zerolayer.common.generation import FinishReason, GenerationChunk, ToolCallDelta
from zerolayer.frontend.chat.reasoning import ReasoningParser
from zerolayer.frontend.chat.tool_formats import ToolFormat
from zerolayer.frontend.chat.tool_parser import ToolCallParser


@dataclass(frozen=True)
class ParsedPiece:
    """What a piece of output gave: answer text, thought text, tool-call deltas."""

    text: str
    reasoning_text: str
    tool_call_deltas: tuple[ToolCallDelta, ...]


@dataclass(frozen=True)
class OutputPlan:
    """How a request's output is parsed (the same for each of its samples)."""

    tool_format: ToolFormat | None = None
    """None: no tool calls are parsed (no tools, ``tool_choice`` "none", or no format)."""
    max_calls: int | None = None
    """1: ``parallel_tool_calls`` false, or a named function."""
    thinks: bool = False
    """The chat template thinks in ``<think>`` tags."""

    def parser(self, in_thought: bool) -> OutputParser:
        """A fresh parser for one sample.

        Args:
            in_thought: the prompt opened a thought
                (:func:`zerolayer.frontend.chat.reasoning.prompt_opens_thought`).
        """
        return OutputParser(self, in_thought)


class OutputParser:
    """Parses one sample's output (see :class:`OutputPlan`)."""

    def __init__(self, plan: OutputPlan, in_thought: bool) -> None:
        self._reasoning = ReasoningParser(in_thought) if plan.thinks else None
        fmt = plan.tool_format
        self._tools = ToolCallParser(fmt, plan.max_calls) if fmt is not None else None

    @property
    def num_calls(self) -> int:
        """Calls found so far (the finish reason is then TOOL_CALLS)."""
        if self._tools is None:
            return 0
        limit = self._tools.max_calls
        return self._tools.num_calls if limit is None else min(limit, self._tools.num_calls)

    def feed(self, text: str) -> ParsedPiece:
        """What the next piece of output completes."""
        answer, thought = self._reasoning.feed(text) if self._reasoning else (text, "")
        return self._tool_piece(answer, thought, last=False)

    def finish(self) -> ParsedPiece:
        """What was held back, at the end of the output."""
        answer, thought = self._reasoning.finish() if self._reasoning else ("", "")
        return self._tool_piece(answer, thought, last=True)

    def _tool_piece(self, answer: str, thought: str, last: bool) -> ParsedPiece:
        if self._tools is None:
            return ParsedPiece(answer, thought, ())
        parsed = self._tools.feed(answer)
        text, deltas = parsed.content, list(parsed.deltas)
        if last:
            rest = self._tools.finish()
            text += rest.content
            deltas += rest.deltas
        return ParsedPiece(text, thought, tuple(deltas))


def parsed_chunk(chunk: GenerationChunk, parser: OutputParser) -> GenerationChunk:
    """``chunk`` with its text split by ``parser`` (the rest of it on the sample's last chunk,
    whose finish reason is TOOL_CALLS when it called tools and ended by EOS or a stop token, not
    a stop string)."""
    piece = parser.feed(chunk.text)
    text, thought, deltas = piece.text, piece.reasoning_text, piece.tool_call_deltas
    reason = chunk.finish_reason
    if reason != FinishReason.UNSPECIFIED:
        rest = parser.finish()
        text, thought = text + rest.text, thought + rest.reasoning_text
        deltas += rest.tool_call_deltas
        # NOTE: a stop string cut the answer (inside a call, as likely as not): STOP, as it is,
        # so that no client runs a tool with arguments cut short.
        ended_by_itself = reason == FinishReason.EOS or (
            reason == FinishReason.STOP and not chunk.stop_string
        )
        if parser.num_calls and ended_by_itself:
            reason = FinishReason.TOOL_CALLS
    return replace(
        chunk, text=text, reasoning_text=thought, tool_call_deltas=deltas, finish_reason=reason
    )
