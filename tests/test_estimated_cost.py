"""scripts/estimated_cost.py: runs priced on one cost curve, variants against a base method."""

import json
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import estimated_cost  # noqa: E402
from oilbird.cost_curve import CostCurve  # noqa: E402


def write_run(path: Path, methods: dict[str, list[int]]) -> Path:
    """A run whose method serves one request: `nodes` per forward, two tokens committed each."""
    path.mkdir()
    lines = [json.dumps(dict(method=m, nodes_per_forward=nodes, committed_per_forward=[2] * len(nodes),
                             forward_s=0.1 * len(nodes), propose_s=0.01, observe_s=0.02))
             for m, nodes in methods.items()]
    (path / "records.jsonl").write_text("\n".join(lines) + "\n")
    return path


def test_rows_compare_across_runs_and_against_a_base_in_the_same_run(tmp_path):
    curve = CostCurve(points={1: 1.0, 8: 2.0}, key="k")
    a = write_run(tmp_path / "a", {"oilbird": [8, 8], "oilbird[x=1]": [1, 1]})
    b = write_run(tmp_path / "b", {"oilbird": [1, 1], "sam": [8]})
    runs = {run: estimated_cost.load_records(run) for run in (a, b)}
    rows = estimated_cost.table(runs, curve, base="oilbird")
    cells = {(r.split("|")[1].strip(), r.split("|")[2].strip()): r.split("|")[-3:-1] for r in rows[2:]}
    # oilbird in run a: 4 tokens in 4 s; [x=1]: 4 tokens in 2 s, twice the base's rate.
    assert [c.strip() for c in cells[("oilbird[x=1]", "a")]] == ["1.000", "2.000"]
    # oilbird in run b: 4 tokens in 2 s, twice its rate in run a (its first run), and its own base.
    assert [c.strip() for c in cells[("oilbird", "b")]] == ["2.000", "1.000"]
    assert [c.strip() for c in cells[("sam", "b")]] == ["1.000", "0.500"]  # a method only run b served
    assert len(rows) == 2 + 4
    assert all(r.split("|")[8].strip() == "0.03" for r in rows[2:])  # the drafter's own seconds


def test_a_base_no_run_served_is_refused_with_the_methods_it_could_be(tmp_path, monkeypatch, capsys):
    run = write_run(tmp_path / "a", {"oilbird": [8], "sam": [1]})
    (run / "summary.json").write_text(json.dumps({"budget_curve": CostCurve(points={1: 1.0}, key="k").to_json()}))
    monkeypatch.setattr(sys, "argv", ["estimated_cost.py", str(run), "--base", "suffix"])
    with pytest.raises(SystemExit):
        estimated_cost.main()
    assert "--base 'suffix' is served by none of the runs; methods: oilbird, sam" in capsys.readouterr().err
