"""Incremental splitting of a reasoning model's output into its thought and its answer.

Models whose chat template thinks in ``<think>...</think>`` (Qwen3, QwQ, DeepSeek-R1 and its
distills) write their thought first: either the output opens ``<think>`` itself (Qwen3), or the
template's generation prompt already opened it (DeepSeek-R1's ends with ``<think>\\n``), and the
output only closes it. The thought is the text between the tags, as written; the answer is the
text after ``</think>`` without the newlines that follow the tag (Qwen3's template strips them
when it renders the answer again). An output that never opens a thought is all answer; one whose
thought never closes (cut by max_tokens) is all thought.

Like the tool-call parser, the text is read so that any split of it gives the same result: what
could still become a tag is held back.
"""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"


def template_thinks(template_source: str) -> bool:
    """Whether a chat template writes thoughts in ``<think>`` tags."""
    return THINK_CLOSE in template_source


def prompt_opens_thought(prompt_text: str) -> bool:
    """Whether the rendered prompt ends inside an open ``<think>`` (the output then starts in the
    thought)."""
    return prompt_text.rfind(THINK_OPEN) > prompt_text.rfind(THINK_CLOSE)


class ReasoningParser:
    """Splits one sample's output into (answer, thought) pieces."""

    def __init__(self, in_thought: bool = False) -> None:
        """Args:
        in_thought: the prompt opened the thought (:func:`prompt_opens_thought`).
        """
        self._mode = "thought" if in_thought else "start"
        self._pending = ""

    def feed(self, text: str) -> tuple[str, str]:
        """(answer, thought) that ``text`` completes."""
        self._pending += text
        answer, thought = "", ""
        if self._mode == "start":
            head = self._pending.lstrip()
            if THINK_OPEN.startswith(head):
                return "", ""  # all of it could still open a thought
            if head.startswith(THINK_OPEN):
                self._mode = "thought"
                self._pending = head[len(THINK_OPEN) :]
            else:
                self._mode = "answer"
        if self._mode == "thought":
            at = self._pending.find(THINK_CLOSE)
            if at < 0:
                keep = _prefix_length(self._pending, THINK_CLOSE)
                cut = len(self._pending) - keep
                thought, self._pending = self._pending[:cut], self._pending[cut:]
                return "", thought
            thought = self._pending[:at]
            self._pending = self._pending[at + len(THINK_CLOSE) :]
            self._mode = "after"
        if self._mode == "after":
            self._pending = self._pending.lstrip("\n")
            if not self._pending:
                return "", thought
            self._mode = "answer"
        answer, self._pending = self._pending, ""
        return answer, thought

    def finish(self) -> tuple[str, str]:
        """(answer, thought) held back at the end of the output."""
        rest, self._pending = self._pending, ""
        if self._mode == "thought":
            return "", rest
        return ("", "") if self._mode == "after" else (rest, "")


def _prefix_length(text: str, tag: str) -> int:
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
