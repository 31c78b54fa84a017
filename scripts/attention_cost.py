"""Attention alone: our tree-attention kernels against PyTorch's SDPA with grouped heads.

The measurement behind which kernel a build runs (csrc/tree_attention.cpp: two-pass on AVX2;
on AVX-512 two-pass for few query rows, lanes from there) and behind giving trees of every size
to it: ms per layer call, fastest of `--repeats`, for SmolLM2's and Qwen2.5-0.5B's head shapes, a
chain of N nodes over the cache under an additive float mask. Random tensors: the cost does not
depend on the values. docs/RESULTS.md, issue 15, records its output.

`--cold` cycles each timing through enough distinct caches (64 MB or more) that the keys and
values come from memory, as in decoding, where every layer's cache was last read a whole forward
of weights ago; without it the same tensors stay in L2 between calls.

`--prefill 100,300,700` times the prefill's causal attention instead (no cache, no mask): our
kernels' causal mode against SDPA's `is_causal`.

Usage:
  .venv/bin/python scripts/attention_cost.py --threads 2 [--cold]
  .venv/bin/python scripts/attention_cost.py --threads 2 --prefill 100,300,700
"""

from __future__ import annotations

import argparse
import time

import torch

from oilbird.skinny_gemm import kernels, skinny_available
from forward_cost import row_counts  # scripts/ is on sys.path

SHAPES = {"smollm2 (9/3 heads, D 64), cache 512": (9, 3, 64, 512),
          "qwen0.5b (14/2 heads, D 64), cache 2048": (14, 2, 64, 2048)}
NODES = (1, 2, 4, 6, 8, 12, 16, 64)
KERNELS = ("two-pass", "lanes")


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
    """Causal attention of a prefill of each length, no cache: ours (each kernel) / SDPA, ms per layer call."""
    heading = " / ".join(f"{name} causal" for name in KERNELS) + " / SDPA is_causal, ms"
    print("| model shape | " + " | ".join(f"P={n}" for n in lengths) + f" |  ({heading})")
    print("| --- |" + " ---: |" * len(lengths))
    for name, (hq, hkv, dim, _) in SHAPES.items():
        cells = []
        for n in lengths:
            q = torch.randn(1, hq, n, dim)  # [B, H_q, P, D]
            k, v = torch.randn(2, 1, hkv, n, dim)  # [B, H_kv, P, D] each
            ours = [fastest_ms(lambda kernel=kernel: kernels().tree_attention(q, k, v, None, dim ** -0.5, kernel,
                                                                              causal=True), repeats)
                    for kernel in KERNELS]
            sdpa = fastest_ms(lambda: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2).contiguous(), repeats)
            cells.append(" / ".join(f"{ms:.3f}" for ms in [*ours, sdpa]))
        print(f"| {name.split(', cache')[0]} | " + " | ".join(cells) + " |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=30)
    p.add_argument("--prefill", type=row_counts, help="comma-separated prompt lengths: time causal prefill attention")
    p.add_argument("--cold", action="store_true", help="keys and values from memory, not from the cache")
    args = p.parse_args()
    ok, why = skinny_available()
    if not ok:
        raise SystemExit(f"our kernels cannot run here: {why}")
    torch.set_num_threads(args.threads)
    if args.prefill:
        prefill_table(args.prefill, args.repeats)
        return
    heading = " / ".join(KERNELS) + " / SDPA, ms" + (", cache cold" if args.cold else "")
    print("| model shape | " + " | ".join(f"N={n}" for n in NODES) + f" |  ({heading})")
    print("| --- |" + " ---: |" * len(NODES))
    for name, (hq, hkv, dim, cached) in SHAPES.items():
        cells = [" / ".join(f"{ms:.3f}" for ms in node_ms(hq, hkv, dim, cached, n, args)) for n in NODES]
        print(f"| {name} | " + " | ".join(cells) + " |")


def node_ms(hq: int, hkv: int, dim: int, cached: int, n: int, args) -> list[float]:
    """ms per layer call of each kernel of KERNELS and of SDPA, for a chain of n nodes."""
    s = cached + n
    copies = max(1, (64 << 20) // (2 * hkv * s * dim * 4)) if args.cold else 1
    tensors = []
    for _ in range(copies):
        q = torch.randn(1, hq, n, dim)  # [B, H_q, N, D]
        k, v = torch.randn(2, 1, hkv, s, dim)  # [B, H_kv, S, D] each
        tensors.append((q, k, v))
    mask = torch.zeros(1, 1, n, s)  # [1, 1, N, S]: the chain's causal part over its own nodes
    mask[..., cached:] = torch.triu(torch.full((n, n), torch.finfo(torch.float32).min), 1)

    def each(call):  # one call per copy; timed as a whole, reported per call
        return lambda: [call(q, k, v) for q, k, v in tensors]

    runs = [each(lambda q, k, v, name=name: kernels().tree_attention(q, k, v, mask, dim ** -0.5, name))
            for name in KERNELS]
    runs.append(each(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2).contiguous()))
    return [fastest_ms(run, args.repeats) / copies for run in runs]


if __name__ == "__main__":
    main()
