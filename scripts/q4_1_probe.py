"""How fast could a forward read the default model's own 4-bit weights? A measurement probe.

SmolLM2's GGUF (the default model) stores every decoder linear layer as Q4_1 blocks (0.625
bytes a weight; 4 bits and a float16 scale and minimum per 32), and the engine runs them as the
float32 copy transformers dequantizes (4 bytes a weight). A one-token forward is bound by
reading those bytes (docs/RESULTS.md, issue 15). `scripts/q4_1_probe.cpp` is a few-row GEMM that
rebuilds each weight from its block in registers, exactly, and multiplies in the fp32 kernel's
order. This script builds it, checks on random Q4_1 weights of the model's shapes that its
output is bit-identical to our fp32 kernel's on the dequantized weights, and times a whole
forward's worth of linear layers (30 layers, weights from memory) on both, alternated in this
one process, fastest of `--repeats`. It is not wired into the engine. First it checks the
premise on the model itself: every decoder linear weight of the loaded float32 model is, bit for
bit, fl(d * q + m) of the GGUF's blocks (the query and key projections up to the order of their
rows, which the loader permutes for rotary embeddings).

Usage:
  .venv/bin/python scripts/q4_1_probe.py --threads 2
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch.utils.cpp_extension import load

from oilbird.skinny_gemm import _ninja_on_path, isa, kernels, skinny_available

ROWS = (1, 2, 4, 8, 12, 16)  # the row counts the probe's kernel is instantiated for
SHAPES = [(576, 576), (192, 576), (192, 576), (576, 576), (1536, 576), (1536, 576), (576, 1536)]  # SmolLM2: q k v o gate up down


def random_q4_1(n: int, k: int, g: torch.Generator):
    """Random Q4_1 blocks of an [n, k] weight: q [n, k] uint8 0..15; d, m [n, k/32] float16 values
    held in float32; and the float32 weight transformers' loader would make of them."""
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.01).half().float()
    m = (-torch.rand(n, k // 32, generator=g) * 0.08).half().float()
    weight = d.repeat_interleave(32, 1) * q.float() + m.repeat_interleave(32, 1)  # [n, k]: d * q exact, one rounding
    return q, d, m, weight


def dequantize_q4_1(raw) -> torch.Tensor:
    """A GGUF Q4_1 tensor's bytes [rows, blocks * 20] -> its float32 weight [rows, blocks * 32], as
    transformers' loader computes it: d * q + m in float32 (d * q exact, one rounding)."""
    import numpy as np

    blocks = np.asarray(raw).reshape(raw.shape[0], -1, 20)  # per block: d f16, m f16, 16 bytes of nibbles
    d = torch.from_numpy(blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32))  # [rows, groups, 1]
    m = torch.from_numpy(blocks[:, :, 2:4].copy().view(np.float16).astype(np.float32))
    nibbles = blocks[:, :, 4:]
    q = torch.from_numpy(np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2).astype(np.float32))  # low nibbles first
    return (d * q + m).reshape(raw.shape[0], -1)


