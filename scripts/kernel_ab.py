"""Our GEMM kernel against another version of its sources, alternated in one process.

The host's speed drifts by up to a third within an hour, so two kernel versions are compared
only inside one process, call by call: this script builds `src/oilbird/csrc` (this checkout's
kernels, "ours") and the same translation units from `--variant DIR` (e.g. an older commit's
sources: `git worktree add /tmp/old REV`, then `--variant /tmp/old/src/oilbird/csrc`), checks that
both compute the same bits, and times a whole forward's worth of the model's linear layers
(every decoder layer's, in order, weights read from memory as in decoding; `--part int8-head`:
the int8 LM head's logits over the model's own Q8_0 blocks instead) for each row count,
the two versions alternated and their order reversed every other round, fastest of `--repeats`.
The floor column is the larger of the one-row time (the weights' bytes) and the multiply-adds at
`--peak` G/s (float32's; for `--part int8-head` only the one-row part is a floor).

Usage:
  .venv/bin/python scripts/kernel_ab.py --variant /tmp/old/src/oilbird/csrc --threads 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from oilbird.int8_head import q8_0_blocks
from oilbird.models import load_model
from oilbird.skinny_gemm import CSRC, SOURCES, _ninja_on_path, flags
from forward_cost import row_counts  # scripts/ is on sys.path


def build(csrc: Path, name: str, build_root: Path):
    """The kernels module compiled from the translation units in `csrc` (headers beside them)."""
    out = build_root / name
    out.mkdir(parents=True, exist_ok=True)
    with _ninja_on_path():
        return load(name=name, sources=[str(csrc / p.name) for p in SOURCES], extra_cflags=flags(),
                    extra_ldflags=["-fopenmp"], build_directory=str(out), verbose=False)


def linear_shapes(model) -> list[tuple[int, int]]:
    """(out, in) of every linear layer of the decoder, in forward order (the LM head apart)."""
    return [(m.out_features, m.in_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and "lm_head" not in name]


def linear_workload(mods: dict, model_name: str, rows: list[int]):
    """Every decoder linear layer in forward order: (run(mod, m), multiply-adds per row, label)."""
    shapes = linear_shapes(load_model(model_name).model)
    g = torch.Generator().manual_seed(0)
    packed = [mods["ours"].pack(torch.randn(n, k, generator=g)) for n, k in shapes]  # same layout in both
    xs = {(m, k): torch.randn(m, k, generator=g) for m in rows for k in {k for _, k in shapes}}
    for m in rows:  # the same bits, or the comparison means nothing
        for (n, k), w in zip(shapes[:7], packed[:7]):
            a, b = (mods[v].linear(xs[m, k], w, None) for v in ("ours", "variant"))
            if not torch.equal(a, b):
                raise SystemExit(f"the variant computes other bits at {m} rows, shape {n}x{k}")

    def run(mod, m: int) -> None:
        for (n, k), w in zip(shapes, packed):
            mod.linear(xs[m, k], w, None)
    macs = sum(n * k for n, k in shapes)
    return run, macs, f"{len(shapes)} linear layers ({macs * 4 / 1e6:.0f} MB float32)"


def int8_head_workload(mods: dict, model_name: str, rows: list[int]):
    """The LM head's approximate logits on int8 dot products (csrc/int8_head.cpp) over the
    model's own Q8_0 blocks: (run(mod, m), multiply-adds per row, label)."""
    head = load_model(model_name).tree_model().get_output_embeddings()
    packed = mods["ours"].pack_int8_head(*q8_0_blocks(head))  # [V/16, K/32, 576]: same layout in both
    g = torch.Generator().manual_seed(0)
    xs = {m: torch.randn(m, head.in_features, generator=g) for m in rows}
    for m in rows:
        a, b = (mods[v].int8_head_logits(xs[m], packed) for v in ("ours", "variant"))
        if not (torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])):
            raise SystemExit(f"the variant computes other bits at {m} rows")
    macs = head.in_features * head.out_features
    return (lambda mod, m: mod.int8_head_logits(xs[m], packed)), macs, f"the int8 LM head ({macs / 1e6:.0f} M weights)"


WORKLOADS = {"layers": linear_workload, "int8-head": int8_head_workload}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--variant", required=True, type=Path, help="a directory with the other version's csrc sources")
    p.add_argument("--model", default="smollm2-135m", help="whose linear shapes to time")
    p.add_argument("--part", default="layers", choices=sorted(WORKLOADS),
                   help="the decoder's linear layers (float32 kernels) or the int8 LM head")
    p.add_argument("--rows", default="1,2,4,8,12,16,24,64", type=row_counts, help="comma-separated row counts")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--peak", type=float, default=112.8, help="the cores' float32 multiply-adds, G/s")
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/oilbird-kernel-ab"))
    args = p.parse_args()
    rows = args.rows
    if not (args.variant / SOURCES[0].name).is_file():
        p.error(f"--variant {args.variant} holds no {SOURCES[0].name}: pass a csrc directory")
    torch.set_num_threads(args.threads)
    mods = {"ours": build(CSRC, "kernel_ab_ours", args.build_dir),
            "variant": build(args.variant, "kernel_ab_variant", args.build_dir)}
    run, macs, label = WORKLOADS[args.part](mods, args.model, rows)

    def timed(mod, m: int) -> float:
        start = time.perf_counter()
        run(mod, m)
        return time.perf_counter() - start

    best: dict[tuple[str, int], float] = {}
    for r in range(args.repeats):
        for m in rows:
            for v in (("ours", "variant") if r % 2 == 0 else ("variant", "ours")):
                best[v, m] = min(best.get((v, m), float("inf")), timed(mods[v], m))
    print(f"{label}, {args.threads} threads, fastest of {args.repeats}, ms (x its one-row time)")
    print("| rows | ours | variant | floor |\n| ---: | ---: | ---: | ---: |")
    for m in rows:
        cells = [f"{best[v, m] * 1e3:.2f} ({best[v, m] / best[v, rows[0]]:.2f})" for v in ("ours", "variant")]
        floor = max(min(best["ours", rows[0]], best["variant", rows[0]]), m * macs / args.peak / 1e9)
        print(f"| {m} | {cells[0]} | {cells[1]} | {floor * 1e3:.2f} |")


if __name__ == "__main__":
    main()
