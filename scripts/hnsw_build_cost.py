"""What building the semantic store's HNSW index costs, against exact search (oilbird/semantic_keys.py).

Times, on random unit rows of the model's width: indexing a whole store at once (what a store
crossing the FAISS threshold used to do inside one proposal), one `ANN_ROWS_PER_SEARCH` slice added
to a full index (what a search pays now until the index has caught up), and one exact search over
the store (what answers for the rows not indexed yet).

    python scripts/hnsw_build_cost.py --dim 576 --records 50000 --threads 2
"""

from __future__ import annotations

import argparse
import time

import torch

from oilbird.semantic_keys import ANN_ROWS_PER_SEARCH, HNSWIndex, KeyMatrix, normalize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dim", type=int, default=576, help="key width (SmolLM2: 576, Qwen2.5-0.5B: 896)")
    parser.add_argument("--records", type=int, default=50_000, help="records in the store")
    parser.add_argument("--threads", type=int, default=2, help="torch and FAISS threads")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import faiss

    faiss.omp_set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    keys = KeyMatrix(args.dim, "cpu")
    keys.append(normalize(torch.randn(args.records + ANN_ROWS_PER_SEARCH, args.dim, generator=gen)))
    index = HNSWIndex(args.dim)
    start = time.perf_counter()
    index.sync(keys, args.records)
    whole = time.perf_counter() - start
    start = time.perf_counter()
    index.sync(keys, ANN_ROWS_PER_SEARCH)
    slice_ms = 1e3 * (time.perf_counter() - start)
    query = normalize(torch.randn(1, args.dim, generator=gen))[0]
    start = time.perf_counter()
    for _ in range(20):
        keys.scores(query, args.records)
    exact_ms = 1e3 * (time.perf_counter() - start) / 20
    print(f"dim {args.dim}, {args.records} records, {args.threads} threads")
    print(f"index the whole store at once: {whole:.1f} s")
    print(f"add {ANN_ROWS_PER_SEARCH} rows to the full index: {slice_ms:.1f} ms")
    print(f"exact search over the store: {exact_ms:.1f} ms")


if __name__ == "__main__":
    main()