def check_model_weights(spec: str) -> str:
    """How the loaded model's decoder weights compare with fl(d * q + m) of its GGUF's Q4_1 blocks."""
    import numpy as np
    from gguf import GGUFReader

    from oilbird.model_fetch import default_cache_dir, resolve_gguf
    from oilbird.models import load_model

    model = load_model(spec).model
    tensors = {t.name: t for t in GGUFReader(resolve_gguf(spec, default_cache_dir(), lambda _: None)[0]).tensors}
    names = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
             "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
             "ffn_down": "mlp.down_proj"}
    equal = permuted = other = 0
    for i, layer in enumerate(model.model.layers):
        for gguf_name, module_name in names.items():
            tensor = tensors[f"blk.{i}.{gguf_name}.weight"]
            if tensor.tensor_type.name != "Q4_1":
                other += 1
                continue
            ours = dequantize_q4_1(tensor.data)  # [out, in]
            weight = layer.get_submodule(module_name).weight.detach()
            if torch.equal(ours, weight):
                equal += 1
            elif sorted(map(tuple, ours.view(torch.int32).tolist())) == sorted(map(tuple, weight.view(torch.int32).tolist())):
                permuted += 1  # the same rows (bit for bit) in another order
            else:
                raise SystemExit(f"layer {i} {module_name}: the float32 weight is not fl(d * q + m) of its blocks")
    head = tensors["token_embd.weight"]  # tied: the LM head too
    head_note = f"the LM head is {head.tensor_type.name}"
    if head.tensor_type.name == "Q8_0":  # per 32: d float16, 32 int8 q; w = d * q, exact in float32
        blocks = np.asarray(head.data).reshape(head.data.shape[0], -1, 34)
        d = blocks[:, :, 0:2].copy().view(np.float16).astype(np.float32)
        q = blocks[:, :, 2:].copy().view(np.int8).astype(np.float32)
        exact = torch.equal(torch.from_numpy(d * q).reshape(head.data.shape[0], -1),
                            model.get_output_embeddings().weight.detach())
        head_note += f", {'bit-equal' if exact else 'NOT equal'} to fl(d * q) of its blocks"
    return (f"{spec}: {equal} decoder weights bit-equal to fl(d * q + m) of their Q4_1 blocks, {permuted} "
            f"the same rows permuted (query/key), {other} not Q4_1; {head_note}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--layers", type=int, default=30, help="decoder layers' worth of weights (SmolLM2: 30)")
    p.add_argument("--build-dir", type=Path, default=Path("/tmp/oilbird-q4-1-probe"))
    p.add_argument("--model", default="smollm2-135m", help="whose GGUF blocks to check against its float32 weights")
    args = p.parse_args()
    if isa() not in ("AVX512", "AMX") or not skinny_available()[0]:
        raise SystemExit("the probe needs an AVX-512 CPU and our kernels (oilbird.skinny_gemm)")
    torch.set_num_threads(args.threads)
    print(check_model_weights(args.model))
    args.build_dir.mkdir(parents=True, exist_ok=True)
    with _ninja_on_path():
        q4 = load(name="q4_1_probe", sources=[str(Path(__file__).with_suffix(".cpp"))],
                  extra_cflags=["-O3", "-mavx512f", "-mavx512bw", "-mavx2", "-mfma", "-fopenmp"],
                  extra_ldflags=["-fopenmp"], build_directory=str(args.build_dir), verbose=False)
    fp32 = kernels()
    g = torch.Generator().manual_seed(0)
    layers = []
    for _ in range(args.layers):
        packed = []
        for n, k in SHAPES:
            q, d, m, weight = random_q4_1(n, k, g)
            packed.append((q4.pack_q4(q, d, m), fp32.pack(weight)))
        layers.append(packed)
    xs = {(r, k): torch.randn(r, k, generator=g) for r in ROWS for k in {k for _, k in SHAPES}}
    for r in ROWS:
        for (n, k), (pq, pf) in zip(SHAPES, layers[0]):
            if not torch.equal(q4.linear_q4(xs[r, k], pq), fp32.linear(xs[r, k], pf, None)):
                raise SystemExit(f"the probe's output differs from the fp32 kernel's at {r} rows, {n}x{k}")
    print(f"bit-identical to the fp32 kernel on the dequantized weights at rows {ROWS}")

    def forward(which: str, r: int) -> float:
        start = time.perf_counter()
        for packed in layers:
            for (n, k), (pq, pf) in zip(SHAPES, packed):
                q4.linear_q4(xs[r, k], pq) if which == "q4_1" else fp32.linear(xs[r, k], pf, None)
        return time.perf_counter() - start

    best: dict[tuple[str, int], float] = {}
    for i in range(args.repeats):
        for r in ROWS:
            for which in (("q4_1", "fp32") if i % 2 == 0 else ("fp32", "q4_1")):
                best[which, r] = min(best.get((which, r), float("inf")), forward(which, r))
    weights = args.layers * sum(n * k for n, k in SHAPES)
    print(f"{args.layers} layers' linear weights: {weights * 4 / 1e6:.0f} MB float32, {weights * 0.75 / 1e6:.0f} MB "
          f"as the probe packs Q4_1; {args.threads} threads, fastest of {args.repeats}")
    print("| rows | fp32 kernel ms | Q4_1 probe ms | ratio |\n| ---: | ---: | ---: | ---: |")
    for r in ROWS:
        print(f"| {r} | {best['fp32', r] * 1e3:.2f} | {best['q4_1', r] * 1e3:.2f} | {best['q4_1', r] / best['fp32', r]:.2f} |")


if __name__ == "__main__":
    main()
