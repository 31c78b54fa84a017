"""Does the 'fit' budget's choice depend on which cost curve it reads? Two curves, one process.

The fit (oilbird/tree_select.py) sizes every tree from the measured cost curve. A cached curve
timed in a slow spell is flatter than the forwards decoding pays (stop 44's: 1.23x the step at 6
nodes where decoding paid 1.42x; `scripts/in_run_curve.py`). This serves the same API-Bank
requests with two harnesses in one process, request by request, alternating which goes first:
side a fits its trees to the curve `load_or_measure` returns (the cached one, rechecked), side b
to a curve measured right now, and prints per method both sides' tokens/s, the ratio with its
paired 90% interval, forwards, nodes per forward and the outputs that differ (none may: the fit
only chooses what to verify).

Usage:
  .venv/bin/python scripts/curve_ab.py --requests 60 --methods suffix,oilbird --threads 2
  .venv/bin/python scripts/curve_ab.py --cached-points '{"1": 0.018, "8": 0.0262, "64": 0.110}'
"""

from __future__ import annotations

import argparse
import json

import torch

from forward_ab import serve_alternating, side_rows  # scripts/ is on sys.path
from oilbird.bench import BenchConfig, Harness
from oilbird.budget import BudgetConfig
from oilbird.cost_curve import CostCurve, measure_cost_curve
from oilbird.models import load_model
from oilbird.verifier import VerifierConfig


def curve_points(text: str) -> dict[int, float]:
    """`--cached-points`: a JSON object of node counts to seconds, e.g. '{"1": 0.018, "8": 0.026}'."""
    try:
        points = {int(n): float(s) for n, s in json.loads(text).items()}
    except (ValueError, AttributeError, TypeError):
        raise argparse.ArgumentTypeError(f"not a JSON object of node counts to seconds: {text!r}") from None
    if not points or min(points) < 1 or min(points.values()) <= 0:
        raise argparse.ArgumentTypeError("needs node counts >= 1 and positive seconds")
    return points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--requests", type=int, default=60, help="API-Bank requests, a quarter per file")
    parser.add_argument("--methods", default="suffix,oilbird")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cached-points", default=None, type=curve_points,
                        help="side a's curve as JSON {nodes: seconds} instead of the cached one")
    parser.add_argument("--out", default=None, help="write the rows and both curves as JSON here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, log=lambda message: None)
    config = BenchConfig(dataset="api-bank", per_category=max(1, args.requests // 4), limit=args.requests,
                         max_new_tokens=64, methods=args.methods, budget="fit", audit=False, grade=False)
    budget = BudgetConfig(mode="auto")
    sides = {side: Harness(loaded, config, {}, VerifierConfig(), budget) for side in ("a", "b")}
    curves = {"a": next(iter(sides["a"].curves.values())),
              "b": measure_cost_curve(sides["b"].verifier, budget.sizes(), budget.cost_prefix)}
    if args.cached_points:
        curves["a"] = CostCurve(points=args.cached_points)
    for side, harness in sides.items():
        harness.curves = {spec: curves[side] for spec in harness.curves}
        harness.policies = {label: p for label, spec, b in harness.variants if (p := harness.new_policy(spec, b))}
        print(f"side {side}: " + ", ".join(f"{n}: {1e3 * s:.1f} ms" for n, s in sorted(curves[side].points.items())))
    records = serve_alternating(sides, config)
    rows = side_rows(records, [label for label, _, _ in sides["a"].variants])
    print(f"{args.requests} API-Bank requests, 64 new tokens, budget fit, {args.threads} threads, one process")
    print("| method | a tokens/s | b tokens/s | b / a | 90% interval | forwards a / b | nodes a forward a / b | outputs that differ |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for label, row in rows.items():
        low, high = row["interval"] or (float("nan"), float("nan"))
        print(f"| {label} | {row['a_tps']:.1f} | {row['b_tps']:.1f} | {row['ratio']:.3f}x | {low:.2f}–{high:.2f} | "
              f"{row['forwards']['a']} / {row['forwards']['b']} | {row['nodes']['a']:.2f} / {row['nodes']['b']:.2f} | "
              f"{row['differ']}/{row['requests']} |")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(rows=rows, curves={s: c.to_json() for s, c in curves.items()}), f, indent=1)


if __name__ == "__main__":
    main()
