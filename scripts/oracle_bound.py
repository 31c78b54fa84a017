"""How fast could any drafter that copies from the pool make a run, on the run's own cost curve?

`scripts/lexical_oracle.py` counts what chains copied from the pool could accept; this script
prices those chains on the forwards an `oilbird bench --out RUN` run actually paid. From the run's
records:

- the outputs (the `ar` rows': every strict method's are the same) and the prompts (the run's
  dataset, per-category and limit, encoded again with the run's model);
- the cost of a forward of n nodes, t(n) = a + b n, fitted by least squares over every
  verification forward of the run (`nodes_per_forward`, `forward_s_per_forward`, all methods).

Then each choice of `lexical_oracle.py` is replayed strictly online in our engine's counting
(every output token comes from a step), each step priced at t(1 + its draft's length), the
prefill at `ar`'s and the drafter at nothing. 'oracle' drafts exactly the tokens that would be
accepted, the longest run the pool holds: no drafter that copies from the pool accepts more per
step or pays fewer nodes for it. The run's own rows are priced the same way beside them (their
forwards at t(n), plus their measured drafter and bookkeeping time) to show how well the fit
reproduces what they measured.

Usage:
  .venv/bin/python scripts/oracle_bound.py docs/runs/issue15/stop56/make-bench-clone
  .venv/bin/python scripts/oracle_bound.py RUN --num-spec 63 --reference suffix
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lexical_oracle import CHOICES, replay  # scripts/ is on sys.path
from run_records import load, markdown, run_parser

from oilbird.bench import encode_requests
from oilbird.datasets import load_dataset
from oilbird.models import load_model


def fit_cost(records: list[dict]) -> tuple[float, float]:
    """(a, b) of t(n) = a + b n seconds, least squares over every forward the run's records hold.

    Raises:
        ValueError: the records hold forwards of one size only (no slope to fit).
    """
    pairs = [(n, t) for r in records if "nodes_per_forward" in r
             for n, t in zip(r["nodes_per_forward"], r.get("forward_s_per_forward", []))]
    count = len(pairs)
    mean_n = sum(n for n, _ in pairs) / max(count, 1)
    mean_t = sum(t for _, t in pairs) / max(count, 1)
    spread = sum((n - mean_n) ** 2 for n, _ in pairs)
    if spread == 0:
        raise ValueError("the run's forwards all have one size: no cost per node to fit "
                         "(run a method that drafts beside `ar`)")
    b = sum((n - mean_n) * (t - mean_t) for n, t in pairs) / spread
    return mean_t - b * mean_n, b


def method_rows(records: list[dict], a: float, b: float) -> dict[str, dict]:
    """Per method, pooled: the prefill and decode seconds measured, and the decode priced at t(n)."""
    rows: dict[str, dict] = {}
    for r in records:
        if "nodes_per_forward" not in r:
            continue  # hf-greedy and the like: no verification forwards of ours
        row = rows.setdefault(r["method"], dict(prefill=0.0, decode=0.0, priced=0.0, forwards=0,
                                                nodes=0, tokens=0))
        other = r["propose_s"] + r["observe_s"] + r["bookkeeping_s"]
        row["prefill"] += r["prefill_s"]
        row["decode"] += r["forward_s"] + other
        row["priced"] += sum(a + b * n for n in r["nodes_per_forward"]) + other
        row["forwards"] += r["forwards"]
        row["nodes"] += sum(r["nodes_per_forward"])
        row["tokens"] += len(r["output_ids"])
    return rows


def run_requests(run: Path, records: list[dict]) -> tuple[list[list[int]], list[list[int]]]:
    """(prompts, outputs) of the run's `ar` rows, in serving order, prompts encoded again.

    Raises:
        SystemExit: the run has no `ar` rows, or its prompts no longer match its records.
    """
    ar = [r for r in records if r["method"] == "ar"]
    if not ar:
        raise SystemExit(f"oracle_bound: {run} has no `ar` rows (its outputs are the reference)")
    config = json.loads((run / "config.json").read_text())
    summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
    model = load_model((summary.get("model") or {}).get("name", "smollm2-135m"))
    requests = load_dataset(config["dataset"], per_category=config["per_category"], limit=config["limit"],
                            skip=config.get("skip", 0), data_dir=Path(config["data_dir"]) if config.get("data_dir") else None)
    by_id = {q.id: q for q in requests}
    prompts = encode_requests(model, [by_id[r["request_id"]] for r in ar])
    if [len(p) for p in prompts] != [r["prompt_len"] for r in ar]:
        raise SystemExit(f"oracle_bound: the prompts encoded now differ from {run}'s (prompt_len): "
                         "another model, tokenizer or dataset version")
    return prompts, [r["output_ids"] for r in ar]


def table(rows: dict[str, dict], oracle: list[dict], a: float, b: float, reference: str) -> str:
    """The run's rows and the replayed choices: decode, wall and speedups, measured and priced."""
    ar, ref = rows["ar"], rows.get(reference)
    head = ["row", "forwards", "nodes / forward", "τ", "decode s (measured)", "decode s (t(n))",
            "speedup vs ar (t(n))", f"vs {reference} (t(n))"]
    out = []
    ref_wall = ref["prefill"] + ref["priced"] if ref else float("nan")
    for name, row in rows.items():
        out.append([f"`{name}`", str(row["forwards"]), f"{row['nodes'] / row['forwards']:.2f}",
                    f"{row['tokens'] / row['forwards']:.2f}",
                    f"{row['decode']:.1f}", f"{row['priced']:.1f}",
                    f"{(ar['prefill'] + ar['priced']) / (row['prefill'] + row['priced']):.2f}x",
                    f"{ref_wall / (row['prefill'] + row['priced']):.2f}"])
    for r in oracle:
        priced = r["steps"] * a + b * (r["steps"] + r["draft_tokens"])  # each step t(1 + its drafts)
        wall = ar["prefill"] + priced
        ratio = ref_wall / wall
        out.append([f"{r['choice']} (replayed)", str(r["steps"]), f"{1 + r['draft_tokens'] / r['steps']:.2f}",
                    f"{r['tau']:.2f}", "—", f"{priced:.1f}",
                    f"{(ar['prefill'] + ar['priced']) / wall:.2f}x", f"{ratio:.2f}"])
    return markdown(head, out)


def main(argv=None) -> int:
    parser = run_parser(__doc__)
    parser.add_argument("--num-spec", type=int, default=63,
                        help="the longest chain replayed (default 63: a 64-node forward, the curve's widest)")
    parser.add_argument("--reference", default="suffix", help="the row the last column divides by")
    parser.add_argument("--choices", default=",".join(CHOICES))
    args = parser.parse_args(argv)
    records = load(parser, args.run)
    try:
        a, b = fit_cost(records)
    except ValueError as err:
        parser.error(str(err))
    prompts, outputs = run_requests(args.run, records)
    rows = method_rows(records, a, b)
    replays = [replay(c, prompts, outputs, args.num_spec, prefill_commits=False) for c in args.choices.split(",")]
    print(f"{args.run}: {len(outputs)} requests; t(n) = {a * 1e3:.2f} ms + {b * 1e3:.3f} ms x n "
          f"(a node = {b / (a + b):.1%} of a one-token forward); chains of up to {args.num_spec} drafts\n")
    print(table(rows, replays, a, b, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
