"""A prefill over a reused cached prefix: the skinny kernel's causal mode against its masked path.

Requests of one stream share long prefixes (the system prompt and tool list of API-Bank), and
the engine prefills only what follows the longest prefix it still holds (oilbird/prefix_cache.py).
transformers' SDPA mask builder gives such a prefill an [N, S] causal mask, which sends it to the
skinny kernel's masked path; `oilbird.tree_attention.prefix_causal_mask` leaves the mask out, and
the kernel runs its causal mode (it skips the keys a tile of rows cannot see) while one head's
keys and values fit `CAUSAL_MAX_KV_BYTES`. This script times them on the make-bench requests
(API-Bank, `--per-category` per file, stream order), each prefilled over its predecessor's shared
prefix, on one model whose skinny attention runs under each mask builder in turn (the order
reversed every other request), fastest of `--repeats`: ours (the causal mode) and SDPA's builder
(the masked path). Each request's line gives the two times in that order; the table sums them,
and the last line is the largest next-token logit difference.

Usage:
  .venv/bin/python scripts/prefix_prefill_cost.py --threads 2
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from oilbird.bench import encode_requests
from oilbird.datasets import load_dataset
from oilbird.models import load_model
from oilbird.prefix_cache import PrefixCacheConfig, common_prefix
from oilbird.tree import DraftTree
from oilbird.tree_attention import SKINNY_ATTENTION, prefix_causal_mask
from oilbird.verifier import CachedPrefix, TreeVerifier


@contextlib.contextmanager
def mask_builder(builder):
    """Run the skinny attention under `builder` as its mask builder, then restore ours."""
    AttentionMaskInterface.register(SKINNY_ATTENTION, builder)
    try:
        yield
    finally:
        AttentionMaskInterface.register(SKINNY_ATTENTION, prefix_causal_mask)


def timed_prefill(verifier: TreeVerifier, prompt: list[int], past_prompt: list[int], shared: int,
                  repeats: int) -> tuple[float, torch.Tensor]:
    """(fastest seconds, next-token logits) of prefilling `prompt` over `shared` rows of `past_prompt`'s."""
    best, state = float("inf"), None
    for _ in range(repeats):
        old = verifier.prefill(past_prompt)  # anew each time: a reuse takes over the old cache
        start = time.perf_counter()
        state = verifier.prefill(prompt, CachedPrefix(old.cache, shared))
        best = min(best, time.perf_counter() - start)
    return best, verifier.verify(state, DraftTree.root(state.anchor)).topk_logits[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=5)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model)
    prompts = encode_requests(loaded, load_dataset("api-bank", limit=args.limit, per_category=args.per_category))
    verifier = TreeVerifier(loaded.tree_model(), loaded.stop_ids)
    if verifier.model.config._attn_implementation != SKINNY_ATTENTION:
        raise SystemExit("the skinny attention kernel does not run here; nothing to compare")
    builders = {"causal mode (prefix_causal_mask, the default)": prefix_causal_mask,
                "masked path (sdpa_mask)": sdpa_mask}
    total = dict.fromkeys(builders, 0.0)
    rows, worst, count = 0, 0.0, 0
    for i in range(1, len(prompts)):
        shared = common_prefix(prompts[i - 1][:-1], prompts[i][:-1])
        if shared < PrefixCacheConfig().min_match:
            continue  # the engine would prefill it whole
        logits, ms = [], []
        order = list(builders) if i % 2 else list(builders)[::-1]  # who goes first alternates
        for name in order:
            with mask_builder(builders[name]):
                seconds, next_logits = timed_prefill(verifier, prompts[i], prompts[i - 1], shared, args.repeats)
            total[name] += seconds
            logits.append(next_logits)
            ms.append(seconds * 1e3)
        ms = [ms[order.index(name)] for name in builders]
        rows, count = rows + len(prompts[i]) - 1 - shared, count + 1
        worst = max(worst, max((x - logits[0]).abs().max().item() for x in logits))
        print(f"request {i}: {len(prompts[i]) - 1 - shared} rows over {shared} cached: "
              + " / ".join(f"{t:.1f}" for t in ms) + " ms", flush=True)
    print(f"\n{count} prefills over a cached prefix, {rows} rows, {args.threads} threads, "
          f"fastest of {args.repeats}")
    print("| mask builder | seconds | ms per prefilled row | x the default |\n| --- | ---: | ---: | ---: |")
    default = next(iter(total.values()))
    for name, seconds in total.items():
        print(f"| {name} | {seconds:.3f} | {seconds / rows * 1e3:.3f} | {seconds / default:.3f} |")
    print(f"\nlargest next-token logit difference between the builders: {worst:.2e}")

if __name__ == "__main__":
    main()
