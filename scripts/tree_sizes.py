"""How large a run's verified trees were, per method, and what the large ones cost.

From the records of `oilbird bench --out RUN` (`nodes_per_forward`, `forward_s_per_forward`,
`committed_per_forward`): per method, its verification forwards, their mean node count, how many
had at least `--large` nodes, the seconds those took and the seconds of all its forwards, and how
many drafted trees the walk accepted whole (every node accepted: the budget verified less than
the request would have taken). Used for the 'auto' budget's probes (docs/RESULTS.md, issue 15,
stop 55: the old cadence spent over a quarter of its forward time in trees of 32 nodes or more)
and for the 'fit' budget's lock-in (stop 59: half of `oilbird-suffix`'s trees on Qwen accepted
whole).

Usage:
  .venv/bin/python scripts/tree_sizes.py docs/runs/issue15/stop55/auto-share-t2/share-inf
"""

from __future__ import annotations


from run_records import load, markdown, run_parser


def tree_sizes(records: list[dict], large: int) -> dict[str, dict]:
    """Method -> forwards, mean_nodes, large (forwards of >= `large` nodes), large_s, forward_s,
    whole (forwards of two or more nodes whose tree was accepted whole: committed == nodes)."""
    out: dict[str, dict] = {}
    for record in records:
        nodes, seconds = record.get("nodes_per_forward"), record.get("forward_s_per_forward")
        if not nodes or not seconds:  # the generate() reference keeps no forwards
            continue
        row = out.setdefault(record["method"], dict(forwards=0, nodes=0, large=0, large_s=0.0, forward_s=0.0, whole=0))
        committed = record.get("committed_per_forward") or [0] * len(nodes)
        row["whole"] += sum(1 for n, c in zip(nodes, committed) if n > 1 and c == n)  # root + drafts, drafts + bonus
        for n, s in zip(nodes, seconds):
            row["forwards"] += 1
            row["nodes"] += n
            row["forward_s"] += s
            if n >= large:
                row["large"] += 1
                row["large_s"] += s
    for row in out.values():
        row["mean_nodes"] = row.pop("nodes") / row["forwards"]
    return out


def table(sizes: dict[str, dict], large: int) -> str:
    header = ["method", "forwards", "nodes per forward", f"forwards of >= {large} nodes", "their s", "all forward s",
              "trees accepted whole"]
    return markdown(header, [[method, str(r["forwards"]), f"{r['mean_nodes']:.1f}", str(r["large"]),
                              f"{r['large_s']:.1f}", f"{r['forward_s']:.1f}", str(r["whole"])]
                             for method, r in sizes.items()])


def main() -> None:
    p = run_parser(__doc__)
    p.add_argument("--large", type=int, default=32, help="the node count from which a tree counts as large")
    args = p.parse_args()
    print(table(tree_sizes(load(p, args.run), args.large), args.large))


if __name__ == "__main__":
    main()
