"""What did FLy change? Per request, where a lossy method's output left greedy decoding, and how.

Reads an `oilbird bench` run (records.jsonl, and summary.json or --tokenizer for the text) and
prints a Markdown table per lossy (`+fly`) method: the first token where the output differs from
greedy decoding (the audit reference, else `ar`), the positions FLy forgave, whether the graded
answer went from right to wrong (or back), and the text of both outputs around the first
difference. The accuracy numbers in the bench table say how much FLy cost; this says what it did.

Usage: python scripts/fly_changes.py RUN_DIR [--method draft+fly] [--context 12] [--tokenizer DIR]
"""

import argparse
import json
from pathlib import Path

from transformers import AutoTokenizer

from oilbird.tables import read_records


def snippet(tokenizer, ids: list[int], start: int, stop: int) -> str:
    """The text of ids[start:stop] for a Markdown table cell (newlines shown as ⏎, pipes escaped)."""
    text = tokenizer.decode(ids[max(0, start):stop], skip_special_tokens=True)
    return "`" + text.replace("\n", "⏎").replace("|", "\\|").replace("`", "'") + "`"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="an `oilbird bench --out` directory")
    parser.add_argument("--method", help="one lossy method (default: every +fly method of the run)")
    parser.add_argument("--context", type=int, default=12, help="tokens shown before and after the first difference")
    parser.add_argument("--tokenizer", help="tokenizer directory or hub id (default: the run's model source)")
    args = parser.parse_args()

    records = read_records(args.run)
    source = args.tokenizer
    if source is None:
        summary = args.run / "summary.json"
        if not summary.exists():
            raise SystemExit(f"{args.run}: no summary.json (a run still in progress?); pass --tokenizer")
        source = json.loads(summary.read_text())["model"]["source"]
    tokenizer = AutoTokenizer.from_pretrained(source)

    by_request: dict[str, dict[str, dict]] = {}
    for r in records:
        by_request.setdefault(r["request_id"], {})[r["method"]] = r
    lossy = list(dict.fromkeys(r["method"] for r in records if r.get("lossy")))
    methods = [args.method] if args.method else lossy
    for method in methods:
        if method not in lossy:
            raise SystemExit(f"{method!r} is not a lossy method of this run; lossy ones: {', '.join(lossy) or 'none'}")
        print(f"### {method}\n")
        print("| request | first difference | forgiven at | answer (greedy → FLy) | greedy | FLy |")
        print("| --- | ---: | --- | --- | --- | --- |")
        for request, recs in by_request.items():
            if method not in recs:
                continue
            out = recs[method]
            greedy = recs.get("hf-greedy") or recs["ar"]
            first = (out.get("differs") or {}).get("first")
            forgiven = ", ".join(map(str, out.get("forgiven_positions") or [])) or "–"
            grades = {True: "right", False: "wrong", None: "–"}
            answer = f"{grades[recs['ar'].get('correct')]} → {grades[out.get('correct')]}"
            if first is None:
                print(f"| {request} | – (identical) | {forgiven} | {answer} | | |")
                continue
            lo, hi = first - args.context, first + args.context
            print(f"| {request} | {first} | {forgiven} | {answer} | "
                  f"{snippet(tokenizer, greedy['output_ids'], lo, hi)} | {snippet(tokenizer, out['output_ids'], lo, hi)} |")
        print()


if __name__ == "__main__":
    main()
