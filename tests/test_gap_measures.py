"""The identifiability-gap measures on hand-built token streams with known answers (oilbird.gap_measures)."""

import torch

from oilbird.gap_measures import (DiagnosisConfig, lexical_positions, neighbor_hits, neighbor_runs, occurs,
                                  oracle_candidates, union_candidates, verbatim_run)
from oilbird.suffix_automaton import SuffixAutomaton


def pool(*documents):
    sam = SuffixAutomaton()
    for doc in documents:
        sam.extend_many(doc)
        sam.end_document()
    return sam


def test_presence_and_runs_stay_within_one_document():
    sam = pool([1, 2, 3, 4], [5, 6])
    assert occurs(sam, [2, 3]) and occurs(sam, [5, 6]) and not occurs(sam, [4, 5])
    assert verbatim_run(sam, [2, 3, 4, 5, 6]) == 3
    assert verbatim_run(sam, [9, 2]) == 0


def test_oracle_uses_the_longest_suffix_then_backs_off():
    # "7 8 1 2" is followed by 3; "1 2" elsewhere by 4 and 5: the longest suffix comes first.
    sam = pool([7, 8, 1, 2, 3], [1, 2, 4], [1, 2, 5])
    candidates, length = oracle_candidates(sam, [0, 7, 8, 1, 2])
    assert length == 4 and candidates[0] == 3 and set(candidates) == {3, 4, 5}
    few = DiagnosisConfig(candidates=1)
    assert oracle_candidates(sam, [0, 7, 8, 1, 2], few)[0] == [3]
    # A 1-token match is below the 2-token key: no candidates at all.
    assert oracle_candidates(sam, [9, 9, 2]) == ([], 1)


def test_oracle_only_looks_at_the_last_16_tokens():
    sam = pool(list(range(100, 120)) + [7])
    context = list(range(100, 120))  # 20 tokens that all occur; only the last 16 are the key
    candidates, length = oracle_candidates(sam, context)
    assert length == 16 and candidates == [7]


def test_gap_positions_are_present_but_missed_by_the_oracle():
    # The pool saw "call f ( X ) ;" for X = 11; the request mints X = 12. After the minted value
    # the context suffix "( 12" never occurred, yet ") ;" did: a gap position.
    sam = pool([50, 60, 11, 70, 80, 90])
    positions = lexical_positions(sam, prompt=[1, 50, 60], output=[12, 70, 80, 90])
    at_value, after_value = positions[0], positions[1]
    assert not at_value.present and not at_value.oracle_hit  # 12, 70 never occurred together
    assert after_value.present and not after_value.oracle_hit and after_value.gap
    assert after_value.run == 3 and after_value.match_length == 0
    # One token after the value the key is still 1 token ("70"): still a gap. Then "70 80" is a
    # 2-token key again and the oracle hits.
    assert positions[2].gap and positions[2].match_length == 1
    assert positions[3].oracle_hit and positions[3].match_length == 2
    assert positions[3].present is False  # one token left: cannot be a 2-token presence


def test_control_presence_needs_four_tokens():
    sam = pool([1, 2, 3, 4, 5])
    positions = lexical_positions(sam, prompt=[0], output=[1, 2, 3, 9, 9])
    assert positions[0].present and not positions[0].present_control


def test_neighbor_hits_read_the_tokens_of_the_nearest_keys():
    keys = torch.eye(4)  # record r keyed by basis vector r
    tokens = torch.tensor([10, 11, 12, 13])
    queries = torch.tensor([[1.0, 0.1, 0, 0], [0, 0, 0, 1.0]])
    assert neighbor_hits(queries, keys, tokens, [10, 10], k=1) == [True, False]
    assert neighbor_hits(queries, keys, tokens, [11, 10], k=2) == [True, False]
    assert neighbor_hits(queries, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), [1, 2]) == [False, False]


def test_neighbor_runs_measure_how_much_of_the_continuation_a_neighbor_offers():
    keys = torch.eye(3)
    tokens = torch.tensor([10, 11, 12])  # one request: 10 11 12
    ends = torch.tensor([3, 3, 3])
    q = torch.tensor([[1.0, 0, 0]])
    assert neighbor_runs(q, keys, tokens, ends, [[10, 11, 99]], k=1) == [2]
    assert neighbor_runs(q, keys, tokens, ends, [[10, 11, 12, 13]], k=1) == [3]  # stops at the request end
    assert neighbor_runs(q, keys, tokens, ends, [[11, 12]], k=1) == [0]
    assert neighbor_runs(q, keys, tokens, ends, [[11, 12]], k=2) == [2]


def test_within_request_pool_holds_only_what_the_request_has_committed():
    within = DiagnosisConfig(within_request=True)
    output = [7, 8, 9, 7, 8, 9]
    positions = lexical_positions(pool(), prompt=[0], output=output, config=within)
    # Position 0: "7 8" is in the request's future, not its past: not present.
    assert not positions[0].present and not positions[0].oracle_hit
    # Position 3: "7 8 9" was committed at positions 0-2; the suffix "8 9" has not recurred yet, so
    # no exact key reaches it: a gap with a 3-token run behind it.
    assert positions[3].present and positions[3].gap and positions[3].run == 3
    assert positions[4].gap  # "9 7" never recurred; a 1-token key is below the 2-token minimum
    assert positions[5].oracle_hit and positions[5].match_length == 2  # "7 8" recurred, followed by 9
    # Off (the paper's definition), the empty pool holds nothing at all.
    assert not any(p.present or p.oracle_hit for p in lexical_positions(pool(), [0], output))


def test_within_request_oracle_merges_both_streams_longest_match_first():
    earlier = pool([5, 1, 2, 4])  # an earlier request: "1 2" then 4
    own = SuffixAutomaton()
    own.extend_many([3, 1, 2, 6, 3, 1, 2])  # this request so far: "3 1 2" then 6, and now "3 1 2" again
    candidates, length = union_candidates([earlier, own], [3, 1, 2], DiagnosisConfig())
    assert length == 3 and candidates == [6, 4]
    assert union_candidates([earlier, own], [3, 1, 2], DiagnosisConfig(candidates=1))[0] == [6]


def test_neighbor_searches_see_only_the_visible_records():
    keys = torch.eye(3)
    tokens = torch.tensor([10, 11, 12])
    ends = torch.tensor([3, 3, 3])
    near_last = torch.tensor([[0, 0.1, 1.0]])
    assert neighbor_hits(near_last, keys, tokens, [12], k=1) == [True]
    assert neighbor_hits(near_last, keys, tokens, [12], k=1, visible=[2]) == [False]  # record 2 not yet committed
    assert neighbor_hits(near_last, keys, tokens, [11], k=1, visible=[2]) == [True]
    near_first = torch.tensor([[1.0, 0, 0]])
    assert neighbor_runs(near_first, keys, tokens, ends, [[10, 11, 12]], k=1) == [3]
    assert neighbor_runs(near_first, keys, tokens, ends, [[10, 11, 12]], k=1, visible=[2]) == [2]  # reads no further
    assert neighbor_runs(near_first, keys, tokens, ends, [[10]], k=8, visible=[0]) == [0]  # nothing visible
