"""scripts/tree_sizes.py: per method, how large a run's verified trees were and what the large ones cost."""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import tree_sizes  # noqa: E402

from oilbird.tables import read_records  # noqa: E402


def test_forwards_are_counted_per_method_and_the_large_ones_priced(tmp_path):
    base = dict(request_id="r", new_tokens=2, forwards=1, wall_s=1.0)
    records = [dict(base, method="ar", nodes_per_forward=[1, 1], forward_s_per_forward=[0.02, 0.02],
                    committed_per_forward=[1, 1]),  # a one-node forward drafted nothing: never 'whole'
               dict(base, method="oilbird", nodes_per_forward=[4, 64, 32], forward_s_per_forward=[0.03, 0.2, 0.1],
                    committed_per_forward=[4, 3, 32]),  # the first and last trees accepted whole
               dict(base, method="oilbird", nodes_per_forward=[1], forward_s_per_forward=[0.02]),
               dict(base, method="hf-greedy", output_ids=[1, 2])]  # the reference keeps no forwards
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    sizes = tree_sizes.tree_sizes(read_records(tmp_path), 32)
    assert set(sizes) == {"ar", "oilbird"}
    assert sizes["oilbird"]["forwards"] == 4 and sizes["oilbird"]["mean_nodes"] == 101 / 4
    assert sizes["oilbird"]["large"] == 2 and abs(sizes["oilbird"]["large_s"] - 0.3) < 1e-12
    assert sizes["ar"]["large"] == 0 and abs(sizes["ar"]["forward_s"] - 0.04) < 1e-12
    assert sizes["oilbird"]["whole"] == 2 and sizes["ar"]["whole"] == 0
    assert "| oilbird | 4 | 25.2 | 2 | 0.3 | 0.4 | 2 |" in tree_sizes.table(sizes, 32)
