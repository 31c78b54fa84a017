"""Audit a bench run made with `--audit false` against the generate() outputs another run recorded.

A long run may skip its own transformers reference (the `hf-greedy` row costs more than any
method on a CPU) when an earlier run of the same model, dataset and requests recorded it: this
script compares every output of every method, token for token, with that run's `hf-greedy`
outputs, request by request, and prints one line per method.

    .venv/bin/python scripts/audit_against.py RUN_DIR REFERENCE_RUN_DIR

Exit status: 0 when every output of every method is identical, 1 otherwise, 2 when a request of
the run has no reference (different requests or no hf-greedy row).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path


def records(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line]


def first_divergence(got: list[int], want: list[int]) -> int | None:
    """The first position where the two differ (a shorter output diverges where it ends)."""
    for i, (a, b) in enumerate(zip(got, want)):
        if a != b:
            return i
    return None if len(got) == len(want) else min(len(got), len(want))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("reference", type=Path)
    args = parser.parse_args(argv)
    want = {r["request_id"]: r["output_ids"] for r in records(args.reference) if r["method"] == "hf-greedy"}
    rows: dict[str, list] = defaultdict(lambda: [0, 0, []])  # method -> [identical, total, divergences]
    for r in records(args.run):
        if r["method"] == "hf-greedy":
            continue
        if r["request_id"] not in want:
            print(f"{r['request_id']}: no hf-greedy output in {args.reference}", file=sys.stderr)
            return 2
        row = rows[r["method"]]
        where = first_divergence(r["output_ids"], want[r["request_id"]])
        row[0] += where is None
        row[1] += 1
        if where is not None:
            row[2].append(f"{r['request_id']}@{where}")
    for method, (same, total, diverged) in rows.items():
        print(f"{method}: {same}/{total} identical to generate()" + (f"; diverged: {', '.join(diverged)}" if diverged else ""))
    return 0 if all(same == total for same, total, _ in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
