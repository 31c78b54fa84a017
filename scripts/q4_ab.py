"""Reading the GGUF's own 4-bit weights against their float32 copy: the measurement behind `q4_rows`.

Two verifiers of the same model in this one process, one on our float32 kernel and one reading
every decoder linear layer's Q4_1 blocks at any row count (`ForwardConfig(q4_rows=...)`,
oilbird/gguf_weights.py), time `TreeVerifier.verify` over a chain of N nodes on a cache of
`--prefix` tokens (the forward decoding pays), alternating which goes first, fastest of
`--repeats` rounds per N. Before timing it checks that both give the same logits' top-k and
argmax at every N (they must: the kernels compute the same bits). The row count where the
4-bit side stops being faster is where `q4_rows` should stop.

With `--prefill 100,300,600` it also times a prefill of so many prompt tokens from an empty
cache on both sides (the Q4_1 side then reads its blocks for those row counts too).

With `--bench N` it then serves N API-Bank requests (`--per-category`, stream order) end to end
with each side's own benchmark harness (`oilbird.bench.Harness`: 'fit' budgets on each side's
own cost curve, prefix caches, pools), request by request, alternating which side goes first,
and prints each method's tokens/s on both sides, the ratio with its paired 90% interval, and
whether every output is the same on both sides (it must be).

Usage:
  .venv/bin/python scripts/q4_ab.py --threads 2
  .venv/bin/python scripts/q4_ab.py --threads 1 --sizes 1,2,4,8,16 --out /tmp/q4-ab.json
  .venv/bin/python scripts/q4_ab.py --threads 2 --q4-rows 16 --bench 20 --per-category 5 --methods suffix,oilbird
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from oilbird.cost_curve import probe_tokens
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.models import load_model
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier


def chain_timer(verifier: TreeVerifier, prefix: int):
    """A function n -> (seconds, verification) of one verify over a chain of n nodes, rolled back after."""
    vocab = verifier.model.config.vocab_size
    tokens = probe_tokens(vocab, prefix + 1 + 1024)
    state = verifier.prefill(tokens[: prefix + 1])
    anchor = state.anchor

    def run(n: int):
        tree = DraftTree.chain(anchor, tokens[prefix + 1: prefix + n], "probe")
        start = time.perf_counter()
        result = verifier.verify(state, tree)
        seconds = time.perf_counter() - start
        state.cache.crop(-(state.length - prefix))
        state.length, state.anchor = prefix, anchor
        return seconds, result

    return run


def prefill_ab(loaded, models: dict, sizes: list[int], repeats: int) -> list[dict]:
    """ms of a fresh prefill of n prompt tokens on each side, fastest of `repeats` alternated rounds."""
    verifiers = {name: TreeVerifier(model, loaded.stop_ids) for name, model in models.items()}
    vocab = loaded.model.config.vocab_size
    best = {(name, n): float("inf") for name in models for n in sizes}
    for i in range(repeats):
        for n in sizes:
            for name in (list(models) if i % 2 == 0 else list(reversed(models))):
                start = time.perf_counter()
                verifiers[name].prefill(probe_tokens(vocab, n + 1))
                best[name, n] = min(best[name, n], time.perf_counter() - start)
    print("| prompt tokens | float32 ms | Q4_1 ms | Q4_1 / float32 |\n| ---: | ---: | ---: | ---: |")
    rows = []
    for n in sizes:
        f, q = best["float32", n] * 1e3, best["q4_1", n] * 1e3
        rows.append(dict(prompt=n, float32_ms=f, q4_1_ms=q))
        print(f"| {n} | {f:.1f} | {q:.1f} | {q / f:.2f} |")
    return rows


def bench_ab(loaded, args) -> dict:
    """Serve `args.bench` requests on both sides, request by request; per method the pooled
    tokens/s of each side, the ratio and its interval, and the outputs that differ between sides."""
    from oilbird.accuracy import Grader
    from oilbird.bench import BenchConfig, Harness, encode_requests
    from oilbird.budget import BudgetConfig
    from oilbird.intervals import per_request, ratio_interval
    from oilbird.verifier import VerifierConfig

    config = BenchConfig(dataset="api-bank", per_category=args.per_category, limit=args.bench,
                         max_new_tokens=64, methods=args.methods, budget="fit", audit=False, grade=False)
    sides = {"float32": ForwardConfig(q4_rows=0), "q4_1": ForwardConfig(q4_rows=args.q4_rows)}
    harnesses = {name: Harness(loaded, config, {}, VerifierConfig(), BudgetConfig(mode="auto"), forward)
                 for name, forward in sides.items()}
    requests = config.requests()
    prompts = encode_requests(loaded, requests)
    for harness in harnesses.values():
        harness.warm_up(prompts[: config.warmup])
    records = {name: [] for name in sides}
    for i, (request, ids) in enumerate(zip(requests, prompts)):
        for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
            records[name] += harnesses[name].serve(request, ids, Grader())
        print(f"request {i + 1}/{len(requests)}", end="\r", flush=True)
    result = {}
    for label, _, _ in harnesses["float32"].variants:
        f, q = (per_request(records[name], label) for name in sides)
        rate = {name: sum(t for t, _ in v.values()) / sum(s for _, s in v.values()) for name, v in (("float32", f), ("q4_1", q))}
        outputs = {name: {r["request_id"]: r["output_ids"] for r in records[name] if r["method"] == label} for name in sides}
        differ = sum(outputs["float32"][i] != outputs["q4_1"].get(i) for i in outputs["float32"])
        result[label] = dict(float32_tps=rate["float32"], q4_1_tps=rate["q4_1"], ratio=rate["q4_1"] / rate["float32"],
                             interval=ratio_interval(q, f), differ=differ, requests=len(f))
    print(f"\n{len(requests)} API-Bank requests, 64 new tokens, budget fit, {args.threads} threads, one process; "
          f"q4_rows {args.q4_rows}")
    print("| method | float32 tokens/s | Q4_1 tokens/s | Q4_1 / float32 | 90% interval | vs ar (float32) | vs ar (Q4_1) | outputs that differ |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for label, row in result.items():
        low, high = row["interval"] or (float("nan"), float("nan"))
        vs = {name: row[f"{name}_tps"] / result["ar"][f"{name}_tps"] for name in sides}
        row.update(vs_ar_float32=vs["float32"], vs_ar_q4_1=vs["q4_1"])
        print(f"| {label} | {row['float32_tps']:.1f} | {row['q4_1_tps']:.1f} | {row['ratio']:.2f}x | {low:.2f}–{high:.2f} | "
              f"{vs['float32']:.2f}x | {vs['q4_1']:.2f}x | {row['differ']}/{row['requests']} |")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--sizes", default="1,2,4,6,8,12,16,24,32,48,64")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path)
    p.add_argument("--prefill", default="", help="also time prefills of these prompt lengths, e.g. 100,300,600")
    p.add_argument("--bench", type=int, default=0, help="then serve this many API-Bank requests end to end (0: none)")
    p.add_argument("--per-category", type=int, default=5)
    p.add_argument("--methods", default="suffix,oilbird")
    p.add_argument("--q4-rows", type=int, default=32, help="the Q4_1 side's q4_rows in --bench")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    loaded = load_model(args.model, log=lambda _: None)
    prefills = [int(n) for n in args.prefill.split(",")] if args.prefill else []
    sides = {"float32": ForwardConfig(q4_rows=0), "q4_1": ForwardConfig(q4_rows=max(sizes + prefills))}
    models = {name: loaded.tree_model(config) for name, config in sides.items()}
    kinds = {name: describe_kernels(model) for name, model in models.items()}
    if "q4" not in kinds["q4_1"]:
        raise SystemExit(f"{args.model} has no Q4_1 layers to read here ({kinds['q4_1']})")
    timers = {name: chain_timer(TreeVerifier(model, loaded.stop_ids), args.prefix) for name, model in models.items()}
    for n in sizes:  # same tokens, same bits: the top-k (ids and float32 values) must agree exactly
        a, b = (timers[name](n)[1] for name in sides)
        if not (torch.equal(a.topk_ids, b.topk_ids) and torch.equal(a.topk_logits, b.topk_logits)):
            raise SystemExit(f"the two sides differ at {n} nodes: a kernel is not bit-identical")
    best = {(name, n): float("inf") for name in sides for n in sizes}
    for i in range(args.repeats):
        for n in sizes:
            for name in (list(sides) if i % 2 == 0 else list(reversed(sides))):
                best[name, n] = min(best[name, n], timers[name](n)[0])
    print(f"{args.model}, cache {args.prefix}, {args.threads} threads, fastest of {args.repeats}, one process: "
          f"{kinds['float32']} against {kinds['q4_1']}; top-k equal at every size")
    print("| nodes | float32 ms | Q4_1 ms | Q4_1 / float32 | float32 t(N)/t(1) | Q4_1 t(N)/t(1) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for n in sizes:
        f, q = best["float32", n] * 1e3, best["q4_1", n] * 1e3
        f1, q1 = best["float32", sizes[0]] * 1e3, best["q4_1", sizes[0]] * 1e3
        rows.append(dict(nodes=n, float32_ms=f, q4_1_ms=q))
        print(f"| {n} | {f:.2f} | {q:.2f} | {q / f:.2f} | {f / f1:.2f} | {q / q1:.2f} |")
    prefill = prefill_ab(loaded, models, prefills, args.repeats) if prefills else None
    bench = bench_ab(loaded, args) if args.bench else None
    if args.out:
        args.out.write_text(json.dumps(dict(model=args.model, prefix=args.prefix, threads=args.threads,
                                            repeats=args.repeats, kernels=kinds, rows=rows, prefill=prefill, bench=bench,
                                            q4_rows=args.q4_rows), indent=2) + "\n")


if __name__ == "__main__":
    main()
