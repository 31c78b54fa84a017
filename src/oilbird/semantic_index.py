"""An inverted-list index over a tenant's semantic keys: search a few lists, not every key.

Exact cosine search reads every key of the store at every proposal: ~1 ms at 30,000 records (the
100-request API-Bank stream's store), ~24 ms at the cap of 1M records, on two cores. `ListIndex`
bounds that (the IVF scheme of the vector-search literature, without a second copy of the keys):

- `train`: a few rounds of spherical k-means (cosine) over up to `lists * SAMPLE_PER_LIST`
  evenly spaced keys give `lists` unit centroids; torch, on the keys' device, tens of
  milliseconds once per tenant.
- `sync`: rows not indexed yet go to their nearest centroid's list, at most `most` per call, so
  no proposal pays for the whole store at once; each list holds absolute record ids, increasing.
- `drop_below`: eviction forgets ids below a watermark by moving each list's head; no rebuild.
- `search`: the `probes` centroids nearest the query; their lists' ids within the caller's range
  are scored exactly on the store's own keys (float16 keys on a CPU: gathered and scored in one
  call of our kernel, csrc/key_search.cpp; else in PyTorch, float16 through `cosine_topk`, or int8).

Approximate: a neighbor whose list is not probed is missed (recall against exact search:
scripts/retrieval_crossover.py, docs/RESULTS.md). The index only chooses what is drafted;
verification decides what is committed, so a miss costs acceptance, never correctness.
"""

from __future__ import annotations

import torch

from oilbird.semantic_keys import KeyMatrix, cosine_topk, normalize

SAMPLE_PER_LIST = 10
"""Training keys per list at most (evenly spaced over the store)."""
SYNC_ROWS_PER_SEARCH = 256
"""Rows a search files into lists at most (5-7 µs a row at width 576 and 256 lists: 1.3-1.8 ms)."""
FILE_BATCH = 64
"""Rows left unfiled until this many wait (searched exactly meanwhile): filing a few rows costs
about what filing many does, a fixed ~0.3 ms of small tensor operations per call."""


