"""The kernels over GGUF blocks on one random layer, side by side: the FMA kernel
(csrc/q4_gemm.cpp, `linear_q4`) against the 'int8' kernel's tiles and its dot products
(csrc/amx_blocks.cpp, `linear_amx`) and, where the CPU has AMX-BF16, the 'bf16' kernel's tiles
(csrc/amx_bf16_blocks.cpp, `linear_amx_bf16`), microseconds a call at each row count, fastest of
`--repeats` rounds, the kernels alternating. First it checks that the int8 tiles and dot products
give the same bits, that the bf16 kernel gives each row the bits it gives that row alone, and
prints each kernel's largest error against the exact product of the blocks (relative to
sum |x| |w|). A layer this small stays in the core's L2 cache, so it times the
arithmetic, not the memory stream a model's forward pays (scripts/forward_ab.py times that).

Usage:
  .venv/bin/python scripts/int8_blocks_ab.py --shape N,K --rows 1,2,4,8,16,64 --threads 1
"""

from __future__ import annotations

import argparse
import time

import torch

from oilbird.skinny_gemm import kernels, skinny_available


def best_us(call, repeats: int, calls: int = 100) -> float:
    """Fastest of `repeats` rounds of `calls` calls, in microseconds a call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="1536,576", help="out_features,in_features of the Q4_1 layer")
    parser.add_argument("--rows", default="1,2,3,4,8,16,32,64")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    ok, why = skinny_available()
    if not ok or not kernels().amx_available():
        raise SystemExit(f"the 'int8' kernel cannot run here: {why if not ok else 'no AMX and AVX512-VNNI'}")
    torch.set_num_threads(args.threads)
    n, k = map(int, args.shape.split(","))
    g = torch.Generator().manual_seed(0)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.01 + 0.001).half()
    m = (-8 * d.float() * (1 + 0.1 * torch.rand(n, k // 32, generator=g))).half()
    packed = kernels().pack_q4(q, d, m, 4)
    exact = d.double().repeat_interleave(32, 1) * q.double() + m.double().repeat_interleave(32, 1)  # [n, k]
    rows = [int(r) for r in args.rows.split(",")]
    x = torch.randn(max(rows), k, generator=g) * torch.exp(torch.randn(max(rows), k, generator=g))
    fma, amx = kernels().linear_q4, kernels().linear_amx
    tiles, dots = amx(x, packed, None, False, 8, 0), amx(x, packed, None, False, 8, 1 << 30)
    scale = x.double().abs() @ exact.abs().T
    reference = x.double() @ exact.T
    error = {"int8": tiles, "fma": fma(x, packed, None)}
    bf16 = (lambda xr: kernels().linear_amx_bf16(xr, packed, None, False, 8)) if kernels().amx_bf16_available() else None
    alone = ""
    if bf16:
        error["bf16"] = bf16(x)
        alone = f"; bf16 rows alone == in the whole batch: {all(torch.equal(bf16(x[i:i + 1]), error['bf16'][i:i + 1]) for i in range(len(x)))}"
    print(f"Q4_1 layer {n}x{k}, {args.threads} thread(s), fastest of {args.repeats}: int8 tiles == dot products: "
          f"{torch.equal(tiles, dots)}{alone}; largest error / sum |x||w|: "
          + ", ".join(f"{name} {((y.double() - reference).abs() / scale).max().item():.2e}" for name, y in error.items()))
    print("| rows | fma us | int8 tiles us | int8 dot products us | best int8 / fma |" + (" bf16 tiles us | bf16 / fma |" if bf16 else ""))
    print("| ---: | ---: | ---: | ---: | ---: |" + (" ---: | ---: |" if bf16 else ""))
    for r in rows:
        xr = x[:r].contiguous()
        times = [best_us(lambda: fma(xr, packed, None), args.repeats),
                 best_us(lambda: amx(xr, packed, None, False, 8, 0), args.repeats),
                 best_us(lambda: amx(xr, packed, None, False, 8, 1 << 30), args.repeats)]
        tail = ""
        if bf16:
            t = best_us(lambda: bf16(xr), args.repeats)
            tail = f" {t:.1f} | {t / times[0]:.2f} |"
        print(f"| {r} | {times[0]:.1f} | {times[1]:.1f} | {times[2]:.1f} | {min(times[1:]) / times[0]:.2f} |" + tail)


if __name__ == "__main__":
    main()
