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

With `--cache-band 448,576` it also compares the curve with the forwards that attended a cache of
about the curve's own length (each forward's cache: its prompt and the tokens committed before
it), at the paid 10th percentile and median, and fits how a forward's cost grows with its cache.

Usage:
  .venv/bin/python scripts/in_run_curve.py docs/runs/make-bench-zen4-w
  .venv/bin/python scripts/in_run_curve.py docs/runs/issue15/stop45/api-bank-100-t2 --cache-band 448,576
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path

import numpy as np

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


def paid_by_cache(run: Path) -> dict[int, list[tuple[int, float]]]:
    """Node count -> (cache length, seconds) of every verification forward: the cache a forward
    attends is the prompt (less its last token, the anchor) plus the tokens committed before it."""
    paid: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for line in (run / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        seconds = record.get("forward_s_per_forward")
        if not seconds:
            continue
        cached = record["prompt_len"] - 1
        for nodes, committed, s in zip(record["nodes_per_forward"], record["committed_per_forward"], seconds):
            paid[nodes].append((cached, s))
            cached += committed
    return paid


def band_table(paid: dict[int, list[tuple[int, float]]], curve: CostCurve, low: int, high: int,
               min_forwards: int) -> str:
    """Markdown: per node count, the forwards over a cache of `low`..`high` tokens (the curve's
    own length in between): the fitted cost beside the paid 10th percentile and median, and how
    much a forward's cost grew per 100 cached tokens over all the run's forwards of that size
    (a least-squares line, the slowest tenth left out)."""
    lines = [f"| nodes | forwards, cache {low}-{high} | fitted ms | paid p10 ms | paid median ms | "
             "ms per 100 cached tokens (all forwards) |", "| ---: | ---: | ---: | ---: | ---: | ---: |"]
    for nodes in sorted(paid):
        inside = [s for cached, s in paid[nodes] if low <= cached <= high]
        if len(inside) < min_forwards:
            continue
        cached, seconds = np.array(paid[nodes]).T  # [F] each
        keep = seconds < np.quantile(seconds, 0.9)
        slope = np.polyfit(cached[keep], seconds[keep], 1)[0] if keep.sum() > 1 else float("nan")
        lines.append(f"| {nodes} | {len(inside)} | {1e3 * curve.cost(nodes):.2f} | "
                     f"{1e3 * np.quantile(inside, 0.1):.2f} | {1e3 * statistics.median(inside):.2f} | "
                     f"{1e5 * slope:.2f} |")
    return "\n".join(lines)


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
    parser.add_argument("--cache-band", default=None, metavar="LOW,HIGH",
                        help="also compare the curve with the forwards over a cache of LOW..HIGH tokens, e.g. 448,576")
    args = parser.parse_args(argv)
    band = None
    if args.cache_band:
        try:
            band = tuple(int(x) for x in args.cache_band.split(","))
            assert len(band) == 2 and 0 <= band[0] <= band[1]
        except (ValueError, AssertionError):
            raise SystemExit(f"--cache-band must be LOW,HIGH cache lengths, LOW <= HIGH, got {args.cache_band!r}") from None
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
    if band:
        print(f"\nForwards over a cache of {band[0]}-{band[1]} tokens:\n")
        print(band_table(paid_by_cache(args.run), curve, band[0], band[1], args.min_forwards))


if __name__ == "__main__":
    main()
