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
