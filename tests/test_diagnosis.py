"""The diagnosis's pure parts on hand-built token streams with known answers (oilbird.diagnosis)."""

import torch

from oilbird.diagnosis import (DiagnosisConfig, lexical_positions, neighbour_hits, occurs, oracle_candidates,
                               verbatim_run)
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


def test_neighbour_hits_read_the_tokens_of_the_nearest_keys():
    keys = torch.eye(4)  # record r keyed by basis vector r
    tokens = torch.tensor([10, 11, 12, 13])
    queries = torch.tensor([[1.0, 0.1, 0, 0], [0, 0, 0, 1.0]])
    assert neighbour_hits(queries, keys, tokens, [10, 10], k=1) == [True, False]
    assert neighbour_hits(queries, keys, tokens, [11, 10], k=2) == [True, False]
    assert neighbour_hits(queries, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), [1, 2]) == [False, False]


def test_rates_count_gaps_reach_and_overlap():
    from oilbird.diagnose import format_diagnosis, rates
    from oilbird.diagnosis import Position

    positions = [
        Position(present=True, present_control=True, oracle_hit=False, match_length=1, run=6,
                 semantic_hit=True, static_hit=False),   # a gap the semantic key reaches
        Position(present=True, present_control=False, oracle_hit=False, match_length=0, run=2,
                 semantic_hit=False, static_hit=True),   # a gap only under the 2-token test
        Position(present=True, present_control=True, oracle_hit=True, match_length=16, run=9,
                 semantic_hit=True, static_hit=True),    # both keys
        Position(present=False, present_control=False, oracle_hit=False, match_length=0, run=0,
                 semantic_hit=False, static_hit=False),  # not in the pool at all
    ]
    r = rates(positions)
    assert r["presence"] == 0.75 and r["oracle_miss"] == 0.75 and r["gap"] == 0.5 and r["gap_control"] == 0.25
    assert r["run_behind_gap"] == 4.0 and r["semantic_reach"] == 0.5 and r["static_reach"] == 0.5
    assert r["semantic_reach_control"] == 1.0
    assert r["both"] == 1 / 3 and r["semantic_only"] == 1 / 3 and r["exact_only"] == 0.0
    table = format_diagnosis(dict(categories={"x": r}, overall=r))
    assert "| x | 4 | 75.0% | 50.0% | 75.0% | 50.0% | 25.0% | 4.0 | 0.0 | 50.0% | 100.0% | 50.0% |" in table


