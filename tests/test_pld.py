"""Prompt lookup: the reference scan, the incremental index, and the drafter on token lists."""

from hypothesis import given, settings
from hypothesis import strategies as st

from oilbird.drafters import make_drafter
from oilbird.drafters.pld import NgramIndex, PLDConfig, pld_lookup


def test_longest_ngram_wins_and_earliest_occurrence_is_used():
    #      0  1  2  3  4  5  6  7  8  9
    seq = [1, 2, 3, 9, 1, 2, 3, 8, 1, 2, 3]
    # 3-gram (1,2,3) first occurs at 0 -> continuation starts at 3.
    assert pld_lookup(seq, 3, 1, 4) == [9, 1, 2, 3]


def test_backs_off_to_shorter_ngrams():
    seq = [4, 7, 5, 6, 7]  # (6,7) and (5,6,7) never occurred before; (7,) did at 1
    assert pld_lookup(seq, 3, 1, 2) == [5, 6]
    assert pld_lookup(seq, 3, 2, 2) == []  # min_ngram=2 forbids the 1-gram match


def test_query_does_not_match_itself():
    assert pld_lookup([1, 2, 3], 3, 1, 5) == []


def test_continuation_is_cut_at_the_end_of_the_sequence():
    assert pld_lookup([5, 6, 5], 2, 1, 10) == [6, 5]


@settings(max_examples=300, deadline=None)
@given(seq=st.lists(st.integers(0, 4), min_size=1, max_size=60),
       max_ngram=st.integers(1, 4), k=st.integers(1, 8))
def test_index_matches_reference_scan(seq, max_ngram, k):
    index = NgramIndex(max_ngram, 1)
    for i, token in enumerate(seq):  # grow one token at a time, as decoding does
        index.extend([token])
        assert index.lookup(k) == pld_lookup(seq[: i + 1], max_ngram, 1, k)


def test_drafter_proposes_a_chain_under_the_anchor_within_budget():
    drafter = make_drafter("pld", PLDConfig(max_ngram=3, num_pred_tokens=10))
    drafter.start_request("r", [10, 11, 12, 13, 14, 15, 10, 11])
    tree = drafter.propose("r", budget=4)
    assert tree.tokens == [11, 12, 13, 14]  # root = anchor, then 3 drafts (budget includes root)
    assert tree.parents == [-1, 0, 1, 2]
    assert all(s == {"pld"} for s in tree.sources[1:])


def test_ar_drafts_nothing():
    drafter = make_drafter("ar")
    drafter.start_request("r", [1, 2, 1])
    assert drafter.propose("r", budget=64).tokens == [1]
