"""scripts/in_run_curve.py: the curve a run paid, from its own forwards, beside its fitted curve."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import in_run_curve  # noqa: E402
from oilbird.cost_curve import CostCurve  # noqa: E402


def _run(tmp_path, records, curve_points):
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    curve = CostCurve(points=curve_points, key="test")
    (tmp_path / "summary.json").write_text(json.dumps({"budget_curve": curve.to_json()}))
    return tmp_path


def test_forwards_are_pooled_by_node_count_across_methods_and_priced_against_each_step(tmp_path):
    records = [dict(method="ar", nodes_per_forward=[1] * 10, forward_s_per_forward=[0.020] * 9 + [0.5]),
               dict(method="sam", nodes_per_forward=[8] * 6 + [1], forward_s_per_forward=[0.030] * 6 + [0.020]),
               dict(method="oilbird", nodes_per_forward=[8] * 6, forward_s_per_forward=[0.032] * 6),
               dict(method="hf-greedy", output_ids=[1, 2])]  # the reference keeps no forwards
    run = _run(tmp_path, records, {1: 0.025, 8: 0.040, 16: 0.060})
    paid = in_run_curve.paid_seconds(run)
    assert sorted(paid) == [1, 8] and len(paid[1]) == 11 and len(paid[8]) == 12
    table = in_run_curve.table(paid, CostCurve.from_json(json.loads((run / "summary.json").read_text())["budget_curve"]), 10)
    # The step is the median one-node forward (the 0.5 s outlier does not move it): 20 ms.
    assert "| 1 | 11 | 25.0 | 1.00 | 20.0 | 1.00 |" in table
    assert "| 8 | 12 | 40.0 | 1.60 | 31.0 | 1.55 |" in table


def test_a_run_without_one_node_forwards_is_refused(tmp_path):
    run = _run(tmp_path, [dict(method="sam", nodes_per_forward=[8], forward_s_per_forward=[0.03])], {1: 0.02, 8: 0.03})
    with pytest.raises(SystemExit, match="one-node"):
        in_run_curve.table(in_run_curve.paid_seconds(run), CostCurve(points={1: 0.02, 8: 0.03}), 1)


def test_a_directory_that_is_not_a_finished_run_is_named(tmp_path):
    (tmp_path / "records.jsonl").write_text("")
    with pytest.raises(SystemExit, match="no summary.json: give the --out directory"):
        in_run_curve.main([str(tmp_path)])


def test_the_cache_band_prices_forwards_by_the_cache_they_attended(tmp_path):
    # Two requests, prompts of 501 and 901 tokens: their forwards attend caches from 500 and 900.
    # A one-node forward costs 10 ms plus 1 ms per 100 cached tokens; eight nodes cost 10 ms more.
    def cost(nodes, cached):
        return (10 + cached / 100 + (10 if nodes == 8 else 0)) / 1e3
    records = []
    for prompt in (501, 901):
        nodes, committed, seconds, cached = [1, 8] * 10, [1, 3] * 10, [], prompt - 1
        for n, c in zip(nodes, committed):
            seconds.append(cost(n, cached))
            cached += c
        records.append(dict(method="sam", prompt_len=prompt, nodes_per_forward=nodes,
                            committed_per_forward=committed, forward_s_per_forward=seconds))
    run = _run(tmp_path, records, {1: 0.015, 8: 0.025})
    by_cache = in_run_curve.paid_by_cache(run)
    assert by_cache[1][:2] == [(500, cost(1, 500)), (504, cost(1, 504))]  # the cache grows by what was committed
    table = in_run_curve.band_table(by_cache, CostCurve(points={1: 0.015, 8: 0.025}), 448, 576, 5)
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[2:-1]] for line in table.splitlines()[2:]}
    assert rows["1"][0] == "10" and rows["8"][0] == "10"  # only the first request's forwards are in the band
    assert rows["1"][1] == "15.00" and rows["8"][1] == "25.00"  # the fitted costs
    assert float(rows["1"][-1]) == pytest.approx(1.0, abs=0.01)  # 1 ms per 100 cached tokens
    assert float(rows["8"][3]) > float(rows["8"][2])  # median above the 10th percentile


def test_a_malformed_cache_band_is_refused(tmp_path):
    run = _run(tmp_path, [dict(method="ar", prompt_len=10, nodes_per_forward=[1], committed_per_forward=[1],
                               forward_s_per_forward=[0.02])], {1: 0.02})
    with pytest.raises(SystemExit, match="--cache-band must be LOW,HIGH"):
        in_run_curve.main([str(run), "--cache-band", "576,448"])
