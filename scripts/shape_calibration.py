"""How honest the 'fit' budget's acceptance estimates were, per node shape, in bench runs.

A node's shape is read from the tree its drafter proposed (`oilbird.acceptance.node_shapes`):
the height of the subtree under it (bins h0, h1, h2 = 2-3, h3 = 4 or more) and its number of
siblings, itself included (s1, s2, s3 = 3 or more). Every `oilbird bench --budget fit` run keeps,
per method and shape, the nodes tried (their parent accepted), their mean estimate of
P(accepted | parent accepted) and the share accepted (`summary.json`, `fit_calibration`), whether
or not the estimates used shapes (`--budget-fit-shape`). Where a shape's estimate and its share
differ, the estimates mix nodes the drafter was sure of with nodes it was not.

Usage:
  .venv/bin/python scripts/shape_calibration.py RUN [RUN...] [--methods suffix,oilbird]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def rows(run: Path, methods: list[str] | None) -> list[list[str]]:
    """Table rows of one run: method, shape, tried, mean estimate, share accepted."""
    summary = json.loads((run / "summary.json").read_text())
    out = []
    for method, calibration in (summary.get("fit_calibration") or {}).items():
        if methods and method not in methods:
            continue
        for shape, row in (calibration.get("by_shape") or {}).items():
            out.append([run.name, method, shape, str(row["tried"]), f"{row['estimate']:.3f}",
                        f"{row['accepted']:.3f}"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="directories written by oilbird bench --out")
    p.add_argument("--methods", default=None, help="comma list (default: every method with a 'fit' policy)")
    args = p.parse_args(argv)
    methods = args.methods.split(",") if args.methods else None
    missing = [str(run) for run in args.runs if not (run / "summary.json").is_file()]
    if missing:
        p.error(f"no summary.json in {', '.join(missing)}: give directories written by oilbird bench --out")
    table = [row for run in args.runs for row in rows(run, methods)]
    if not table:
        p.error("no per-shape calibration in these runs (runs made with --budget fit before stop 58 lack it)")
    print("| run | method | shape | tried | mean estimate | accepted |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for row in table:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
