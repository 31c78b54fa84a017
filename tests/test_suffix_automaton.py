"""Suffix automaton against brute force on random streams (hypothesis) and hand-built cases."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from oilbird.suffix_automaton import SuffixAutomaton


def occurs(stream, sub):
    n = len(sub)
    return any(stream[i:i + n] == sub for i in range(len(stream) - n + 1))


def brute_longest_suffix(stream, query):
    for n in range(len(query), 0, -1):
        if occurs(stream, query[len(query) - n:]):
            return n
    return 0


def brute_first_end(stream, sub):
    n = len(sub)
    return next(i + n - 1 for i in range(len(stream) - n + 1) if stream[i:i + n] == sub)


tokens = st.lists(st.integers(0, 3), min_size=0, max_size=40)


@settings(max_examples=300, deadline=None)
@given(stream=tokens, query=tokens)
def test_longest_suffix_match_equals_brute_force(stream, query):
    sam = SuffixAutomaton()
    sam.extend_many(stream)
    state, length = sam.match(query)
    assert length == brute_longest_suffix(stream, query)
    if length:
        suffix = query[len(query) - length:]
        assert sam.first_end[state] == brute_first_end(stream, suffix)
        end = brute_first_end(stream, suffix)
        assert sam.continuation(state, 5) == stream[end + 1:end + 6]


@settings(max_examples=200, deadline=None)
@given(stream=st.lists(st.integers(0, 3), min_size=1, max_size=40))
def test_every_substring_is_recognised_and_states_stay_linear(stream):
    sam = SuffixAutomaton()
    sam.extend_many(stream)
    for i in range(len(stream)):
        for j in range(i + 1, len(stream) + 1):
            assert sam.match(stream[i:j])[1] == j - i
    assert sam.num_states <= max(2, 2 * len(stream) - 1) + 1  # at most 2n-1 states plus root


@settings(max_examples=200, deadline=None)
@given(stream=st.lists(st.integers(0, 3), min_size=1, max_size=30),
       query=st.lists(st.integers(0, 3), min_size=1, max_size=10))
def test_candidates_back_off_to_shorter_suffixes(stream, query):
    sam = SuffixAutomaton()
    sam.extend_many(stream)
    state, length = sam.match(query)
    found = sam.candidates(state, length, count=8)
    # Brute force: tokens following any occurrence of any suffix of query, longest suffix first.
    expected = []
    for n in range(length, 0, -1):
        suffix = query[len(query) - n:]
        for i in range(len(stream) - n):
            if stream[i:i + n] == suffix and stream[i + n] not in expected:
                expected.append(stream[i + n])
        if len(expected) >= 8:
            break
    assert len(found) == min(8, len(expected))
    assert {t for t, _, _ in found} <= set(expected)
    if len(expected) <= 8:
        assert {t for t, _, _ in found} == set(expected)
    for token, _, match_len in found:  # each candidate really follows a match of that length
        assert occurs(stream, query[len(query) - match_len:] + [token])


def test_separators_stop_matches_and_continuations_across_documents():
    sam = SuffixAutomaton()
    sam.extend_many([1, 2, 3])
    sam.end_document()
    sam.extend_many([4, 5])
    state, length = sam.match([2, 3])
    assert length == 2 and sam.continuation(state, 10) == []  # the separator ends the tail
    assert sam.match([3, 4])[1] == 1  # "3 4" never occurs: the separator sits between them


def test_cursor_advanced_before_extension_never_matches_itself():
    sam = SuffixAutomaton()
    state = length = 0
    for token in [7, 8, 9]:
        state, length = sam.advance(state, length, token)
        sam.extend(token)
    assert length == 0  # nothing occurred before
    state, length = sam.advance(state, length, 7)
    sam.extend(7)
    assert length == 1 and sam.continuation(state, 3) == [8, 9, 7]


def brute_last_end(stream, sub):
    n = len(sub)
    return max(i + n - 1 for i in range(len(stream) - n + 1) if stream[i:i + n] == sub)


@settings(max_examples=300, deadline=None)
@given(stream=tokens.filter(bool), data=st.data())
def test_track_recent_gives_every_substrings_first_and_last_end(stream, data):
    sam = SuffixAutomaton(track_recent=True)
    sam.extend_many(stream)
    start = data.draw(st.integers(0, len(stream) - 1))
    sub = stream[start:data.draw(st.integers(start + 1, len(stream)))]
    state, length = sam.match(sub)
    assert length == len(sub)
    assert sam.first_end[state] == brute_first_end(stream, sub)
    assert sam.last_end[state] == brute_last_end(stream, sub)
    ends = sorted(i + len(sub) - 1 for i in range(len(stream) - len(sub) + 1) if stream[i:i + len(sub)] == sub)
    assert sam.prev_end[state] == (ends[-2] if len(ends) > 1 else -1)


def test_recent_continuation_copies_the_latest_occurrence():
    sam = SuffixAutomaton(track_recent=True)
    sam.extend_many([1, 2, 3, 4, 1, 2, 5, 6, 1, 2])
    state, length = sam.match([1, 2])
    assert length == 2
    assert sam.continuation(state, 2) == [3, 4]  # the first "1 2" is followed by 3 4
    assert sam.continuation(state, 2, recent=True) == [5, 6]  # the latest followed one, not the query's own
    plain = SuffixAutomaton()
    plain.extend_many([1, 2])
    with pytest.raises(ValueError, match="track_recent"):
        plain.continuation(plain.match([1])[0], 1, recent=True)


def brute_count(stream, sub):
    n = len(sub)
    return sum(stream[i:i + n] == sub for i in range(len(stream) - n + 1))


@settings(max_examples=300, deadline=None)
@given(stream=tokens.filter(bool), data=st.data())
def test_track_counts_gives_every_substrings_occurrences(stream, data):
    sam = SuffixAutomaton(track_counts=True)
    for i, token in enumerate(stream):  # documents too: separators split the counts
        sam.extend(token)
        if data.draw(st.booleans()):
            sam.end_document()
    text = sam.tokens
    start = data.draw(st.integers(0, len(text) - 1))
    sub = text[start:data.draw(st.integers(start + 1, len(text)))]
    if any(t < 0 for t in sub):
        return
    state, length = sam.match(sub)
    assert length == len(sub) and sam.count[state] == brute_count(text, sub)


def test_frequent_continuation_follows_the_majority_and_scores_by_count_ratios():
    sam = SuffixAutomaton(track_counts=True)
    for doc in ([1, 2, 3, 9], [1, 2, 4, 5], [1, 2, 4, 6]):
        sam.extend_many(doc)
        sam.end_document()
    state, _ = sam.match([1, 2])
    tokens, probs = sam.frequent_continuation(state, 5)
    # "1 2" is followed by 4 twice and 3 once; "1 2 4" by 5 and 6 once each (the earliest wins
    # the tie); "1 2 4 5" only by the separator: the chain stops there.
    assert tokens == [4, 5]
    assert probs == pytest.approx([2 / 3, 1 / 3])
    assert sam.continuation(state, 2) == [3, 9]  # the first occurrence, for contrast
    assert sam.path_probs(state, [3, 9]) == pytest.approx([1 / 3, 1 / 3])
    assert sam.path_probs(state, [3, 7]) == pytest.approx([1 / 3])  # "1 2 3 7" never occurred
    plain = SuffixAutomaton()
    plain.extend_many([1, 2])
    with pytest.raises(ValueError, match="track_counts"):
        plain.frequent_continuation(plain.match([1])[0], 1)
    with pytest.raises(ValueError, match="track_counts"):
        plain.path_probs(plain.match([1])[0], [2])