def test_diagnose_command_on_the_real_model_caches_its_replay(smol, tmp_path, monkeypatch):
    import oilbird.diagnose as diagnose

    monkeypatch.setattr(diagnose, "default_cache_dir", lambda: tmp_path / "cache")
    config = diagnose.ReplayConfig(dataset="api-bank/level-1-api", limit=3, max_new_tokens=8)
    first = diagnose.run_diagnosis(smol, config, out_dir=tmp_path / "out", progress=False)
    assert first["requests"] == 3 and first["overall"]["positions"] > 0
    assert len((tmp_path / "out" / "positions.jsonl").read_text().splitlines()) == 3
    calls = []
    monkeypatch.setattr(diagnose, "greedy_reference", lambda *a, **k: calls.append(a))
    second = diagnose.run_diagnosis(smol, config, progress=False)
    assert not calls and second["overall"] == first["overall"]  # nothing decoded the second time
    diagnose.plot_diagnosis(second, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 1000
    # The request's own committed text only adds to the pool: every rate of presence can only grow.
    within = diagnose.run_diagnosis(smol, config, DiagnosisConfig(within_request=True), progress=False)
    assert not calls and within["overall"]["positions"] == first["overall"]["positions"]
    assert within["overall"]["presence"] >= first["overall"]["presence"]
    assert within["overall"]["oracle_miss"] <= first["overall"]["oracle_miss"]


def test_neighbour_runs_measure_how_much_of_the_continuation_a_neighbour_offers():
    from oilbird.diagnosis import neighbour_runs

    keys = torch.eye(3)
    tokens = torch.tensor([10, 11, 12])  # one request: 10 11 12
    ends = torch.tensor([3, 3, 3])
    q = torch.tensor([[1.0, 0, 0]])
    assert neighbour_runs(q, keys, tokens, ends, [[10, 11, 99]], k=1) == [2]
    assert neighbour_runs(q, keys, tokens, ends, [[10, 11, 12, 13]], k=1) == [3]  # stops at the request end
    assert neighbour_runs(q, keys, tokens, ends, [[11, 12]], k=1) == [0]
    assert neighbour_runs(q, keys, tokens, ends, [[11, 12]], k=2) == [2]


def test_within_request_pool_holds_only_what_the_request_has_committed():
    from oilbird.diagnosis import DiagnosisConfig

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
    from oilbird.diagnosis import DiagnosisConfig, union_candidates

    earlier = pool([5, 1, 2, 4])  # an earlier request: "1 2" then 4
    own = SuffixAutomaton()
    own.extend_many([3, 1, 2, 6, 3, 1, 2])  # this request so far: "3 1 2" then 6, and now "3 1 2" again
    candidates, length = union_candidates([earlier, own], [3, 1, 2], DiagnosisConfig())
    assert length == 3 and candidates == [6, 4]
    assert union_candidates([earlier, own], [3, 1, 2], DiagnosisConfig(candidates=1))[0] == [6]


def test_neighbour_searches_see_only_the_visible_records():
    from oilbird.diagnosis import neighbour_runs

    keys = torch.eye(3)
    tokens = torch.tensor([10, 11, 12])
    ends = torch.tensor([3, 3, 3])
    near_last = torch.tensor([[0, 0.1, 1.0]])
    assert neighbour_hits(near_last, keys, tokens, [12], k=1) == [True]
    assert neighbour_hits(near_last, keys, tokens, [12], k=1, visible=[2]) == [False]  # record 2 not yet committed
    assert neighbour_hits(near_last, keys, tokens, [11], k=1, visible=[2]) == [True]
    near_first = torch.tensor([[1.0, 0, 0]])
    assert neighbour_runs(near_first, keys, tokens, ends, [[10, 11, 12]], k=1) == [3]
    assert neighbour_runs(near_first, keys, tokens, ends, [[10, 11, 12]], k=1, visible=[2]) == [2]  # reads no further
    assert neighbour_runs(near_first, keys, tokens, ends, [[10]], k=8, visible=[0]) == [0]  # nothing visible


def test_reach_of_no_gap_prints_a_dash():
    from oilbird.diagnose import format_diagnosis, rates
    from oilbird.diagnosis import Position

    r = rates([Position(present=False, present_control=False, oracle_hit=True, match_length=4, run=0,
                        semantic_hit=False, static_hit=False)])
    row = format_diagnosis(dict(categories={}, overall=r)).splitlines()[2]
    assert row == "| all | 1 | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | – | – | – | – | – | – | – | – |"


def test_spearman_ranks_with_ties():
    from oilbird.diagnose import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert abs(spearman([1, 2, 2, 3], [1, 2, 3, 4]) - 0.9486832980505138) < 1e-12
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def _bench_run(tmp_path, records):
    import json

    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _record(rid, category, new_tokens, forwards, drafts, sem_sole):
    return dict(method="oilbird", request_id=rid, category=category, prompt_len=10, new_tokens=new_tokens,
                forwards=forwards, wall_s=1.0, accepted_drafts=drafts, accepted_sources={"sem": sem_sole},
                sole_sources={"sem": sem_sole}, audit=None, output_ids=[])


def test_gap_vs_share_puts_each_category_gap_beside_the_measured_share(tmp_path):
    import pytest

    from oilbird.diagnose import format_gap_vs_share, gap_vs_share, rates
    from oilbird.diagnosis import Position
    from oilbird.errors import DatasetError

    gap = Position(present=True, present_control=True, oracle_hit=False, match_length=0, run=3, semantic_hit=True)
    hit = Position(present=True, present_control=True, oracle_hit=True, match_length=5, run=3, semantic_hit=False)
    a, b, c = rates([gap, hit, hit, hit]), rates([gap, gap, hit, hit]), rates([gap, gap, gap, hit])
    summary = dict(categories={"a": a, "b": b, "c": c}, overall=rates([gap] * 6 + [hit] * 6),
                   request_ids=["a/0", "b/0", "c/0"])
    run = _bench_run(tmp_path, [_record("a/0", "a", 40, 20, 20, 1), _record("b/0", "b", 40, 10, 30, 6),
                                _record("c/0", "c", 40, 10, 30, 9)])
    comparison = gap_vs_share(summary, run)
    rows = {r["category"]: r for r in comparison["rows"]}
    assert rows["a"]["gap"] == 0.25 and rows["a"]["tau"] == 2.0 and rows["a"]["sole_share"] == 1 / 20
    assert rows["b"]["sole_share"] == 0.2 and rows["b"]["sole_per_100"] == 100 * 6 / 40
    assert rows["all"]["sole_share"] == 16 / 80 and comparison["spearman"]["gap"] == 1.0
    assert "| b | 50.0% | 50.0% | 100.0% |" in format_gap_vs_share(comparison)
    with pytest.raises(DatasetError, match="not the same"):
        gap_vs_share(dict(summary, request_ids=["a/0", "b/0"]), run)
    with pytest.raises(DatasetError, match="no 'goose' records"):
        gap_vs_share(summary, run, method="goose")
