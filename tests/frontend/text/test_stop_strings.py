"""Tests for StopStringMatcher: split stops, several stops, overlapping prefixes, chunking."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerolayer.frontend.text.stop_strings import StopStringMatcher


def make_matcher(*stop: str) -> StopStringMatcher:
    return StopStringMatcher(list(stop))


def feed_all(matcher: StopStringMatcher, chunks: Sequence[str]) -> list[tuple[str, bool]]:
    """Feed chunks until a match; return each feed's result."""
    results = []
    for chunk in chunks:
        results.append(matcher.feed(chunk))
        if results[-1][1]:
            break
    return results


def reference_cut(text: str, stop: Sequence[str]) -> str:
    """``text`` cut at the stop occurrence completed first (ties: the earliest start)."""
    for end in range(1, len(text) + 1):
        starts = [end - len(s) for s in stop if s and text[:end].endswith(s)]
        if starts:
            return text[: min(starts)]
    return text


def test_no_stops_emits_everything_immediately() -> None:
    matcher = make_matcher()
    assert feed_all(matcher, ["ab", "", "c"]) == [("ab", False), ("", False), ("c", False)]
    assert matcher.flush() == ""


def test_empty_stop_strings_are_ignored() -> None:
    matcher = make_matcher("")
    assert matcher.feed("abc") == ("abc", False)


def test_stop_within_one_feed() -> None:
    matcher = make_matcher("ab")
    assert matcher.feed("xaby") == ("x", True)
    assert matcher.matched
    assert matcher.flush() == ""


def test_stop_split_across_feeds() -> None:
    matcher = make_matcher("ab")
    assert feed_all(matcher, ["a", "b"]) == [("", False), ("", True)]


def test_stop_split_across_three_feeds_with_text_around() -> None:
    matcher = make_matcher("STOP")
    assert feed_all(matcher, ["hello S", "TO", "Pworld"]) == [
        ("hello ", False),
        ("", False),
        ("", True),
    ]


def test_held_prefix_released_when_it_does_not_become_a_stop() -> None:
    matcher = make_matcher("ab")
    assert feed_all(matcher, ["xa", "c", "a"]) == [("x", False), ("ac", False), ("", False)]
    assert matcher.flush() == "a"


def test_earliest_stop_in_text_wins() -> None:
    matcher = make_matcher("world", "lo")
    assert matcher.feed("hello world") == ("hel", True)


def test_earliest_stop_wins_regardless_of_list_order() -> None:
    assert make_matcher("c", "b").feed("abc") == ("a", True)
    assert make_matcher("b", "c").feed("abc") == ("a", True)


def test_stop_completed_first_wins_over_longer_one_starting_earlier() -> None:
    assert make_matcher("abcd", "bc").feed("abcd") == ("a", True)
    assert make_matcher("abc", "bc").feed("abc") == ("", True)


def test_the_matched_stop_string_is_the_one_that_won() -> None:
    matcher = make_matcher("abcd", "bc")
    assert matcher.matched_stop == ""
    assert feed_all(matcher, ["ab", "cd"]) == [("", False), ("a", True)]
    assert matcher.matched_stop == "bc"
    tie = make_matcher("abc", "bc")
    tie.feed("abc")
    assert tie.matched_stop == "abc"


def test_overlapping_prefixes_hold_longest_candidate() -> None:
    matcher = make_matcher("aab", "abc")
    assert feed_all(matcher, ["xaa", "a", "b"]) == [("x", False), ("a", False), ("", True)]


def test_self_overlapping_stop() -> None:
    matcher = make_matcher("aaab")
    assert feed_all(matcher, ["aa", "a", "a", "b"]) == [
        ("", False),
        ("", False),
        ("a", False),
        ("", True),
    ]


def test_multi_char_unicode_stop() -> None:
    matcher = make_matcher("。\n")
    assert feed_all(matcher, ["日本語。", "\nmore"]) == [("日本語", False), ("", True)]


def test_feed_after_match_raises() -> None:
    matcher = make_matcher("x")
    matcher.feed("x")
    with pytest.raises(RuntimeError, match="after a stop string matched"):
        matcher.feed("y")


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    """Split ``text`` into consecutive chunks of random sizes (0 to 4 characters)."""
    chunks: list[str] = []
    start = 0
    while start < len(text):
        size = draw(st.integers(min_value=0, max_value=4))
        chunks.append(text[start : start + size])
        start += size
    return chunks


SMALL_ALPHABET = st.text(alphabet="abc", max_size=40)
STOPS = st.lists(st.text(alphabet="abc", min_size=1, max_size=4), max_size=3)


def reference_hold(text: str, stop: Sequence[str]) -> int:
    """Length of the longest suffix of ``text`` that is a prefix of some stop string."""
    lengths = [k for k in range(1, len(text) + 1) for s in stop if s.startswith(text[-k:])]
    return max(lengths, default=0)


@settings(max_examples=300, deadline=None)
@given(text=SMALL_ALPHABET, stop=STOPS, data=st.data())
def test_random_chunkings_match_reference_cut(
    text: str, stop: list[str], data: st.DataObject
) -> None:
    matcher = StopStringMatcher(stop)
    results = feed_all(matcher, data.draw(chunkings(text)))
    matched = bool(results) and results[-1][1]
    emitted = "".join(piece for piece, _ in results) + ("" if matched else matcher.flush())
    expected = reference_cut(text, stop)
    assert emitted == expected
    assert matched == (expected != text)
    for piece, _ in results:
        assert not any(s in piece for s in stop)


@settings(max_examples=200, deadline=None)
@given(text=SMALL_ALPHABET, stop=STOPS, data=st.data())
def test_only_the_longest_stop_prefix_is_held(
    text: str, stop: list[str], data: st.DataObject
) -> None:
    matcher = StopStringMatcher(stop)
    fed = emitted = ""
    for chunk in data.draw(chunkings(text)):
        piece, matched = matcher.feed(chunk)
        if matched:
            break
        fed, emitted = fed + chunk, emitted + piece
        assert emitted == fed[: len(fed) - reference_hold(fed, stop)]
