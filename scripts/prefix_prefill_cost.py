"""A prefill over a reused cached prefix: the skinny kernel's causal mode against its masked path.

Requests of one stream share long prefixes (the system prompt and tool list of API-Bank), and
the engine prefills only what follows the longest prefix it still holds (oilbird/prefix_cache.py).
transformers' SDPA mask builder gives such a prefill an [N, S] causal mask, which sends it to the
skinny kernel's masked path; `oilbird.tree_attention.prefix_causal_mask` leaves the mask out, and
the kernel runs its causal mode (it skips the keys a tile of rows cannot see) while one head's
keys and values fit `CAUSAL_MAX_KV_BYTES`. This script times both on the make-bench requests
(API-Bank, `--per-category` per file, stream order), each prefilled over its predecessor's shared
prefix, on one model whose skinny attention runs under each mask builder in turn (the order
alternating per request), fastest of `--repeats`. It prints the summed seconds,
ms per prefilled token and the largest difference between the two next-token logits.

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
    total = {"causal mode (prefix_causal_mask)": 0.0, "masked path (sdpa_mask)": 0.0}
    rows, worst = 0, 0.0
    count = 0
    for i in range(1, len(prompts)):
        shared = common_prefix(prompts[i - 1][:-1], prompts[i][:-1])
        if shared < PrefixCacheConfig().min_match:
            continue  # the engine would prefill it whole
        logits, ms = {}, {}
        for which in ((0, 1) if i % 2 else (1, 0)):
            with mask_builder((prefix_causal_mask, sdpa_mask)[which]):
                seconds, logits[which] = timed_prefill(verifier, prompts[i], prompts[i - 1], shared, args.repeats)
            total[list(total)[which]] += seconds
            ms[which] = seconds * 1e3
        rows, count = rows + len(prompts[i]) - 1 - shared, count + 1
        worst = max(worst, (logits[0] - logits[1]).abs().max().item())
        print(f"request {i}: {len(prompts[i])} tokens, {len(prompts[i]) - 1 - shared} prefilled "
              f"over {shared} cached: {ms[0]:.1f} ms causal mode, {ms[1]:.1f} ms masked", flush=True)
    print(f"\n{count} prefills over a cached prefix, {rows} rows, {args.threads} threads, "
          f"fastest of {args.repeats}")
    print("| mask builder | seconds | ms per prefilled row |\n| --- | ---: | ---: |")
    for name, seconds in total.items():
        print(f"| {name} | {seconds:.3f} | {seconds / rows * 1e3:.3f} |")
    first, second = total.values()
    print(f"\nratio masked / causal: {second / first:.3f}; largest next-token logit difference {worst:.2e}")


if __name__ == "__main__":
    main()
