"""Compare bench runs by what their trees would cost on one cost curve, free of the host's drift.

A run's wall times move with the host's speed by several percent between minutes, while its
trees do not: with `--budget fit --budget-recheck false` and the same cached curve, two runs
differ only in what the code chose to verify. This script prices every forward of every run on
one curve (the first run's `budget_curve`, or `--curve-from RUN`): the estimated decode time of a
method is the sum over its forwards of the curve's cost at that forward's node count. Per method
and run it prints τ, forwards, mean nodes, the estimated forward seconds, the forward seconds
the run measured (its verify forwards, `forward_s`) over the estimate, and the tokens per
estimated second relative to the first run that served the method. The measured-over-estimated
column says how far the curve (the fastest of a few probes) sits below what decoding paid that
hour. The drafter column is the drafter's own measured time (propose and observe), which the
curve does not price: compare it between methods of one run. With `--base METHOD` a last column
gives each row's tokens per estimated second over METHOD's in the same run: variants of one method (`oilbird`, `oilbird[spine_occurrence=first]`)
served side by side in one run compare there.

Usage:
  .venv/bin/python scripts/estimated_cost.py RUN_A [RUN_B ...] [--curve-from RUN] [--base METHOD]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from oilbird.cost_curve import CostCurve


def load_records(run: Path) -> dict[str, list[dict]]:
    """method -> its records (the audit's reference rows left out)."""
    out: dict[str, list[dict]] = defaultdict(list)
    for line in (run / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record.get("nodes_per_forward"):
            out[record["method"]].append(record)
    return out


def priced(records: list[dict], curve: CostCurve) -> dict:
    """τ, forwards, mean nodes and the estimated forward seconds of one method's records."""
    nodes = [n for r in records for n in r["nodes_per_forward"]]
    tokens = sum(sum(r["committed_per_forward"]) for r in records)
    seconds = sum(curve.cost(n) for n in nodes)
    measured = sum(r["forward_s"] for r in records)
    drafter = sum(r.get("propose_s", 0.0) + r.get("observe_s", 0.0) for r in records)
    return dict(tau=tokens / len(nodes), forwards=len(nodes), nodes=sum(nodes) / len(nodes),
                seconds=seconds, measured=measured, drafter=drafter, rate=tokens / seconds)


def table(runs: dict[Path, dict[str, list[dict]]], curve: CostCurve, base: str | None = None) -> list[str]:
    """The priced rows, one per method and run, methods in the order the runs first serve them."""
    methods = list(dict.fromkeys(m for records in runs.values() for m in records))
    head = ("| method | run | τ | forwards | mean nodes | est. forward s | measured / est. | drafter s "
            "| tokens / est. s | x first run |" + (f" x {base} |" if base else ""))
    lines = [head, "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if base else "")]
    base_rate = {run: priced(records[base], curve)["rate"] for run, records in runs.items()
                 if base in records} if base else {}
    for method in methods:
        first = None
        for run, records in runs.items():
            if method not in records:
                continue
            p = priced(records[method], curve)
            first = first or p["rate"]
            line = (f"| {method} | {run.name} | {p['tau']:.2f} | {p['forwards']} | {p['nodes']:.1f} | "
                    f"{p['seconds']:.2f} | {p['measured'] / p['seconds']:.3f} | {p['drafter']:.2f} | {p['rate']:.1f} | "
                    f"{p['rate'] / first:.3f} |")
            if base:
                line += f" {p['rate'] / base_rate[run]:.3f} |" if run in base_rate else " – |"
            lines.append(line)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--curve-from", type=Path, help="the run whose curve prices all (default: the first)")
    parser.add_argument("--base", help="also give each row over this method's rate in the same run")
    args = parser.parse_args()
    source = args.curve_from or args.runs[0]
    curve = CostCurve.from_json(json.loads((source / "summary.json").read_text())["budget_curve"])
    runs = {run: load_records(run) for run in args.runs}
    if args.base and not any(args.base in records for records in runs.values()):
        parser.error(f"--base {args.base!r} is served by none of the runs; methods: "
                     + ", ".join(dict.fromkeys(m for records in runs.values() for m in records)))
    print(f"priced on the curve of {source} ({curve.key})\n")
    print("\n".join(table(runs, curve, args.base)))


if __name__ == "__main__":
    main()
