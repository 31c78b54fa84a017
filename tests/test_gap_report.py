"""The diagnosis's rates, tables and comparison with a bench run, on hand-built positions (oilbird.gap_report)."""

import json

import pytest

from oilbird.errors import DatasetError
from oilbird.gap_measures import Position
from oilbird.gap_report import format_diagnosis, format_gap_vs_share, gap_vs_share, rates, spearman


def test_rates_count_gaps_reach_and_overlap():
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


def test_reach_of_no_gap_prints_a_dash():
    r = rates([Position(present=False, present_control=False, oracle_hit=True, match_length=4, run=0,
                        semantic_hit=False, static_hit=False)])
    row = format_diagnosis(dict(categories={}, overall=r)).splitlines()[2]
    assert row == "| all | 1 | 0.0% | 0.0% | 0.0% | 0.0% | 0.0% | – | – | – | – | – | – | – | – |"


def test_spearman_ranks_with_ties():
    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == 1.0
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == -1.0
    assert abs(spearman([1, 2, 2, 3], [1, 2, 3, 4]) - 0.9486832980505138) < 1e-12
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None


def _bench_run(tmp_path, records):
    run = tmp_path / "run"
    run.mkdir()
    (run / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def _record(rid, category, new_tokens, forwards, drafts, sem_sole):
    return dict(method="oilbird", request_id=rid, category=category, prompt_len=10, new_tokens=new_tokens,
                forwards=forwards, wall_s=1.0, accepted_drafts=drafts, accepted_sources={"sem": sem_sole},
                sole_sources={"sem": sem_sole}, audit=None, output_ids=[])


def test_gap_vs_share_puts_each_category_gap_beside_the_measured_share(tmp_path):
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
