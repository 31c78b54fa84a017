"""Exact cosine search vs the inverted lists (oilbird/semantic_index.py): time and recall by store size.

Measures what `sem_index_min_records` should be, and what the lists cost: for each store size, the
time of one exact search (one pass of our kernel over every key), of one search through the lists
(its first, training, search reported apart), the time to file records into the lists, and the
lists' recall@8 against exact search, and the index's own search with the probed lists' rows
gathered and scored by our kernel (the default) and in PyTorch.

Keys: with `--model` (default), the model's own last hidden states (`sem_layer` -1, what Oilbird
stores) at every prompt token of API-Bank requests, stream order, as the store holds them; queries
are states of later requests, not in the store. With `--model none`, clustered random keys.

Usage:
  .venv/bin/python scripts/retrieval_crossover.py --threads 1 --sizes 10000,32768,100000
  .venv/bin/python scripts/retrieval_crossover.py --model none --sizes 100000,1000000
"""

import argparse
import json
import platform
import time
from pathlib import Path

import torch

from oilbird.chat import encode_chat
from oilbird.datasets import load_dataset
from oilbird.models import load_model
from oilbird.semantic_store import TraceStore, normalize


def timed(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


@torch.inference_mode()
def model_states(spec: str, count: int, queries: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`count` last-layer states of API-Bank prompt tokens, then `queries` from later requests."""
    loaded = load_model(spec)
    rows, total = [], 0
    for request in load_dataset("api-bank", per_category=10_000):
        ids = encode_chat(loaded.tokenizer, request.messages, request.tools, model_name=loaded.name)
        out = loaded.model(torch.tensor([ids]), output_hidden_states=True)
        rows.append(out.hidden_states[-1][0].float())  # [len, d]
        total += len(ids)
        if total >= count + 50 * queries:
            break
    states = torch.cat(rows)
    pick = torch.linspace(count, len(states) - 1, queries).long()
    return states[:count], states[pick]


def clustered_states(count: int, queries: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(max(1, count // 50), dim, generator=gen)
    keys = centers[torch.randint(0, centers.shape[0], (count,), generator=gen)] \
        + 0.5 * torch.randn(count, dim, generator=gen)
    probes = keys[torch.randint(0, count, (queries,), generator=gen)] + 0.3 * torch.randn(queries, dim, generator=gen)
    return keys, probes


def measure(keys: torch.Tensor, queries: torch.Tensor, n: int, lists: int, probes: int) -> dict:
    exact = TraceStore(keys.shape[1], index="exact", max_records=n + 1)
    lists = TraceStore(keys.shape[1], index="lists", max_records=n + 1, index_lists=lists, index_probes=probes)
    for store in (exact, lists):
        store.add(list(range(n)), keys[:n])
    queries = normalize(queries)
    start = time.perf_counter()
    lists.search(queries[0], 8, n)  # trains, then files the first slice
    train_ms = (time.perf_counter() - start) * 1e3
    start = time.perf_counter()
    while lists.ann.indexed_rows(0) < n:
        lists.ann.sync(lists.keys, 0)
    file_us = (time.perf_counter() - start) / max(1, n) * 1e6
    it = iter(range(10 ** 9))
    exact_ms = timed(lambda: exact.search(queries[next(it) % len(queries)], 8, n), 20) * 1e3
    lists_ms = timed(lambda: lists.search(queries[next(it) % len(queries)], 8, n), 20) * 1e3
    # The index's own search, the lists' rows gathered by our kernel and in PyTorch, alternating.
    gathered = {True: float("inf"), False: float("inf")}
    for round_ in range(6):
        for kernel in (True, False) if round_ % 2 == 0 else (False, True):
            gathered[kernel] = min(gathered[kernel], timed(lambda: lists.ann.search(
                lists.keys, queries[next(it) % len(queries)], 8, 0, n, kernel=kernel), 20) * 1e3)
    recall = sum(len(set(exact.search(q, 8, n)[1]) & set(lists.search(q, 8, n)[1]))
                 for q in queries) / (8 * len(queries))
    return dict(records=n, exact_ms=exact_ms, lists_ms=lists_ms, train_ms=train_ms,
                file_us_per_record=file_us, recall_at_8=recall, index_kernel_ms=gathered[True],
                index_pytorch_ms=gathered[False])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m", help="whose hidden states; 'none': random clustered keys")
    parser.add_argument("--dim", type=int, default=576, help="width of the random keys (--model none)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="10000,32768,100000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--lists", type=int, default=256)
    parser.add_argument("--probes", type=int, default=8)
    parser.add_argument("--states", default=None, help="a .pt file: the keys and queries are saved there, or read from it if it exists")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.states and Path(args.states).exists():
        keys, queries = torch.load(args.states)
    elif args.model == "none":
        keys, queries = clustered_states(max(sizes), args.queries, args.dim)
    else:
        keys, queries = model_states(args.model, max(sizes), args.queries)
    if args.states and not Path(args.states).exists():
        torch.save((keys, queries), args.states)
    rows = []
    print("| records | exact ms/search | lists ms/search | first search (trains) ms | filing µs/record | recall@8 "
          "| the index alone, rows gathered by our kernel / in PyTorch, ms |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for n in sizes:
        row = measure(keys, queries, n, args.lists, args.probes)
        rows.append(row)
        print(f"| {n} | {row['exact_ms']:.2f} | {row['lists_ms']:.2f} | {row['train_ms']:.0f} | "
              f"{row['file_us_per_record']:.2f} | {row['recall_at_8']:.3f} | "
              f"{row['index_kernel_ms']:.3f} / {row['index_pytorch_ms']:.3f} |", flush=True)
    print(f"\nkeys: {args.model if args.model != 'none' else f'clustered random, width {args.dim}'}; "
          f"{args.lists} lists, {args.probes} probed; {args.threads} thread(s); {platform.processor() or platform.machine()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(model=args.model, lists=args.lists, probes=args.probes, threads=args.threads, rows=rows, machine=platform.platform()), f, indent=1)


if __name__ == "__main__":
    main()
