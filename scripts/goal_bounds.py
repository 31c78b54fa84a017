"""What a speedup goal asks of a run's methods, from the run's own records: the prefill's ceiling,
the speedup a flat cost curve would give, and the accepted length the goal needs.

Every method of a run prefills the same prompts, and a speedup against `ar` counts the prefill in
both times. So the prefill caps every method's speedup, whatever it drafts, and a goal G needs
the decode (everything after the prefill) to be (ar's decode) / (ar's wall / G - the method's
prefill) times faster than `ar`'s. From the records of `oilbird bench --out RUN` (`wall_s`,
`prefill_s`, `forward_s`, `forwards`, `new_tokens`), pooled over the run's requests, per method:

- speedup: ar's wall time / the method's (the run's tokens/s ratio: both commit the same tokens).
- ceiling: ar's wall time / the method's prefill time: the speedup of a decode that cost nothing.
- needed decode speedup: the decode speedup against `ar` that would reach the goal (inf: the
  prefill alone is past it); beside it, the run's own decode speedup.
- flat curve: the speedup if each of the method's verification forwards had cost `ar`'s mean
  one-token forward (a GPU's curve at its limit), the drafter and the bookkeeping as measured.
- τ needed, flat: the accepted length that would reach the goal on that flat curve (inf: not even
  a decode of no forwards at all would, given the prefill, drafter and bookkeeping as measured).
- on the curve (with `--curve`): the speedup if each forward of n nodes had cost the given
  curve's t(n) one-token forwards (points n:t, t(1) = 1, linear between them and past the last),
  e.g. issue 15's goal curve `8:1.3,16:1.6,64:3.5`: whether meeting the curve goals would meet
  the speed goals, for the trees the run verified.

Usage:
  .venv/bin/python scripts/goal_bounds.py docs/runs/issue15/stop55/make-bench-clone --goal 2.0
  .venv/bin/python scripts/goal_bounds.py RUN --goal 2.0 --curve 8:1.3,16:1.6,64:3.5
"""

from __future__ import annotations

import math

from run_records import load, markdown, run_parser

_FIELDS = ("wall_s", "prefill_s", "forward_s", "forwards", "new_tokens")


def parse_curve(text: str) -> list[tuple[int, float]]:
    """'8:1.3,16:1.6' -> [(1, 1.0), (8, 1.3), (16, 1.6)]: a cost curve in one-token forwards.

    Raises:
        ValueError: a point that is not n:t with n > 1 and t >= 1, or node counts out of order.
    """
    points = [(1, 1.0)]
    for part in text.split(","):
        n, sep, t = part.partition(":")
        try:
            point = (int(n), float(t))
        except ValueError:
            point = None
        if not sep or point is None or point[0] <= points[-1][0] or point[1] < 1:
            raise ValueError(f"curve point {part!r}: expected n:t with node counts rising past 1 and "
                             f"t >= 1 one-token forwards, e.g. 8:1.3,16:1.6,64:3.5")
        points.append(point)
    return points


def curve_cost(points: list[tuple[int, float]], nodes: int) -> float:
    """t(nodes) in one-token forwards: linear between the points, and past the last along the last
    segment (flat past (1, 1) alone)."""
    for (n0, t0), (n1, t1) in zip(points, points[1:]):
        if nodes <= n1:
            return t0 + (t1 - t0) * (nodes - n0) / (n1 - n0)
    if len(points) == 1:
        return 1.0
    (n0, t0), (n1, t1) = points[-2:]
    return t1 + (t1 - t0) * (nodes - n1) / (n1 - n0)


def totals(records: list[dict], curve: list[tuple[int, float]] | None = None) -> dict[str, dict[str, float]]:
    """Method -> a run's records summed over its requests (`_FIELDS`, and with `curve` its
    forwards' `curve_steps`); the generate() reference, which keeps no prefill time, is left out."""
    out: dict[str, dict[str, float]] = {}
    for record in records:
        if record.get("prefill_s") is None:
            continue
        row = out.setdefault(record["method"], dict.fromkeys(_FIELDS, 0.0))
        for name in _FIELDS:
            row[name] += record[name]
        if curve is not None:
            nodes = record.get("nodes_per_forward") or [1] * record["forwards"]
            row["curve_steps"] = row.get("curve_steps", 0.0) + sum(curve_cost(curve, n) for n in nodes)
    return out


