"""Which kernels make a tree forward cheap: the measurement behind oilbird/kernels.py's defaults.

Two tables, both measured in this one process, side by side:

1. GEMM alone: milliseconds of each linear shape of the model for 1..64 rows, with PyTorch's
   default (`F.linear`, MKL on x86), with oneDNN on pre-packed weights (`PackedLinear`) and with
   our skinny AVX-512 kernel (`SkinnyLinear`, where it builds).
   Each timing cycles through `--copies` distinct weight matrices, so the weights come from
   memory as in a real forward instead of staying in the cache.
2. The verifier's forward (`TreeVerifier.verify`, the call decoding makes) over a chain of N
   nodes on a cache of `--prefix` tokens, for each kernel set: PyTorch's (`default/sdpa`), oneDNN
   with tree attention on PyTorch's SDPA (the default before our kernels), our skinny GEMM with
   the same attention, and both our kernels (the default where they build). Ratios are against the one-node forward of the same
   row, i.e. the autoregressive step decoding pays.

Usage:
  .venv/bin/python scripts/forward_cost.py --threads 2                       # SmolLM2, cache 512
  .venv/bin/python scripts/forward_cost.py --model qwen2.5-coder-0.5b --prefix 2048 --threads 2
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from oilbird.cost_curve import measure_cost_curve
from oilbird.kernels import ForwardConfig, PackedLinear, describe_kernels
from oilbird.skinny_gemm import SkinnyLinear, skinny_available
from oilbird.models import load_model
from oilbird.verifier import TreeVerifier

ROWS = (1, 2, 4, 8, 16, 32, 64)
KERNELS = {"default/sdpa": ForwardConfig(gemm="default", attention="sdpa"),
           "onednn/tree": ForwardConfig(gemm="onednn", attention="tree"),
           "skinny/tree": ForwardConfig(gemm="skinny", attention="tree"),
           "skinny/skinny": ForwardConfig(gemm="skinny", attention="skinny")}


def fastest(fn, repeats: int) -> float:
    """Seconds of the fastest of `repeats` calls after one warm-up call."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


@torch.inference_mode()
def gemm_table(model, copies: int, repeats: int, rows_list=ROWS) -> dict:
    """ms per linear shape and row count: default, oneDNN-packed and skinny (None where it cannot build)."""
    shapes = sorted({(m.in_features, m.out_features) for m in model.modules()
                     if isinstance(m, torch.nn.Linear)}, key=lambda s: -s[0] * s[1])
    table = {}
    for inp, out in shapes:
        linears = [torch.nn.Linear(inp, out, bias=False) for _ in range(copies)]
        packed = [PackedLinear(lin) for lin in linears]
        skinny = [SkinnyLinear(lin) for lin in linears] if skinny_available()[0] else None
        for rows in rows_list:
            x = torch.randn(rows, inp)
            default = fastest(lambda: [lin(x) for lin in linears], repeats) / copies
            onednn = fastest(lambda: [p(x) for p in packed], repeats) / copies
            ours = fastest(lambda: [s(x) for s in skinny], repeats) / copies if skinny else None
            table[f"{inp}->{out}|{rows}"] = dict(default_ms=1e3 * default, onednn_ms=1e3 * onednn,
                                                 skinny_ms=None if ours is None else 1e3 * ours)
    return table


def forward_curve(loaded, model, prefix: int, repeats: int) -> dict[int, float]:
    """Seconds of one verification forward over a chain of N nodes, per N: the very
    measurement the auto budget uses (`oilbird.cost_curve.measure_cost_curve`)."""
    return measure_cost_curve(TreeVerifier(model, loaded.stop_ids), list(ROWS), prefix, repeats,
                              fit_monotone=False).points  # raw: a kernel's real dips show


def row_counts(text: str) -> list[int]:
    """'1,16,64' -> [1, 16, 64]; argparse reports anything else as a usage error (an argparse
    `type` for every script's comma-separated counts: rows, nodes, prompt lengths)."""
    try:
        rows = [int(r) for r in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated positive integers, got {text!r}") from None
    if any(r < 1 for r in rows):
        raise argparse.ArgumentTypeError(f"counts must be at least 1, got {text!r}")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--prefix", type=int, default=512, help="cached tokens before each probe")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--copies", type=int, default=8, help="distinct weight matrices per GEMM timing")
    p.add_argument("--skip-gemm", action="store_true", help="only the forward table")
    p.add_argument("--skip-forward", action="store_true", help="only the GEMM table")
    p.add_argument("--rows", default=ROWS, type=row_counts,
                   help="comma-separated row counts of the GEMM table (e.g. 1,16,64,256)")
    p.add_argument("--out", default=None, help="write both tables as JSON here")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    loaded = load_model(args.model, log=lambda m: None)
    record = dict(model=args.model, prefix=args.prefix, threads=args.threads, torch=torch.__version__)
    if not args.skip_gemm:
        rows = args.rows
        record["gemm"] = gemm_table(loaded.model, args.copies, args.repeats, rows)
        print(f"GEMM ms per call, {args.threads} threads: default (PyTorch's F.linear) / oneDNN (packed "
              "weights) / skinny (ours)\n")
        print("| shape (in->out) | " + " | ".join(f"{r} rows" for r in rows) + " |")
        print("| --- |" + " ---: |" * len(rows))
        for shape in dict.fromkeys(k.split("|")[0] for k in record["gemm"]):
            cells = [record["gemm"][f"{shape}|{r}"] for r in rows]
            print(f"| {shape} | " + " | ".join(
                f"{c['default_ms']:.3f} / {c['onednn_ms']:.3f} / " + ("–" if c["skinny_ms"] is None else f"{c['skinny_ms']:.3f}")
                for c in cells) + " |")
    if args.skip_forward:
        return save(record, args.out)
    print(f"\nverification forward, ms (x the 1-node forward of the same kernels), cache {args.prefix}, "
          f"{args.threads} threads, {args.model}\n")
    print("| kernels | " + " | ".join(f"N={n}" for n in ROWS) + " |")
    print("| --- |" + " ---: |" * len(ROWS))
    record["forward"] = {}
    for name, config in KERNELS.items():
        if "skinny" in (config.gemm, config.attention) and not skinny_available()[0]:
            print(f"| {name} | unavailable: {skinny_available()[1]} |")
            continue
        model = loaded.tree_model(config)
        assert describe_kernels(model).split("/")[0] == name.split("/")[0]
        curve = forward_curve(loaded, model, args.prefix, args.repeats)
        record["forward"][name] = {str(n): s for n, s in curve.items()}
        print(f"| {name} | " + " | ".join(f"{1e3 * curve[n]:.1f} ({curve[n] / curve[1]:.2f})" for n in ROWS) + " |",
              flush=True)
    save(record, args.out)


def save(record: dict, out: str | None) -> None:
    """Write the tables as JSON to `out`, when given."""
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