class ListIndex:
    """Inverted lists of record ids under unit centroids (see the module docstring).

    Args:
        lists: centroids (and lists).
        probes: lists searched per query.
        iterations: k-means rounds when training.
        seed: the training sample's and initial centroids' generator seed.
    """

    def __init__(self, lists: int = 256, probes: int = 8, iterations: int = 4, seed: int = 0) -> None:
        if lists < 1 or not 1 <= probes <= lists:
            raise ValueError(f"need 1 <= probes <= lists, got probes={probes}, lists={lists}")
        self.lists, self.probes, self.iterations, self.seed = lists, probes, iterations, seed
        self.centroids: torch.Tensor | None = None  # [lists, d] float32 unit rows
        self.ids: list[torch.Tensor] = []  # per list, int64 buffer of absolute ids, increasing
        self.count: list[int] = []  # per list, ids written
        self.head: list[int] = []  # per list, ids before it are evicted
        self.high = 0  # ids below this are indexed (or evicted)
        self.trained_rows = self.trained_id = 0

    @torch.no_grad()
    def train(self, keys: KeyMatrix, first_id: int = 0) -> None:
        """Centroids from the store's present keys (spherical k-means on an even sample).

        Args:
            keys: the store's keys; all `keys.n` rows are sampled.
            first_id: the id of the store's row 0 (its evicted count); the lists start empty.
        """
        n = keys.n
        self.trained_rows, self.trained_id = n, first_id + n  # how much, and up to which id
        lists = max(1, min(self.lists, n))
        step = max(1, n // (lists * SAMPLE_PER_LIST))
        sample = normalize(keys.rows_at(torch.arange(0, n, step, device=keys.device)))  # [s, d]
        g = torch.Generator().manual_seed(self.seed)
        pick = torch.randperm(sample.shape[0], generator=g)[:lists].to(sample.device)
        centroids = sample[pick].clone()  # [lists, d]
        for _ in range(self.iterations):
            nearest = (sample @ centroids.T).argmax(dim=1)  # [s]
            sums = torch.zeros_like(centroids).index_add_(0, nearest, sample)  # [lists, d]
            empty = sums.norm(dim=1) == 0
            sums[empty] = centroids[empty]  # a list nobody chose keeps its centroid
            centroids = normalize(sums)
        self.centroids = centroids
        self.ids = [torch.empty(64, dtype=torch.long, device=centroids.device) for _ in range(lists)]
        self.count, self.head = [0] * lists, [0] * lists
        self.high = first_id

    @property
    def trained(self) -> bool:
        return self.centroids is not None

    def indexed_rows(self, first_id: int) -> int:
        """How many of the store's rows (indices from 0; `first_id` is row 0's id) are indexed."""
        return max(0, self.high - first_id)

    @torch.no_grad()
    def sync(self, keys: KeyMatrix, first_id: int, most: int = SYNC_ROWS_PER_SEARCH, least: int = 1) -> None:
        """Assign up to `most` rows not indexed yet, oldest first, to their nearest lists; none
        while fewer than `least` wait."""
        start = self.indexed_rows(first_id)
        stop = min(keys.n, start + most)
        if stop - start < max(1, least):
            return
        nearest = (keys.rows(start, stop) @ self.centroids.T).argmax(dim=1)  # [m]
        order = torch.argsort(nearest, stable=True)  # rows grouped by list, ids kept increasing
        ids = (order + first_id + start).to(torch.long)
        lists, sizes = torch.unique_consecutive(nearest[order], return_counts=True)
        at = 0
        for lst, size in zip(lists.tolist(), sizes.tolist()):
            self._append(lst, ids[at:at + size])
            at += size
        self.high = first_id + stop

    def _append(self, lst: int, ids: torch.Tensor) -> None:
        buf, count = self.ids[lst], self.count[lst]
        if count + len(ids) > len(buf):
            grown = torch.empty(max(2 * len(buf), count + len(ids)), dtype=torch.long, device=buf.device)
            grown[:count] = buf[:count]
            self.ids[lst] = buf = grown
        buf[count:count + len(ids)] = ids
        self.count[lst] = count + len(ids)

    def drop_below(self, record_id: int) -> None:
        """Forget ids below `record_id` (evicted records); lists keep their memory until reused."""
        for lst in range(len(self.ids)):
            live = self.ids[lst][self.head[lst]:self.count[lst]]
            self.head[lst] += int(torch.searchsorted(live, record_id))
            if self.head[lst] == self.count[lst]:
                self.head[lst] = self.count[lst] = 0  # empty: write from the start again
        self.high = max(self.high, record_id)

    @torch.no_grad()
    def search(self, keys: KeyMatrix, query: torch.Tensor, k: int, first_id: int,
               visible: int, kernel: bool = True) -> tuple[list[float], list[int]]:
        """The k best indexed rows among the first `visible` (row 0's id is `first_id`).

        Args:
            keys: the store's keys, scored exactly on the probed lists' rows.
            query: [d] unit vector.
            k: most rows returned.
            first_id: the id of the store's row 0 (its evicted count).
            visible: rows [0, visible) may be returned.
            kernel: gather and score the lists' rows in one call of our kernel where it runs
                (`KeyMatrix.list_kernel`); False: in PyTorch (the same rows and sums; for
                measurements, scripts/retrieval_crossover.py).

        Returns:
            (similarities, row indices), best first.
        """
        q = query.to(self.centroids.device, torch.float32)
        probed = (self.centroids @ q).topk(min(self.probes, len(self.ids))).indices.tolist()
        hi = first_id + visible
        module = keys.list_kernel() if kernel else None
        if module is not None:  # the same rows and scores, gathered in one call
            values, rows = module.key_topk_lists(keys.keys, q, [self.ids[lst] for lst in probed],
                                                 [self.head[lst] for lst in probed],
                                                 [self.count[lst] for lst in probed], first_id, hi, k)
            return values.tolist(), rows.tolist()
        parts = []
        for lst in probed:
            live = self.ids[lst][self.head[lst]:self.count[lst]]
            parts.append(live[: int(torch.searchsorted(live, hi))])
        rows = torch.cat(parts) - first_id if parts else torch.empty(0, dtype=torch.long)
        if len(rows) == 0:
            return [], []
        rows = rows.sort().values  # ties keep the lower row, as the exact search does
        values, positions = keys.top_rows(query, k, rows)
        return values.tolist(), rows[positions].tolist()

    def bytes(self) -> int:
        ids = sum(len(buf) for buf in self.ids) * 8
        return ids + (0 if self.centroids is None else self.centroids.numel() * 4)
