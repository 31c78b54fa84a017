"""Two forward configurations of one model, side by side in one process: which costs less, and does
decoding stay the same.

The host's speed drifts by up to a third within an hour, so two kernel choices are compared only
inside one process, call by call. Two verifiers of the same model, one per `ForwardConfig`
(`--a` and `--b`, e.g. `fused=false` against `fused=true`, or `q4_rows=0` against the default),
time `TreeVerifier.verify` over a chain of N nodes on a cache of `--prefix` tokens (the forward
decoding pays), alternating which goes first, fastest of `--repeats` rounds per N. Before timing
it compares the two sides' top-k at every N: ids and float32 values equal (the same bits), or
ids equal with the largest logit difference printed, or it stops where the argmax differs.

With `--prefill 100,300,600` it also times prefills of so many prompt tokens from an empty cache.

With `--bench N` it then serves N API-Bank requests (`--per-category`, stream order) end to end
with each side's own benchmark harness (`oilbird.bench.Harness`: 'fit' budgets on each side's
own cost curve, prefix caches, pools), request by request, alternating which side goes first,
and prints each method's tokens/s on both sides, the ratio with its paired 90% interval, and how
many outputs differ between the sides.

Usage:
  .venv/bin/python scripts/forward_ab.py --a fused=false --b fused=true --threads 2
  .venv/bin/python scripts/forward_ab.py --a q4_rows=0 --b q4_rows=8192 --prefill 100,400 --out /tmp/ab.json
  .venv/bin/python scripts/forward_ab.py --a fused=false --bench 20 --methods suffix,oilbird
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

import torch

from oilbird.config import parse_bool
from oilbird.cost_curve import probe_tokens
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.models import load_model
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier, VerifierConfig


def forward_config(spec: str) -> ForwardConfig:
    """'field=value,field=value' (ForwardConfig's fields; '' = the defaults) -> the config."""
    return side_config(spec)[0]


def side_config(spec: str) -> tuple[ForwardConfig, VerifierConfig]:
    """'field=value,...' -> (ForwardConfig, VerifierConfig): each field goes to the config that has
    it (e.g. 'fused=false' to the forward's, 'head=int8' to the verifier's; '' = the defaults)."""
    classes = (ForwardConfig, VerifierConfig)
    types = [{f.name: f.type for f in dataclasses.fields(cls)} for cls in classes]
    values: list[dict] = [{}, {}]
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, text = item.partition("=")
        owner = next((i for i, fields in enumerate(types) if name in fields), None)
        if owner is None:
            known = ", ".join([*types[0], *types[1]])
            raise argparse.ArgumentTypeError(f"unknown ForwardConfig or VerifierConfig field {name!r} (one of {known})")
        kind = types[owner][name]
        values[owner][name] = parse_bool(text) if kind in ("bool", bool) else int(text) if kind in ("int", int) else text
    return ForwardConfig(**values[0]), VerifierConfig(**values[1])


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


def compare_sides(timers: dict, sizes: list[int]) -> str:
    """How the sides' top-k agree over all `sizes`: 'bit-identical' or 'ids equal, logits within X';
    raises SystemExit where an argmax differs."""
    worst = 0.0
    for n in sizes:
        a, b = (timer(n)[1] for timer in timers.values())
        if not torch.equal(a.argmax, b.argmax):
            raise SystemExit(f"the two sides' argmax differs at {n} nodes")
        if torch.equal(a.topk_ids, b.topk_ids):
            worst = max(worst, (a.topk_logits - b.topk_logits).abs().max().item())
        else:
            worst = float("inf")
    if worst == 0.0:
        return "top-k bit-identical at every size"
    if worst == float("inf"):
        return "argmax equal at every size, top-k ids differ somewhere"
    return f"top-k ids equal at every size, logits within {worst:.2e}"


def time_sides(timers: dict, sizes: list[int], repeats: int) -> dict:
    """(side, n) -> fastest seconds of `repeats` rounds, the sides alternated and reversed each round."""
    names = list(timers)
    best = {(name, n): float("inf") for name in names for n in sizes}
    for i in range(repeats):
        for n in sizes:
            for name in (names if i % 2 == 0 else names[::-1]):
                best[name, n] = min(best[name, n], timers[name](n)[0])
    return best


def prefill_ab(loaded, models: dict, sizes: list[int], repeats: int, checks: dict) -> list[dict]:
    """ms of a fresh prefill of n prompt tokens on each side, fastest of `repeats` alternated rounds."""
    verifiers = {name: TreeVerifier(model, loaded.stop_ids, checks[name]) for name, model in models.items()}
    vocab = loaded.model.config.vocab_size
    timers = {name: (lambda n, v=v: (_seconds(lambda: v.prefill(probe_tokens(vocab, n + 1))), None))
              for name, v in verifiers.items()}
    best = time_sides(timers, sizes, repeats)
    a, b = list(models)
    print(f"| prompt tokens | {a} ms | {b} ms | {b} / {a} |\n| ---: | ---: | ---: | ---: |")
    rows = []
    for n in sizes:
        x, y = best[a, n] * 1e3, best[b, n] * 1e3
        rows.append(dict(prompt=n, a_ms=x, b_ms=y))
        print(f"| {n} | {x:.1f} | {y:.1f} | {y / x:.2f} |")
    return rows


def _seconds(call) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def serve_alternating(harnesses: dict, config) -> dict[str, list[dict]]:
    """Serve `config`'s requests with each harness (two), request by request, alternating which
    goes first; each side's records."""
    from oilbird.accuracy import Grader
    from oilbird.bench import encode_requests

    requests = config.requests()
    prompts = encode_requests(next(iter(harnesses.values())).loaded, requests)
    for harness in harnesses.values():
        harness.warm_up(prompts[: config.warmup])
    names = list(harnesses)
    records = {name: [] for name in names}
    for i, (request, ids) in enumerate(zip(requests, prompts)):
        for name in (names if i % 2 == 0 else names[::-1]):
            records[name] += harnesses[name].serve(request, ids, Grader())
        print(f"request {i + 1}/{len(requests)}", end="\r", flush=True)
    print()
    return records


def side_rows(records: dict[str, list[dict]], labels: list[str]) -> dict[str, dict]:
    """Per method: each side's pooled tokens/s, forwards and nodes a forward, side b over side a
    with its paired 90% interval, and the outputs that differ between the sides."""
    from oilbird.intervals import per_request, ratio_interval

    a, b = records
    rows = {}
    for label in labels:
        served = {side: per_request(recs, label) for side, recs in records.items()}
        rate = {side: sum(t for t, _ in v.values()) / sum(s for _, s in v.values()) for side, v in served.items()}
        mine = {side: [r for r in recs if r["method"] == label] for side, recs in records.items()}
        forwards = {side: sum(r["forwards"] for r in rs) for side, rs in mine.items()}
        nodes = {side: sum(sum(r["nodes_per_forward"]) for r in rs) / max(1, forwards[side]) for side, rs in mine.items()}
        outputs = {side: {r["request_id"]: r["output_ids"] for r in rs} for side, rs in mine.items()}
        rows[label] = dict(a_tps=rate[a], b_tps=rate[b], ratio=rate[b] / rate[a],
                           interval=ratio_interval(served[b], served[a]), forwards=forwards, nodes=nodes,
                           differ=sum(outputs[a][i] != outputs[b].get(i) for i in outputs[a]),
                           requests=len(outputs[a]))
    return rows


def bench_ab(loaded, sides: dict, args) -> dict:
    """Serve `args.bench` requests on both sides, request by request; per method the pooled
    tokens/s of each side, the ratio and its interval, and the outputs that differ between sides."""
    from oilbird.bench import BenchConfig, Harness
    from oilbird.budget import BudgetConfig

    config = BenchConfig(dataset="api-bank", per_category=args.per_category, limit=args.bench,
                         max_new_tokens=64, methods=args.methods, budget="fit", audit=False, grade=False)
    harnesses = {name: Harness(loaded, config, {}, check, BudgetConfig(mode="auto"), forward)
                 for name, (forward, check) in sides.items()}
    records = serve_alternating(harnesses, config)
    a, b = list(sides)
    result = side_rows(records, [label for label, _, _ in harnesses[a].variants])
    print(f"{args.bench} API-Bank requests, 64 new tokens, budget fit, {args.threads} threads, one process")
    print(f"| method | {a} tokens/s | {b} tokens/s | {b} / {a} | 90% interval | vs ar ({a}) | vs ar ({b}) | outputs that differ |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: |")
    for label, row in result.items():
        low, high = row["interval"] or (float("nan"), float("nan"))
        row.update(vs_ar_a=row["a_tps"] / result["ar"]["a_tps"], vs_ar_b=row["b_tps"] / result["ar"]["b_tps"])
        print(f"| {label} | {row['a_tps']:.1f} | {row['b_tps']:.1f} | {row['ratio']:.2f}x | {low:.2f}–{high:.2f} | "
              f"{row['vs_ar_a']:.2f}x | {row['vs_ar_b']:.2f}x | {row['differ']}/{row['requests']} |")
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--a", default="", type=str,
                   help="side a's ForwardConfig or VerifierConfig fields, e.g. fused=false or head=model ('': defaults)")
    p.add_argument("--b", default="", type=str, help="side b's ForwardConfig or VerifierConfig fields ('': defaults)")
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prefix", type=int, default=512)
    p.add_argument("--sizes", default="1,2,4,8,16,32,64")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--out", type=Path)
    p.add_argument("--prefill", default="", help="also time prefills of these prompt lengths, e.g. 100,300,600")
    p.add_argument("--bench", type=int, default=0, help="then serve this many API-Bank requests end to end (0: none)")
    p.add_argument("--per-category", type=int, default=5)
    p.add_argument("--methods", default="suffix,oilbird")
    args = p.parse_args()
    if args.a == args.b:
        p.error("--a and --b name the same configuration")
    try:  # before the model loads: a typo costs no wait
        sides = {args.a or "default": side_config(args.a), args.b or "default": side_config(args.b)}
    except (argparse.ArgumentTypeError, ValueError) as err:
        p.error(str(err))
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    loaded = load_model(args.model, log=lambda _: None)
    models = {name: loaded.tree_model(forward) for name, (forward, _) in sides.items()}
    checks = {name: check for name, (_, check) in sides.items()}
    verifiers = {name: TreeVerifier(model, loaded.stop_ids, checks[name]) for name, model in models.items()}
    kinds = {name: f"{describe_kernels(model)}, head {verifiers[name].head_kind}" for name, model in models.items()}
    timers = {name: chain_timer(verifier, args.prefix) for name, verifier in verifiers.items()}
    agreement = compare_sides(timers, sizes)
    best = time_sides(timers, sizes, args.repeats)
    a, b = list(sides)
    print(f"{args.model}, cache {args.prefix}, {args.threads} threads, fastest of {args.repeats}, one process: "
          f"a = {a} ({kinds[a]}), b = {b} ({kinds[b]}); {agreement}")
    print(f"| nodes | {a} ms | {b} ms | {b} / {a} | {a} t(N)/t(1) | {b} t(N)/t(1) |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = []
    for n in sizes:
        x, y = best[a, n] * 1e3, best[b, n] * 1e3
        x1, y1 = best[a, sizes[0]] * 1e3, best[b, sizes[0]] * 1e3
        rows.append(dict(nodes=n, a_ms=x, b_ms=y))
        print(f"| {n} | {x:.2f} | {y:.2f} | {y / x:.2f} | {x / x1:.2f} | {y / y1:.2f} |")
    prefills = [int(n) for n in args.prefill.split(",")] if args.prefill else []
    prefill = prefill_ab(loaded, models, prefills, args.repeats, checks) if prefills else None
    bench = bench_ab(loaded, sides, args) if args.bench else None
    if args.out:
        args.out.write_text(json.dumps(dict(model=args.model, prefix=args.prefix, threads=args.threads,
                                            repeats=args.repeats, sides=dict(a=a, b=b), kernels=kinds,
                                            agreement=agreement, rows=rows, prefill=prefill, bench=bench),
                                       indent=2) + "\n")


if __name__ == "__main__":
    main()
