"""Agent sessions beside background traffic: the workload of ``zerolayer bench agent`` and its
driver, for any server (zerolayer over gRPC, llama-server over HTTP).

A session is an agent's conversation as token ids: a system prompt with the tool definitions and
the user's task (``system_tokens``, distinct per session), then ``num_turns`` turns. Each turn
sends the whole context so far and generates ``answer_tokens`` (greedy, EOS ignored: the model's
tool call); the next turn's prompt is that prompt, the answer's generated ids and a tool result of
``tool_result_tokens``. Meanwhile ``background_streams`` streams send distinct random prompts
without end. Between two turns of a session (the tool's run time) the background prefills
``gap_pool_fills`` KV pools' worth of prompt tokens, so an LRU cache has evicted the session's
blocks by its next turn unless something keeps them.

KVR (KV reuse ratio) of a turn after the first: cached prompt tokens / the prompt tokens an earlier
turn of the session already had (the prompt minus this turn's new tool result). 1.0 means the
turn prefilled only its new tokens; a cache of whole blocks stays a block short of it at most.
"""

from __future__ import annotations

import random
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from zerolayer.bench.streams import FIRST_PROMPT_ID, run_scheduled
from zerolayer.checkpoints.byte_tokenizer import BYTE_VOCAB_SIZE

BOS_TOKEN_ID = 1
"""The first token of every session (the byte tokenizer's BOS; any id for other vocabularies)."""
BACKGROUND_SEED = 1 << 20
"""Seeds of background prompts start here (never a session's)."""


@dataclass(frozen=True)
class AgentWorkload:
    """The sessions' and the background's shapes (token counts)."""

    num_sessions: int = 4
    system_tokens: int = 2048
    """System prompt, tool definitions and task of a session, distinct per session."""
    num_turns: int = 12
    answer_tokens: int = 32
    """Generated per turn (the tool call)."""
    tool_result_tokens: int = 256
    """Appended after each answer (the tool's result): a turn's new tokens."""
    background_streams: int = 2
    """Background requests in flight at any time."""
    background_prompt_tokens: int = 512
    background_answer_tokens: int = 4
    gap_pool_fills: float = 1.0
    """Background prompt tokens between two turns of a session, in KV pools."""

    @property
    def session_tokens(self) -> int:
        """Tokens of a whole session: its last prompt and answer."""
        return (
            self.system_tokens
            + self.num_turns * self.answer_tokens
            + ((self.num_turns - 1) * self.tool_result_tokens)
        )

    @property
    def sessions_tokens(self) -> int:
        """Tokens of every session together at their end: the sessions' total context."""
        return self.num_sessions * self.session_tokens


@dataclass(frozen=True)
class TurnRecord:
    """One turn of one session, as the server reported it."""

    ttft_s: float
    """Send to the first generated token, seconds."""
    token_ids: tuple[int, ...]
    """The generated answer."""
    prompt_tokens: int
    cached_tokens: int
    """Prompt tokens read from the cache instead of computed."""
    new_tokens: int = 0
    """Tokens no earlier turn of the session had (the first turn: its whole prompt)."""
    pin_refusal: str = ""


SendTurn = Callable[[int, list[int]], TurnRecord]
"""Sends session ``s``'s prompt (ids) and returns its turn (``new_tokens`` left 0)."""


def _ids(rng: random.Random, n: int, vocab_size: int) -> list[int]:
    high = min(vocab_size, BYTE_VOCAB_SIZE)
    return [rng.randrange(FIRST_PROMPT_ID, high) for _ in range(n)]


def system_prompt(w: AgentWorkload, session: int, vocab_size: int) -> list[int]:
    """Session ``session``'s system prompt (ids, seeded by the session, BOS first)."""
    return [BOS_TOKEN_ID, *_ids(random.Random(session), w.system_tokens - 1, vocab_size)]


def tool_result(w: AgentWorkload, session: int, turn: int, vocab_size: int) -> list[int]:
    """The tool result appended after turn ``turn`` (0-based) of ``session``."""
    return _ids(random.Random(f"{session}/{turn}"), w.tool_result_tokens, vocab_size)


