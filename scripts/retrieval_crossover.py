"""Exact cosine search vs the FAISS HNSW index: time per query by store size, on this machine.

Measures what `SemanticConfig.sem_faiss_min_records` should be: the store size past which the
HNSW index answers a query faster than the exact search over every key (on a CPU one pass of
our kernel, `oilbird.semantic_keys.cosine_topk`; before stop 39 a float16 matmul + top-k). Also
reports the HNSW cost of adding a record (paid once per committed token) and its top-8 recall.

Usage: python scripts/retrieval_crossover.py [--dim 576] [--threads 1] [--out FILE.json]
"""

import argparse
import json
import platform
import time

import torch

from oilbird.semantic_store import TraceStore, normalize


def timed(fn, repeat: int) -> float:
    fn()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    return (time.perf_counter() - start) / repeat


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dim", type=int, default=576)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sizes", default="2000,10000,25000,50000,100000,200000")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    rows = []
    print(f"| records | exact ms/query | HNSW ms/query | HNSW add µs/record | HNSW recall@8 |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in (int(s) for s in args.sizes.split(",")):
        # Clustered keys (like hidden states of repetitive traffic), not uniform noise.
        centers = torch.randn(max(1, n // 50), args.dim, generator=gen)
        keys = centers[torch.randint(0, centers.shape[0], (n,), generator=gen)] \
            + 0.5 * torch.randn(n, args.dim, generator=gen)
        queries = normalize(keys[torch.randint(0, n, (20,), generator=gen)]
                            + 0.3 * torch.randn(20, args.dim, generator=gen))
        exact, ann = TraceStore(args.dim, index="exact", max_records=n + 1), \
            TraceStore(args.dim, index="faiss", max_records=n + 1)
        for store in (exact, ann):
            store.add(list(range(n)), keys)
        t = time.perf_counter()
        ann.search(queries[0], 8, n)  # builds the index: every record added once
        add_us = (time.perf_counter() - t) / n * 1e6
        it = iter(range(10 ** 9))
        exact_ms = timed(lambda: exact.search(queries[next(it) % 20], 8, n), 20) * 1e3
        ann_ms = timed(lambda: ann.search(queries[next(it) % 20], 8, n), 20) * 1e3
        recall = sum(len(set(exact.search(q, 8, n)[1]) & set(ann.search(q, 8, n)[1])) for q in queries) / (8 * 20)
        rows.append(dict(records=n, exact_ms=exact_ms, hnsw_ms=ann_ms, hnsw_add_us=add_us, recall_at_8=recall))
        print(f"| {n} | {exact_ms:.2f} | {ann_ms:.2f} | {add_us:.0f} | {recall:.2f} |", flush=True)
    crossover = next((r["records"] for r in rows if r["hnsw_ms"] < r["exact_ms"]), None)
    print(f"\ncrossover (first size where HNSW is faster): {crossover}; dim {args.dim}, "
          f"{args.threads} thread(s), {platform.processor() or platform.machine()}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(dim=args.dim, threads=args.threads, rows=rows, crossover=crossover,
                           machine=platform.platform()), f, indent=1)


if __name__ == "__main__":
    main()
