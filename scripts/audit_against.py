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

from oilbird.audit import Reference, compare


def records(run: Path) -> list[dict]:
    path = run / "records.jsonl"
    if not path.is_file():
        sys.exit(f"{path}: no such file (give the --out folder of an `oilbird bench` run)")
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("reference", type=Path)
    args = parser.parse_args(argv)
    # The records keep generate()'s ids but not its logit margins: a divergence prints without one.
    want = {r["request_id"]: Reference(r["output_ids"], margins=[], wall_s=r["wall_s"])
            for r in records(args.reference) if r["method"] == "hf-greedy"}
    rows: dict[str, list] = defaultdict(lambda: [0, 0, []])  # method -> [identical, total, divergences]
    for r in records(args.run):
        if r["method"] == "hf-greedy":
            continue
        if r["request_id"] not in want:
            print(f"{r['request_id']}: no hf-greedy output in {args.reference}", file=sys.stderr)
            return 2
        audit, row = compare(r["output_ids"], want[r["request_id"]]), rows[r["method"]]
        row[0] += audit.lossless
        row[1] += 1
        if not audit.lossless:
            row[2].append(f"{r['request_id']}@{audit.divergence}")
    for method, (same, total, diverged) in rows.items():
        print(f"{method}: {same}/{total} identical to generate()" + (f"; diverged: {', '.join(diverged)}" if diverged else ""))
    return 0 if all(same == total for same, total, _ in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
