"""Attention alone: our two tree-attention kernels against PyTorch's SDPA with grouped heads.

The measurement behind which kernel a build runs (csrc/tree_attention.cpp: two-pass on AVX2,
online on AVX-512) and behind giving trees of every size to it: ms per layer call, fastest of `--repeats`, for SmolLM2's and Qwen2.5-0.5B's head
shapes, a chain of N nodes over the cache under an additive float mask. Random tensors: the cost
does not depend on the values. docs/RESULTS.md, issue 15, records its output.

`--prefill 100,300,700` times the prefill's causal attention instead (no cache, no mask): our
two-pass kernel's causal mode against SDPA's `is_causal`.

Usage:
  .venv/bin/python scripts/attention_cost.py --threads 2
  .venv/bin/python scripts/attention_cost.py --threads 2 --prefill 100,300,700
"""

from __future__ import annotations

import argparse
import time

import torch

from oilbird.skinny_gemm import kernels, skinny_available

SHAPES = {"smollm2 (9/3 heads, D 64), cache 512": (9, 3, 64, 512),
          "qwen0.5b (14/2 heads, D 64), cache 2048": (14, 2, 64, 2048)}
NODES = (1, 4, 8, 16, 64)


def fastest_ms(fn, repeats: int) -> float:
    """Milliseconds of the fastest of `repeats` calls after one warm-up call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def prefill_table(lengths: list[int], repeats: int) -> None:
    """Causal attention of a prefill of each length, no cache: ours / SDPA, ms per layer call."""
    print("| model shape | " + " | ".join(f"P={n}" for n in lengths) + " |  (ours causal / SDPA is_causal, ms)")
    print("| --- |" + " ---: |" * len(lengths))
    for name, (hq, hkv, dim, _) in SHAPES.items():
        cells = []
        for n in lengths:
            q = torch.randn(1, hq, n, dim)  # [B, H_q, P, D]
            k, v = torch.randn(2, 1, hkv, n, dim)  # [B, H_kv, P, D] each
            ours = fastest_ms(lambda: kernels().tree_attention(q, k, v, None, dim ** -0.5, causal=True), repeats)
            sdpa = fastest_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).contiguous(), repeats)
            cells.append(f"{ours:.3f} / {sdpa:.3f}")
        print(f"| {name.split(', cache')[0]} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--prefill", default="", help="comma-separated prompt lengths: time causal prefill attention")
    args = p.parse_args()
    ok, why = skinny_available()
    if not ok:
        raise SystemExit(f"our kernels cannot run here: {why}")
    torch.set_num_threads(args.threads)
    if args.prefill:
        try:
            lengths = [int(x) for x in args.prefill.split(",")]
        except ValueError:
            lengths = []
        if not lengths or min(lengths) < 1:
            p.error(f"--prefill takes comma-separated positive lengths, got {args.prefill!r}")
        prefill_table(lengths, args.repeats)
        return
    print("| model shape | " + " | ".join(f"N={n}" for n in NODES) + " |  (two-pass / online / SDPA, ms)")
    print("| --- |" + " ---: |" * len(NODES))
    for name, (hq, hkv, dim, cached) in SHAPES.items():
        cells = []
        for n in NODES:
            s = cached + n
            q = torch.randn(1, hq, n, dim)  # [B, H_q, N, D]
            k, v = torch.randn(2, 1, hkv, s, dim)  # [B, H_kv, S, D] each
            mask = torch.zeros(1, 1, n, s)  # [1, 1, N, S]: the chain's causal part over its own nodes
            mask[..., cached:] = torch.triu(torch.full((n, n), torch.finfo(torch.float32).min), 1)
            two = fastest_ms(lambda: kernels().tree_attention(q, k, v, mask, dim ** -0.5, "two-pass"), args.repeats)
            online = fastest_ms(lambda: kernels().tree_attention(q, k, v, mask, dim ** -0.5, "online"), args.repeats)
            sdpa = fastest_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2).contiguous(), args.repeats)
            cells.append(f"{two:.3f} / {online:.3f} / {sdpa:.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
