"""How fast could a method be with perfect precision? A bound from a finished run's own records.

A method verifies rejected nodes beside the path it gets accepted, and its drafter takes time.
This prices, per method, the same requests with the same accepted paths as if every forward had
verified only them (a chain of the tokens it committed: root plus accepted drafts) and the
drafter cost nothing: each forward at the median seconds the run paid for forwards of that many
nodes (all methods' forwards pooled, as `scripts/in_run_curve.py` does), prefills and the loop's
bookkeeping as measured. The result is an upper bound on what better tree selection or a cheaper
drafter alone could give that method's acceptance, in tokens/s, beside the run's measured
tokens/s of every method.

Usage:
  .venv/bin/python scripts/precision_bound.py docs/runs/issue15/stop45/api-bank-100-t2
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

from in_run_curve import paid_seconds  # scripts/ is on sys.path


def method_totals(records: list[dict]) -> dict[str, dict]:
    """Per method: tokens, wall seconds, and the seconds its forwards would cost as chains."""
    totals: dict[str, dict] = defaultdict(lambda: dict(tokens=0, wall=0.0, prefill=0.0, bookkeeping=0.0,
                                                       committed=[]))
    for record in records:
        if "committed_per_forward" not in record:
            continue  # the generate() reference: no forwards of ours
        t = totals[record["method"]]
        t["tokens"] += record["new_tokens"]
        t["wall"] += record["wall_s"]
        t["prefill"] += record["prefill_s"]
        t["bookkeeping"] += record["bookkeeping_s"]
        t["committed"] += record["committed_per_forward"]
    return totals


def bound_table(run: Path) -> str:
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    paid = {n: statistics.median(s) for n, s in paid_seconds(run).items()}
    largest = max(paid)

    def price(nodes: int) -> float:  # a size the run never paid: the largest paid, scaled per node
        return paid[nodes] if nodes in paid else paid[largest] * nodes / largest

    lines = ["| method | τ | tokens/s measured | chains only, drafter free: tokens/s | bound / measured |",
             "| --- | ---: | ---: | ---: | ---: |"]
    for method, t in method_totals(records).items():
        chain_s = sum(price(c) for c in t["committed"])
        bound = t["tokens"] / (t["prefill"] + t["bookkeeping"] + chain_s)
        measured = t["tokens"] / t["wall"]
        tau = sum(t["committed"]) / len(t["committed"])
        lines.append(f"| {method} | {tau:.2f} | {measured:.1f} | {bound:.1f} | {bound / measured:.2f} |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an `oilbird bench --out` directory (a finished run)")
    args = parser.parse_args(argv)
    if not (args.run / "records.jsonl").exists():
        raise SystemExit(f"{args.run} has no records.jsonl: give the --out directory of a finished `oilbird bench` run")
    if not paid_seconds(args.run):
        raise SystemExit(f"{args.run}'s records keep no per-forward seconds (runs made before stop 40)")
    print(f"{args.run}: each method's accepted paths verified as chains, its drafter free\n")
    print(bound_table(args.run))


if __name__ == "__main__":
    main()
