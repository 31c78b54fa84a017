"""How many tokens could any lexical drafter accept on a stream? An oracle over the pool's matches.

A chain drafter that reads continuations from past text (prompt lookup, SAM, SuffixDecoding,
Oilbird's lexical spine) faces two choices per step: which suffix of the text to match, and
which of its earlier occurrences to copy from. This script replays a workload's greedy outputs
(a `scripts/vllm_bench.py` record: every method's outputs are the same) as a chain engine would,
strictly online (the pool holds the earlier requests' prompts and outputs, the context the
request's own committed text), and drafts with several occurrence choices:

  earliest   the first occurrence of the longest matching suffix (what our SAM reads)
  recent     the most recent occurrence of it
  vote       token by token, the continuation most occurrences agree on (SuffixDecoding's
             frequency rule, over the occurrences of the longest match)
  oracle     the occurrence (of any matching suffix length) whose continuation agrees longest
             with the truth: an upper bound for copying from the pool

Each step drafts up to K tokens (no length policy: every draft at full length) and commits the
agreeing prefix plus one token. Printed per choice: steps, draft tokens, accepted, and tokens per
step (tau, the first token of each request included as in vLLM's counting).

Usage (after a scripts/vllm_bench.py run of the same workload):
  .venv/bin/python scripts/lexical_oracle.py --reference out/vllm-bench-stream-seqs1-v5/none.json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

from oilbird.bench import encode_requests
from oilbird.datasets import load_dataset
from oilbird.models import load_model
from workloads import WORKLOADS  # scripts/ is on sys.path

MAX_N = 16  # the longest suffix matched (the index also holds the oracle's 1 + K tokens)
VOTERS = 256  # 'vote' counts the most recent occurrences only
CHOICES = ("earliest", "recent", "vote", "oracle")


class NgramIndex:
    """Every position of a growing corpus, keyed by the n tokens before it, n = 1..max_n."""

    def __init__(self, max_n: int = MAX_N) -> None:
        self.max_n = max_n
        self.tokens: list[int] = []
        self.at: dict[tuple, list[int]] = defaultdict(list)  # n-gram -> positions following it

    def extend(self, tokens: list[int]) -> None:
        for t in tokens:
            self.tokens.append(t)
            end = len(self.tokens)
            for n in range(1, min(self.max_n, end) + 1):
                gram = tuple(self.tokens[end - n:end])
                if -1 in gram:
                    break  # no match crosses a document separator
                self.at[gram].append(end)

    def longest_match(self, text: list[int], before: int) -> list[int]:
        """Positions < `before` that follow the longest suffix of `text` occurring there ([]: none)."""
        for n in range(min(MAX_N, len(text)), 0, -1):
            positions = [p for p in self.at.get(tuple(text[-n:]), ()) if p < before]
            if positions:
                return positions
        return []


def agree(a: list[int], b: list[int]) -> int:
    k = 0
    while k < len(a) and k < len(b) and a[k] == b[k]:
        k += 1
    return k


def oracle_draft(index: NgramIndex, text: list[int], before: int, truth: list[int], k: int) -> list[int]:
    """The longest truth[:j], j <= k, such that the last token, then truth[:j], occurred before:
    any occurrence of any matching suffix agrees at most this far (each one ends with the last
    token). Followed along the last token's occurrences, so chains of any K need no K-gram index."""
    follow = [p for p in index.at.get(tuple(text[-1:]), ()) if p < before]  # positions after the last token
    j = 0
    while j < min(k, len(truth)):
        follow = [p for p in follow if p + j < before and index.tokens[p + j] == truth[j]]
        if not follow:
            break
        j += 1
    return truth[:j]


def draft(choice: str, index: NgramIndex, text: list[int], before: int, truth: list[int], k: int) -> list[int]:
    if choice == "oracle":
        return oracle_draft(index, text, before, truth, k)
    positions = index.longest_match(text, before)
    if not positions:
        return []
    if choice in ("earliest", "recent"):
        p = positions[0] if choice == "earliest" else positions[-1]
        return _cut(index.tokens[p:min(p + k, before)])
    # vote: token by token, the next token most of the (latest VOTERS) occurrences agree on.
    starts, chain = positions[-VOTERS:], []
    while len(chain) < k:
        nexts = Counter(index.tokens[p] for p in starts if p < before and index.tokens[p] != -1)
        if not nexts:
            break
        top = nexts.most_common(1)[0][0]
        chain.append(top)
        starts = [p + 1 for p in starts if p < before and index.tokens[p] == top]
    return chain


def _cut(chain: list[int]) -> list[int]:
    return chain[:chain.index(-1)] if -1 in chain else chain


def replay(choice: str, prompts: list[list[int]], outputs: list[list[int]], k: int,
           prefill_commits: bool = True) -> dict:
    """Serve the outputs again as a chain engine drafting with `choice`, strictly online.

    Args:
        prefill_commits: vLLM's counting (the prefill commits each output's first token, counted
            as a step in tau); False: our engine's, where every output token comes from a step.

    Returns:
        steps, draft_tokens, accepted and tau.
    """
    index = NgramIndex(MAX_N)
    steps = drafted = accepted = 0
    for prompt, out in zip(prompts, outputs):
        start = len(index.tokens)
        index.extend(prompt)
        i = 1 if prefill_commits else 0
        index.extend(out[:i])
        while i < len(out):
            truth = out[i:]
            d = draft(choice, index, index.tokens[start:], len(index.tokens), truth, k)
            a = agree(d, truth)
            steps += 1
            drafted += len(d)
            accepted += a
            index.extend(out[i:i + a + 1])
            i += a + 1
        index.extend([-1])
    tokens = sum(len(o) for o in outputs)
    return dict(choice=choice, steps=steps, draft_tokens=drafted, accepted=accepted,
                tau=tokens / (steps + (len(outputs) if prefill_commits else 0)))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--reference", required=True, help="a scripts/vllm_bench.py method record (its outputs)")
    p.add_argument("--workload", choices=sorted(WORKLOADS), default="stream")
    p.add_argument("--num-spec", type=int, default=8)
    p.add_argument("--choices", default=",".join(CHOICES))
    args = p.parse_args(argv)
    if not Path(args.reference).is_file():
        raise SystemExit(f"lexical_oracle: no record at {args.reference}; run scripts/vllm_bench.py "
                         "first (any method's <method>.json holds the greedy outputs)")
    record = json.loads(Path(args.reference).read_text())
    outputs = [o["output_ids"] for o in record["outputs"]]
    work = WORKLOADS[args.workload]
    requests = load_dataset(work.dataset, per_category=work.per_category, limit=work.limit)[:len(outputs)]
    prompts = encode_requests(load_model(), requests)
    print("| choice | steps | draft tokens | accepted | tau |")
    print("|---|---:|---:|---:|---:|")
    for choice in args.choices.split(","):
        r = replay(choice, prompts, outputs, args.num_spec)
        print(f"| {choice} | {r['steps']} | {r['draft_tokens']} | {r['accepted']} | {r['tau']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
