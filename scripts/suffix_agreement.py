"""Where our SuffixDecoding and the official one (arctic-inference) draft different trees.

Replays real traffic without the model: each request's prompt, then its recorded greedy output one
token at a time, through both drafters at the same budget. At every step both propose a tree;
the script counts identical trees and classifies the others (and whether the two trees carry
the same multiset of scores, i.e. they differ only in how equal scores were ordered):
  - "same nodes, other order": the same (path -> token) set, added in another order (ties),
  - "same first-level, other subtree": the trees differ below equally scored siblings,
  - "other": anything else (printed, with both trees, for the first few).

Usage: .venv/bin/python scripts/suffix_agreement.py RUN_DIR [--budget 60] [--show 3]
  RUN_DIR: an `oilbird bench` output whose records hold the requests' greedy outputs (hf-greedy).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import torch

from oilbird.bench import encode_request
from oilbird.datasets import load_dataset
from oilbird.drafters import make_drafter
from oilbird.models import load_model
from oilbird.verifier import Verification


def paths(tree) -> dict[tuple[int, ...], float]:
    """Every node as the token path from the root, with its score."""
    out = {}
    for i in range(1, len(tree)):
        out[tuple(tree.tokens[j] for j in tree.path_to(i))] = tree.scores[i]
    return out


def commit(drafter, request_id: str, tree, token: int) -> None:
    z = torch.zeros(len(tree), 1, dtype=torch.long)
    drafter.observe(request_id, Verification(tree=tree, prefix_len=0, argmax=z[:, 0], topk_ids=z,
                                 topk_logits=z.float(), path=[], committed=[token],
                                 finished=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir")
    parser.add_argument("--budget", type=int, default=60)
    parser.add_argument("--show", type=int, default=3, help="print this many differing trees")
    parser.add_argument("--only-score-differences", action="store_true",
                        help="print only differing trees whose scores differ (not mere ties)")
    args = parser.parse_args()
    run = Path(args.run_dir)
    summary = json.loads((run / "summary.json").read_text())
    config = summary["config"]
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    outputs = {r["request_id"]: r["output_ids"] for r in records if r["method"] == "hf-greedy"}
    loaded = load_model(summary["model"]["name"])
    requests = [r for r in load_dataset(config["dataset"], limit=config["limit"],
                                        per_category=config["per_category"] or None)
                if r.id in outputs]
    ours, ref = make_drafter("suffix"), make_drafter("suffix-ref")
    kinds, ties, shown = Counter(), Counter(), 0
    for request in requests:
        ids = encode_request(loaded, request)
        for d in (ours, ref):
            d.start_request(request.id, ids, config["dataset"])
        for token in outputs[request.id]:
            a, b = ours.propose(request.id, args.budget), ref.propose(request.id, args.budget)
            if (a.tokens, a.parents) == (b.tokens, b.parents):
                kinds["identical"] += 1
            else:
                pa, pb = paths(a), paths(b)
                same_scores = sorted(round(v, 6) for v in pa.values()) == sorted(round(v, 6) for v in pb.values())
                ties["only the order of equal scores differs" if same_scores else "the scores differ"] += 1
                if set(pa) == set(pb):
                    kinds["same nodes, other order"] += 1
                elif {p for p in pa if len(p) == 1} == {p for p in pb if len(p) == 1}:
                    kinds["same first level, other subtree"] += 1
                else:
                    kinds["other"] += 1
                if shown < args.show and (not same_scores or not args.only_score_differences):
                    shown += 1
                    only_a = sorted(set(pa) - set(pb), key=len)[:6]
                    only_b = sorted(set(pb) - set(pa), key=len)[:6]
                    print(f"{request.id}: ours {len(a)} nodes, ref {len(b)} nodes")
                    print("  only ours:", [(p, round(pa[p], 3)) for p in only_a])
                    print("  only ref: ", [(p, round(pb[p], 3)) for p in only_b])
            commit(ours, request.id, a, token)
            commit(ref, request.id, b, token)
        for d in (ours, ref):
            d.stop_request(request.id)
    total = sum(kinds.values())
    print(f"\n{total} proposals at budget {args.budget} over {len(requests)} requests:")
    for kind, n in kinds.most_common():
        print(f"  {kind}: {n} ({100 * n / total:.1f}%)")
    print("of the differing ones:")
    for kind, n in ties.most_common():
        print(f"  {kind}: {n}")


if __name__ == "__main__":
    main()
