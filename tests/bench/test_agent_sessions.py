"""The agent-session workload of ``zerolayer bench agent`` without a server: each turn's prompt,
the background between turns, KVR and the verdicts (zerolayer/bench/agent_sessions.py)."""

from __future__ import annotations

import threading

import pytest

from zerolayer.bench.agent_sessions import (
    AgentWorkload,
    Background,
    TurnRecord,
    kvr,
    per_turn,
    run_sessions,
    system_prompt,
    tool_result,
    verdicts,
)

WORKLOAD = AgentWorkload(
    num_sessions=2,
    system_tokens=8,
    num_turns=3,
    answer_tokens=2,
    tool_result_tokens=3,
    background_streams=2,
    background_prompt_tokens=5,
)


def make_record(ttft_s: float, prompt: int, cached: int, new: int, refusal: str = "") -> TurnRecord:
    return TurnRecord(ttft_s, (7, 7), prompt, cached, new, refusal)


def test_a_session_is_its_system_prompt_then_answers_and_tool_results() -> None:
    assert WORKLOAD.session_tokens == 8 + 3 * 2 + 2 * 3
    assert WORKLOAD.sessions_tokens == 2 * 20
    first, second = system_prompt(WORKLOAD, 0, 259), system_prompt(WORKLOAD, 1, 259)
    assert first[0] == second[0] == 1 and len(first) == 8 and first != second
    assert system_prompt(WORKLOAD, 0, 259) == first  # seeded
    assert tool_result(WORKLOAD, 0, 0, 259) != tool_result(WORKLOAD, 0, 1, 259)
    assert all(3 <= i < 259 for i in first[1:] + tool_result(WORKLOAD, 0, 0, 259))


def test_each_turn_sends_the_last_prompt_answer_and_tool_result_after_the_gap() -> None:
    gap_tokens = 40
    sent: list[tuple[int, list[int], int]] = []
    lock = threading.Lock()

    def send_background(prompt: list[int]) -> None:
        assert len(prompt) == 5

    def send_turn(session: int, prompt: list[int]) -> TurnRecord:
        with lock:
            sent.append((session, prompt, background.num_tokens))
        answer = (100 + session, 100 + len(prompt))
        return TurnRecord(0.01, answer, len(prompt), len(prompt) // 2)

    with Background(send_background, WORKLOAD, 259) as background:
        sessions = run_sessions(send_turn, background, WORKLOAD, 259, gap_tokens)
    for s, records in enumerate(sessions):
        prompts = [p for session, p, _ in sent if session == s]
        assert prompts[0] == system_prompt(WORKLOAD, s, 259)
        for t in (1, 2):
            answer = [100 + s, 100 + len(prompts[t - 1])]
            assert prompts[t] == prompts[t - 1] + answer + tool_result(WORKLOAD, s, t - 1, 259)
        counts = [n for session, _, n in sent if session == s]
        assert counts[1] >= gap_tokens and counts[2] >= counts[1] + gap_tokens
        assert [r.new_tokens for r in records] == [8, 3, 3]
        assert [r.prompt_tokens for r in records] == [8, 13, 18]
    assert background.num_tokens % 5 == 0 and background.num_tokens >= 2 * gap_tokens


def test_a_failing_background_ends_the_sessions_with_its_error() -> None:
    def send_background(prompt: list[int]) -> None:
        raise ConnectionError("server gone")

    background = Background(send_background, WORKLOAD, 259)
    with pytest.raises(ConnectionError, match="server gone"), background:
        with pytest.raises(RuntimeError, match="the background stopped: .*server gone"):
            background.wait_for(1)


def test_kvr_counts_the_cached_share_of_what_earlier_turns_had() -> None:
    assert kvr(make_record(0.1, 100, 0, 100)) is None  # a first turn: nothing earlier
    assert kvr(make_record(0.1, 300, 272, 20)) == 272 / 280
    assert kvr(make_record(0.1, 300, 0, 20)) == 0.0


def test_per_turn_medians_over_sessions_and_the_verdicts() -> None:
    sessions = [
        [
            make_record(0.5, 100, 0, 100),
            make_record(0.10, 130, 96, 20),
            make_record(0.11, 160, 128, 20),
        ],
        [
            make_record(0.7, 100, 0, 100),
            make_record(0.12, 130, 112, 20),
            make_record(0.16, 160, 0, 20, "pin-over-budget"),
        ],
        [
            make_record(0.6, 100, 0, 100),
            make_record(0.14, 130, 96, 20),
            make_record(0.13, 160, 128, 20),
        ],
    ]
    turns = per_turn(sessions)
    assert turns["ttft_s"] == [0.6, 0.12, 0.13]
    assert turns["prompt_tokens"] == [100, 130, 160]
    assert turns["cached_tokens"] == [0, 96, 128]
    assert turns["prefilled_tokens"] == [100, 34, 32]
    assert turns["kvr"] == [None, 96 / 110, 128 / 140]
    assert turns["pin_refusals"] == {"pin-over-budget": 1}
    assert verdicts(turns) == {
        "lowest_kvr_from_turn_2": 96 / 110,
        "kvr_met": False,
        "last_turn_ttft_over_turn_2": 0.13 / 0.12,
        "ttft_met": True,
    }