class Background:
    """Streams of distinct random prompts until :meth:`stop`, counting prefilled prompt tokens.

    ``send(prompt)`` sends one request and returns when it is done; ``workers`` call it in a
    loop, each prompt seeded by its index (distinct: never a cache hit).
    """

    def __init__(
        self, send: Callable[[list[int]], object], w: AgentWorkload, vocab_size: int
    ) -> None:
        self._send, self._w, self._vocab_size = send, w, vocab_size
        self._cond = threading.Condition()
        self._num_sent = self.num_tokens = 0
        self._stopped = False
        self._error: BaseException | None = None
        self._threads = [
            threading.Thread(target=self._loop, daemon=True) for _ in range(w.background_streams)
        ]

    def __enter__(self) -> Background:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        """Ends the streams after their requests in flight; raises the first error one met."""
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        for thread in self._threads:
            thread.join()
        if self._error is not None:
            raise self._error

    def _loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped:
                    return
                index, self._num_sent = self._num_sent, self._num_sent + 1
            rng = random.Random(BACKGROUND_SEED + index)
            prompt = _ids(rng, self._w.background_prompt_tokens, self._vocab_size)
            try:
                self._send(prompt)
            except BaseException as exc:  # noqa: BLE001 - raised by stop() and wait_for()
                with self._cond:
                    self._error = self._error or exc
                    self._stopped = True
                    self._cond.notify_all()
                return
            with self._cond:
                self.num_tokens += len(prompt)
                self._cond.notify_all()

    def wait_for(self, num_tokens: int) -> None:
        """Blocks until the background has prefilled ``num_tokens`` prompt tokens in all.

        Raises:
            RuntimeError: the background stopped first (after an error of its own).
        """
        with self._cond:
            self._cond.wait_for(lambda: self.num_tokens >= num_tokens or self._stopped)
            if self.num_tokens < num_tokens:
                raise RuntimeError(f"the background stopped: {self._error!r}")


def run_session(
    send_turn: SendTurn,
    background: Background,
    w: AgentWorkload,
    session: int,
    vocab_size: int,
    gap_tokens: int,
) -> list[TurnRecord]:
    """Session ``session``'s turns, each after ``gap_tokens`` background tokens since the last."""
    prompt = system_prompt(w, session, vocab_size)
    records: list[TurnRecord] = []
    mark = 0
    for turn in range(w.num_turns):
        if turn:
            background.wait_for(mark + gap_tokens)
            new = tool_result(w, session, turn - 1, vocab_size)
            prompt = prompt + list(records[-1].token_ids) + new
        record = send_turn(session, prompt)
        mark = background.num_tokens
        new_tokens = w.tool_result_tokens if turn else len(prompt)
        records.append(
            TurnRecord(
                record.ttft_s,
                record.token_ids,
                record.prompt_tokens,
                record.cached_tokens,
                new_tokens,
                record.pin_refusal,
            )
        )
    return records


def run_sessions(
    send_turn: SendTurn, background: Background, w: AgentWorkload, vocab_size: int, gap_tokens: int
) -> list[list[TurnRecord]]:
    """Every session at once, each on its own thread, beside the running ``background``.

    Returns:
        ``[session][turn]`` records.
    Raises:
        BaseException: the first failed session's error, after all have ended.
    """
    return run_scheduled(
        lambda s: run_session(send_turn, background, w, s, vocab_size, gap_tokens),
        [0.0] * w.num_sessions,
    )


def kvr(record: TurnRecord) -> float | None:
    """The turn's KV reuse ratio (module docstring); None for a first turn (nothing earlier)."""
    earlier = record.prompt_tokens - record.new_tokens
    return record.cached_tokens / earlier if earlier > 0 else None


def per_turn(sessions: Sequence[Sequence[TurnRecord]]) -> dict[str, list]:
    """Medians over sessions of each turn: TTFT (s), prompt tokens, prefilled (prompt - cached),
    cached tokens and KVR (None on turn 1), and the pins refused (count of turns, by reason)."""
    turns = list(zip(*sessions, strict=True))
    refusals: dict[str, int] = {}
    for record in (r for turn in turns for r in turn):
        if record.pin_refusal:
            refusals[record.pin_refusal] = refusals.get(record.pin_refusal, 0) + 1
    return {
        "ttft_s": [statistics.median(r.ttft_s for r in t) for t in turns],
        "prompt_tokens": [statistics.median(r.prompt_tokens for r in t) for t in turns],
        "prefilled_tokens": [
            statistics.median(r.prompt_tokens - r.cached_tokens for r in t) for t in turns
        ],
        "cached_tokens": [statistics.median(r.cached_tokens for r in t) for t in turns],
        "kvr": [None, *(statistics.median(kvr(r) for r in t) for t in turns[1:])],
        "pin_refusals": refusals,
    }


def verdicts(turns: dict[str, list]) -> dict:
    """The issue's targets on one arm's :func:`per_turn`: KVR >= 0.9 on every turn from turn 2
    (its lowest median) and the last turn's TTFT within 1.2x of turn 2's."""
    lowest_kvr = min(turns["kvr"][1:])
    ratio = turns["ttft_s"][-1] / turns["ttft_s"][1]
    return {
        "lowest_kvr_from_turn_2": lowest_kvr,
        "kvr_met": lowest_kvr >= 0.9,
        "last_turn_ttft_over_turn_2": ratio,
        "ttft_met": ratio <= 1.2,
    }
