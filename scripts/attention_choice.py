"""Whole verification forwards under different tree-attention kernels, alternated in one process.

The per-kernel table of scripts/attention_cost.py times attention alone; this one times what
decoding pays, `TreeVerifier.verify` over a chain of N nodes on a 512-token cache, with the tree
forwards' attention (N > 1) sent to one kernel per choice: `default` (the build's own choice,
csrc/tree_attention.cpp) or a kernel by name (`two-pass`, `lanes`). Choices alternate probe by
probe, so a drifting host slows them alike; the fastest of `--repeats` counts. One-token steps
keep the default. The choice is made by registering a wrapper of our attention function under
its own name through transformers' `AttentionInterface` (the library's extension point), in this
script's process only.

Usage:
  .venv/bin/python scripts/attention_choice.py --threads 2 --choices two-pass,default
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AttentionInterface

from oilbird import tree_attention
from oilbird.cost_curve import probe_tokens
from oilbird.models import load_model
from oilbird.skinny_gemm import kernels, skinny_available
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier
from forward_cost import row_counts  # scripts/ is on sys.path

CHOICES = ("default", "two-pass", "lanes")
"""`default`: the build's own choice (csrc/tree_attention.cpp); the others name a kernel."""


def chooser(state: dict):
    """An attention function that sends masked multi-token forwards to `state['kernel']`."""
    default = tree_attention.skinny_tree_attention

    def attend(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
        if attention_mask is None or query.shape[2] == 1 or state["kernel"] == "default":
            return default(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
        scale = query.shape[-1] ** -0.5 if scaling is None else scaling
        return kernels().tree_attention(query, key, value, attention_mask, scale, state["kernel"]), None

    return attend


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--choices", default="two-pass,default", help="comma-separated: default or a kernel name")
    p.add_argument("--sizes", default="1,4,6,8,11,16,24,64", type=row_counts)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--repeats", type=int, default=15)
    args = p.parse_args()
    ok, why = skinny_available()
    if not ok:
        raise SystemExit(f"our kernels cannot run here: {why}")
    torch.set_num_threads(args.threads)
    choices = args.choices.split(",")
    unknown = [c for c in choices if c not in CHOICES]
    if unknown:
        p.error(f"--choices: unknown {', '.join(map(repr, unknown))}; pick from {', '.join(CHOICES)}")
    sizes = args.sizes
    state = {"kernel": "default"}
    # The wrapper replaces our registration in this process only: the verifier checks the name.
    AttentionInterface.register(tree_attention.SKINNY_ATTENTION, chooser(state))
    loaded = load_model("smollm2-135m")
    verifier = TreeVerifier(loaded.tree_model(), loaded.stop_ids)
    tokens = probe_tokens(verifier.model.config.vocab_size, args.prefix + 1 + max(sizes))
    kv = verifier.prefill(tokens[: args.prefix + 1])
    anchor = kv.anchor

    def probe(n: int) -> float:
        start = time.perf_counter()
        verifier.verify(kv, DraftTree.chain(anchor, tokens[args.prefix + 1: args.prefix + n], "probe"))
        elapsed = time.perf_counter() - start
        kv.cache.crop(-(kv.length - args.prefix))
        kv.length, kv.anchor = args.prefix, anchor
        return elapsed

    best: dict[tuple[str, int], float] = {}
    for _ in range(args.repeats):
        for n in sizes:
            for choice in choices:
                state["kernel"] = choice
                probe(n)  # warm-up of this shape and kernel
                best[choice, n] = min(best.get((choice, n), float("inf")), probe(n))
    print(f"SmolLM2 verify, cache {args.prefix}, {args.threads} threads, fastest of {args.repeats} (alternated)")
    print("| attention | " + " | ".join(f"N={n}" for n in sizes) + " |")
    print("| --- |" + " ---: |" * len(sizes))
    for choice in choices:
        print(f"| {choice}, ms | " + " | ".join(f"{best[choice, n] * 1e3:.1f}" for n in sizes) + " |")
    for choice in choices:
        print(f"| {choice}, x step | " + " | ".join(f"{best[choice, n] / best[choice, 1]:.2f}" for n in sizes) + " |")


if __name__ == "__main__":
    main()
