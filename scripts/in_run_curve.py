"""The cost curve decoding paid, from a run's own forwards, beside the curve its trees were fitted to.

Every record of `oilbird bench` keeps each verification forward's seconds
(`forward_s_per_forward`, from stop 40 on) beside its node count (`nodes_per_forward`). The cost
of a forward depends on its node count and the host, not on which drafter built the tree, so this
script pools a run's forwards of all methods by node count and prints, for every count with at
least `--min-forwards` forwards, the median milliseconds decoding paid and the cost the run's
fitted curve (`budget_curve` in its summary.json, measured or rechecked as the run started) gave
that count, each also as a ratio to its own one-node cost (the paid one: the median of the run's
one-node forwards, `ar`'s steps among them). The fit budget only uses the curve's shape (scaling
every cost by one factor leaves its choice unchanged), so the two ratio columns are what to compare.

The paid seconds are the forward alone (`Verification.forward_s`); the curve times the whole
`verify` call (mask, forward, walk, cache compaction), a few tenths of a millisecond more.

Usage:
  .venv/bin/python scripts/in_run_curve.py docs/runs/make-bench-zen4-w
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from oilbird.cost_curve import CostCurve


def paid_seconds(run: Path) -> dict[int, list[float]]:
    """Node count -> the seconds of every verification forward of that size in the run."""
    paid: dict[int, list[float]] = defaultdict(list)
    for line in (run / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        seconds = record.get("forward_s_per_forward")
        if seconds:
            for nodes, s in zip(record["nodes_per_forward"], seconds):
                paid[nodes].append(s)
    return paid


def table(paid: dict[int, list[float]], curve: CostCurve, min_forwards: int) -> str:
    """Markdown: per node count, the fitted and the paid cost, in ms and against each one's step."""
    if 1 not in paid:
        raise SystemExit("the run has no one-node forwards to take the paid step from (run `ar` in it)")
    step, fitted_step = statistics.median(paid[1]), curve.cost(1)
    lines = ["| nodes | forwards | fitted ms | fitted x step | paid ms (median) | paid x step |",
             "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for nodes in sorted(n for n, s in paid.items() if len(s) >= min_forwards):
        ms = statistics.median(paid[nodes])
        lines.append(f"| {nodes} | {len(paid[nodes])} | {1e3 * curve.cost(nodes):.1f} | "
                     f"{curve.cost(nodes) / fitted_step:.2f} | {1e3 * ms:.1f} | {ms / step:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an `oilbird bench --out` directory (a finished run)")
    parser.add_argument("--min-forwards", type=int, default=10, help="print node counts with at least this many forwards")
    args = parser.parse_args(argv)
    missing = [name for name in ("records.jsonl", "summary.json") if not (args.run / name).exists()]
    if missing:
        raise SystemExit(f"{args.run} has no {' or '.join(missing)}: give the --out directory of a "
                         "finished `oilbird bench` run")
    summary = json.loads((args.run / "summary.json").read_text())
    if not summary.get("budget_curve"):
        raise SystemExit(f"{args.run} used no measured curve (run it with --budget fit or auto)")
    paid = paid_seconds(args.run)
    if not paid:
        raise SystemExit(f"{args.run}'s records keep no per-forward seconds (runs made before stop 40)")
    curve = CostCurve.from_json(summary["budget_curve"])
    print(f"{args.run}: the curve its trees were fitted to against the forwards it paid\n")
    print(table(paid, curve, args.min_forwards))


if __name__ == "__main__":
    main()
