"""scripts/precision_bound.py: a method's accepted paths priced as chains at the forwards a run paid."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import precision_bound  # noqa: E402


def _record(method, committed, nodes, seconds, wall, prefill=0.0):
    return dict(method=method, committed_per_forward=committed, nodes_per_forward=nodes,
                forward_s_per_forward=seconds, new_tokens=sum(committed), wall_s=wall,
                prefill_s=prefill, bookkeeping_s=0.0)


def test_accepted_paths_are_priced_as_chains_at_the_paid_medians(tmp_path):
    records = [_record("ar", [1] * 4, [1] * 4, [0.010] * 4, wall=0.040),
               # three forwards of 8 nodes (30 ms each) committed 3, 3 and 2 tokens
               _record("wide", [3, 3, 2], [8, 8, 8], [0.030] * 3, wall=0.100),
               _record("chain", [3, 2], [3, 2], [0.014, 0.012], wall=0.026),
               dict(method="hf-greedy", output_ids=[1, 2])]
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    table = precision_bound.bound_table(tmp_path)
    # wide: 8 tokens over 80 ms as measured; as chains 14 + 14 + 12 = 40 ms: 200 tokens/s, 2.5x.
    assert "| wide | 2.67 | 80.0 | 200.0 | 2.50 |" in table
    assert "| chain | 2.50 | 192.3 | 192.3 | 1.00 |" in table  # nothing rejected: the bound is itself
    assert "| ar | 1.00 | 100.0 | 100.0 | 1.00 |" in table and "hf-greedy" not in table


def test_a_size_the_run_never_paid_is_priced_from_the_largest_per_node(tmp_path):
    records = [_record("x", [4], [2], [0.010], wall=0.010)]
    (tmp_path / "records.jsonl").write_text(json.dumps(records[0]) + "\n")
    # 4 committed tokens, only 2-node forwards paid (10 ms): 4 nodes at 20 ms, 200 tokens/s
    assert "| x | 4.00 | 400.0 | 200.0 | 0.50 |" in precision_bound.bound_table(tmp_path)


def test_a_directory_that_is_not_a_run_is_refused_with_the_reason(tmp_path):
    import pytest

    with pytest.raises(SystemExit, match="has no records.jsonl: give the --out directory"):
        precision_bound.main([str(tmp_path)])
    (tmp_path / "records.jsonl").write_text(json.dumps(dict(method="ar", committed_per_forward=[1])) + "\n")
    with pytest.raises(SystemExit, match="no per-forward seconds"):
        precision_bound.main([str(tmp_path)])
