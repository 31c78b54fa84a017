"""scripts/goal_bounds.py: a speedup goal's prefill ceiling, flat-curve speedup and needed τ."""

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from oilbird.tables import read_records

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import goal_bounds  # noqa: E402


def _record(method, wall, prefill, forward, forwards, tokens):
    return dict(method=method, request_id="r", wall_s=wall, prefill_s=prefill, forward_s=forward,
                forwards=forwards, new_tokens=tokens)


def _run(tmp_path, records):
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return tmp_path


def test_the_bounds_follow_from_the_pooled_times(tmp_path):
    # ar: 40 tokens, 40 forwards of 0.1 s, 4 s of prefill, 1 s of loop: 9 s. The method commits the
    # same 40 tokens in 10 forwards of 0.25 s, with 4 s of prefill and 0.5 s of drafting: 7 s.
    run = _run(tmp_path, [_record("ar", 5.0, 2.0, 2.0, 20, 20), _record("ar", 4.0, 2.0, 2.0, 20, 20),
                          _record("oilbird", 7.0, 4.0, 2.5, 10, 40),
                          dict(method="hf-greedy", request_id="r", wall_s=20.0, forwards=1, new_tokens=1,
                               output_ids=[1])])  # no prefill kept
    sums = goal_bounds.totals(read_records(run))
    assert set(sums) == {"ar", "oilbird"} and sums["ar"]["wall_s"] == 9.0
    rows = goal_bounds.bounds(sums, goal=2.0)
    m = rows["oilbird"]
    assert m["speedup"] == pytest.approx(9 / 7) and m["ceiling"] == pytest.approx(9 / 4)
    assert m["decode_speedup"] == pytest.approx(5 / 3)
    assert m["needed_decode"] == pytest.approx(5 / (4.5 - 4))  # ar's decode / (9 / 2 - prefill)
    assert m["flat"] == pytest.approx(9 / (4 + 0.5 + 10 * 0.1))  # each forward at ar's 0.1 s
    assert m["tau"] == 4.0
    assert math.isinf(m["tau_needed"])  # 4.5 s of wall leaves nothing once prefill and drafting are paid
    assert rows["ar"]["speedup"] == 1.0 and rows["ar"]["flat"] == pytest.approx(1.0)
    loose = goal_bounds.bounds(sums, goal=1.5)["oilbird"]  # 6 s of wall: 1.5 s for the forwards
    assert loose["tau_needed"] == pytest.approx(40 * 0.1 / 1.5)
    assert "| oilbird | 1.29x | 2.25x | 1.67x | 10.00x | 1.64x | 4.00 | inf |" in goal_bounds.table(rows, 2.0)


def test_the_command_refuses_a_run_it_cannot_bound(tmp_path):
    def run(*args):
        return subprocess.run([sys.executable, str(SCRIPTS / "goal_bounds.py"), *map(str, args)],
                              capture_output=True, text=True)
    assert "no benchmark records at" in run(tmp_path).stderr
    (tmp_path / "records.jsonl").write_text("{not json\n")
    assert "is not JSON" in run(tmp_path).stderr
    _run(tmp_path, [_record("oilbird", 7.0, 4.0, 2.5, 10, 40)])
    assert "has no `ar` row" in run(tmp_path).stderr
    assert "--goal must be above 1" in run(tmp_path, "--goal", "0.5").stderr
    assert "--curve: curve point '8'" in run(tmp_path, "--curve", "8").stderr


def test_a_curve_prices_each_forward_by_its_nodes(tmp_path):
    curve = goal_bounds.parse_curve("8:1.3,16:1.6")
    assert curve == [(1, 1.0), (8, 1.3), (16, 1.6)]
    assert goal_bounds.curve_cost(curve, 1) == 1.0 and goal_bounds.curve_cost(curve, 12) == pytest.approx(1.45)
    assert goal_bounds.curve_cost(curve, 24) == pytest.approx(1.9)  # past the last point, along its segment
    assert goal_bounds.curve_cost([(1, 1.0)], 64) == 1.0  # flat
    # ar: 20 one-token forwards of 0.1 s. The method: 4 forwards of 8 nodes and 2 of 16.
    ar = dict(_record("ar", 5.0, 2.0, 2.0, 20, 20), nodes_per_forward=[1] * 20)
    method = dict(_record("oilbird", 4.0, 2.0, 1.5, 6, 20), nodes_per_forward=[8, 8, 8, 8, 16, 16])
    sums = goal_bounds.totals(read_records(_run(tmp_path, [ar, method])), curve)
    assert sums["oilbird"]["curve_steps"] == pytest.approx(4 * 1.3 + 2 * 1.6)
    rows = goal_bounds.bounds(sums, goal=2.0)
    assert rows["oilbird"]["on_curve"] == pytest.approx(5 / (2 + 0.5 + 8.4 * 0.1))
    assert rows["ar"]["on_curve"] == pytest.approx(1.0)
    assert "on the curve" in goal_bounds.table(rows, 2.0)
    assert "on the curve" not in goal_bounds.table(goal_bounds.bounds(goal_bounds.totals(read_records(tmp_path)), 2.0), 2.0)
    for bad in ("8", "8:x", "1:1.2", "16:1.6,8:1.3", "8:0.5"):
        with pytest.raises(ValueError, match="expected n:t"):
            goal_bounds.parse_curve(bad)
