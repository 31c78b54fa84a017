"""Does the identifiability gap predict where the semantic source pays? One table across benchmarks.

Reads `oilbird diagnose --compare-run ... --out DIR` summaries (each holds the diagnosis and the
semantic sole-source share measured by `oilbird bench` over the same requests) and prints, per
model and benchmark, the gap beside the share, then Spearman's rank correlation over the
benchmarks and over every category of every benchmark.

Usage: python scripts/gap_vs_share.py DIAGNOSE_OUT_DIR [DIAGNOSE_OUT_DIR ...]
"""

import argparse
import json
from pathlib import Path

from oilbird.gap_report import spearman


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="diagnose --out directories run with --compare-run")
    args = parser.parse_args()
    print("| model | benchmark (requests) | gap | gap (4) | semantic reach | semantic only (of present) | "
          "oilbird τ | sem sole share | sem sole tokens per 100 |")
    print("| --- | --- |" + " ---: |" * 7)
    overall, categories = [], []
    for run in args.runs:
        summary = json.loads((run / "summary.json").read_text())
        comparison = summary.get("gap_vs_share")
        if comparison is None:
            raise SystemExit(f"{run}: no gap_vs_share; run `oilbird diagnose --compare-run BENCH_DIR --out {run}`")
        rows = comparison["rows"]
        everything = next(r for r in rows if r["category"] == "all")
        overall.append(everything)
        categories += [r for r in rows if r["category"] != "all"]
        print(f"| {summary['model']} | {summary['replay']['dataset']} ({summary['requests']}) | "
              f"{100 * everything['gap']:.1f}% | {100 * everything['gap_control']:.1f}% | "
              f"{100 * everything['semantic_reach']:.1f}% | {100 * everything['semantic_only']:.1f}% | "
              f"{everything['tau']:.2f} | {100 * everything['sole_share']:.1f}% | {everything['sole_per_100']:.1f} |")
    print()
    for name, rows in (("benchmarks", overall), ("categories", categories)):
        rho = {key: spearman([r[key] for r in rows], [r["sole_share"] for r in rows])
               for key in ("gap", "gap_control", "semantic_only")}
        text = ", ".join(f"{key} {'–' if v is None else f'{v:+.2f}'}" for key, v in rho.items())
        print(f"Spearman with the sole share over {len(rows)} {name}: {text}")


if __name__ == "__main__":
    main()