def _ratio(a: float, b: float) -> float:
    """a / b, or inf where there is nothing to divide by (no prefill time, no forwards, no room)."""
    return a / b if b > 0 else math.inf


def bounds(sums: dict[str, dict[str, float]], goal: float) -> dict[str, dict[str, float]]:
    """Method -> speedup, ceiling, decode_speedup, needed_decode, flat, tau, tau_needed, and
    on_curve where `sums` has curve_steps (see the module docstring). Raises KeyError when the run
    has no `ar` row."""
    ar = sums["ar"]
    ar_decode = ar["wall_s"] - ar["prefill_s"]
    step = _ratio(ar["forward_s"], ar["forwards"])  # ar's mean one-token forward
    target = ar["wall_s"] / goal  # the wall time that would make the goal
    out = {}
    for method, m in sums.items():
        decode = m["wall_s"] - m["prefill_s"]
        other = decode - m["forward_s"]  # drafter, bookkeeping and the loop's own time
        room = target - m["prefill_s"]
        flat_room = room - other
        out[method] = dict(
            speedup=_ratio(ar["wall_s"], m["wall_s"]),
            ceiling=_ratio(ar["wall_s"], m["prefill_s"]),
            decode_speedup=_ratio(ar_decode, decode),
            needed_decode=_ratio(ar_decode, room),
            flat=_ratio(ar["wall_s"], m["prefill_s"] + other + m["forwards"] * step),
            tau=_ratio(m["new_tokens"], m["forwards"]),
            tau_needed=_ratio(m["new_tokens"] * step, flat_room),
        )
        if "curve_steps" in m:
            out[method]["on_curve"] = _ratio(ar["wall_s"], m["prefill_s"] + other + m["curve_steps"] * step)
    return out


def table(rows: dict[str, dict[str, float]], goal: float) -> str:
    header = ["method", "speedup", "ceiling (prefill only)", "decode speedup", f"needed for {goal:g}x",
              "flat curve", "τ", f"τ needed for {goal:g}x, flat"]
    curve = all("on_curve" in r for r in rows.values())
    cells = []
    for method, r in rows.items():
        cells.append([method, f"{r['speedup']:.2f}x", f"{r['ceiling']:.2f}x", f"{r['decode_speedup']:.2f}x",
                      f"{r['needed_decode']:.2f}x", f"{r['flat']:.2f}x", f"{r['tau']:.2f}", f"{r['tau_needed']:.2f}"]
                     + ([f"{r['on_curve']:.2f}x"] if curve else []))
    return markdown(header + (["on the curve"] if curve else []), cells)


def main() -> None:
    p = run_parser(__doc__, "an `oilbird bench --out` directory with an `ar` row")
    p.add_argument("--goal", type=float, default=2.0, help="the speedup against `ar` asked for")
    p.add_argument("--curve", default=None, metavar="N:T,...",
                   help="also price each forward of n nodes at this curve's t(n) one-token forwards "
                        "(e.g. issue 15's goals: 8:1.3,16:1.6,64:3.5)")
    args = p.parse_args()
    if args.goal <= 1:
        p.error(f"--goal must be above 1 (a speedup against `ar`), got {args.goal}")
    try:
        curve = parse_curve(args.curve) if args.curve else None
    except ValueError as err:
        p.error(f"--curve: {err}")
    sums = totals(load(p, args.run), curve)
    if "ar" not in sums:
        p.error(f"{args.run} has no `ar` row: run `oilbird bench` with it (it is always measured unless left out)")
    print(table(bounds(sums, args.goal), args.goal))


if __name__ == "__main__":
    main()
