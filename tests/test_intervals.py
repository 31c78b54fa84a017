"""Paired bootstrap intervals of speed ratios over a run's requests (oilbird.intervals), and
where the tables show them (oilbird.summary, oilbird.tables)."""

import pytest

from oilbird.intervals import per_request, ratio_interval


def _times(walls, tokens=10):
    return {f"r{i}": (tokens, w) for i, w in enumerate(walls)}


def test_a_ratio_the_same_on_every_request_has_no_spread():
    fast, slow = _times([1.0, 2.0, 0.5, 4.0]), _times([2.0, 4.0, 1.0, 8.0])
    low, high = ratio_interval(fast, slow)
    assert low == pytest.approx(2.0) and high == pytest.approx(2.0)


def test_with_two_requests_the_ends_are_ratios_of_some_resample():
    # Two requests: every resample is (a, a), (b, b) or (a, b), so the interval's ends can only
    # be the pooled ratios of those three.
    num = {"a": (10, 1.0), "b": (30, 1.0)}
    den = {"a": (10, 2.0), "b": (30, 1.0)}
    pooled = {"aa": (10 / 1.0) / (10 / 2.0), "bb": 1.0, "ab": (40 / 2.0) / (40 / 3.0)}
    low, high = ratio_interval(num, den, draws=500)
    assert low == pytest.approx(min(pooled.values())) and high == pytest.approx(max(pooled.values()))


def test_the_interval_holds_the_point_estimate_and_widens_with_the_spread():
    den = _times([1.0] * 20)
    steady = _times([0.5 + 0.01 * (i % 3) for i in range(20)])
    erratic = _times([0.2 if i % 2 else 0.9 for i in range(20)])
    for num in (steady, erratic):
        low, high = ratio_interval(num, den)
        point = (sum(t for t, _ in num.values()) / sum(w for _, w in num.values())) / 10.0
        assert low <= point <= high
    width = [h - lo for lo, h in (ratio_interval(steady, den), ratio_interval(erratic, den))]
    assert width[1] > 5 * width[0]


def test_only_requests_both_served_count_and_the_seed_repeats_the_interval():
    num, den = _times([0.5, 0.6, 0.9, 0.4]), _times([1.0, 1.0, 1.0])
    assert ratio_interval(num, den) == ratio_interval(num, den)  # deterministic
    assert ratio_interval(num, den) == ratio_interval({k: num[k] for k in den}, den)  # r3 unused
    many, ones = _times([0.3 + 0.05 * (i * 7 % 11) for i in range(20)]), _times([1.0] * 20)
    assert ratio_interval(many, ones, draws=200, seed=1) != ratio_interval(many, ones, draws=200, seed=2)
    assert ratio_interval(_times([1.0]), _times([2.0])) is None  # one request: no spread to draw
    with pytest.raises(ValueError, match="level"):
        ratio_interval(num, den, level=1.5)


def test_per_request_reads_one_method_and_the_named_seconds():
    records = [dict(method="ar", request_id="q", new_tokens=5, wall_s=2.0, prefill_s=0.5),
               dict(method="sam", request_id="q", new_tokens=5, wall_s=1.0)]
    assert per_request(records, "ar") == {"q": (5, 2.0)}
    assert per_request(records, "ar", seconds="prefill_s") == {"q": (5, 0.5)}


def _rec(method, request, wall):
    return dict(method=method, request_id=request, new_tokens=10, forwards=5, wall_s=wall)


def test_summary_rows_carry_the_speedup_interval_and_the_tested_method_its_ratios():
    from oilbird.summary import summarize

    walls = {"ar": [2.0, 2.2, 1.8, 2.1], "sam": [1.0, 1.2, 0.8, 1.1], "oilbird": [0.9, 1.0, 0.7, 1.0]}
    records = [_rec(m, f"q{i}", w) for m, ws in walls.items() for i, w in enumerate(ws)]
    rows = {r["method"]: r for r in summarize(records, ["ar", "sam", "oilbird"])}
    assert rows["ar"]["speedup_interval"] is None
    low, high = rows["sam"]["speedup_interval"]
    assert low <= rows["sam"]["speedup"] <= high
    (versus,) = rows["oilbird"]["ratios"]
    assert versus["method"] == "sam"
    assert versus["ratio"] == pytest.approx(rows["oilbird"]["tokens_per_s"] / rows["sam"]["tokens_per_s"])
    assert versus["interval"][0] <= versus["ratio"] <= versus["interval"][1]
    assert "ratios" not in rows["sam"]


def test_the_table_prints_the_interval_column_and_the_ratio_line():
    from types import SimpleNamespace

    from oilbird.summary import summarize
    from oilbird.tables import format_table

    records = [_rec(m, f"q{i}", w) for m, ws in {"ar": [2.0, 4.0], "pld": [1.0, 2.0], "sam": [0.5, 1.0]}.items()
               for i, w in enumerate(ws)]
    config = SimpleNamespace(dataset="api-bank", max_new_tokens=64, budget="fit", sampling=None)
    table = format_table(summarize(records, ["ar", "pld", "sam"]), config)
    assert "| pld | 2 | 20 | 10 | 2.00 | 6.7 | 2.00x | 2.00–2.00 |" in table
    assert "sam / pld 2.00 (2.00–2.00)" in table
