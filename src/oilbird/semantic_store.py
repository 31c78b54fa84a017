"""Oilbird's semantic memory: past positions keyed by the verifier's hidden state (ALGORITHMS.md §7).

Contract (pure data structures, independent of any drafter):
- `TraceStore`: one tenant's committed positions. Record r is a committed token x_r keyed by the
  hidden state of the position *before* it (the state whose argmax predicted x_r), L2-normalized
  and held as float16 (or int8 with a per-record scale). Its value is what followed x_r in the
  same request: x_{r+1}, x_{r+2}, ... within x_r's *segment*: a run of consecutive records of one
  owner (a request id). Records are appended in commit order; an `add` by another owner than the
  newest segment's opens a new segment, and `begin_request(owner)` opens one even for the same
  owner (a new request that reuses an id). Served one at a time, a request is one segment; when
  requests of a tenant run concurrently their adds interleave, and each request's records form
  several segments, so a value never crosses into another request: it is merely cut short where
  another request's records intervene. Cap: `max_records`; an `add` that passes it evicts the
  oldest segments first (whole ones where a boundary allows), down to 90% of the cap. Exact
  cosine search is one pass over the keys (`semantic_keys.cosine_topk`: our kernel on a CPU, a
  matmul on a GPU); past a size threshold an inverted-list index answers instead
  (`semantic_index.ListIndex`: the keys of a few lists near the query, scored exactly). It is
  trained once, fed a bounded number of rows per search, never all at once inside one proposal,
  and keeps its lists through evictions; rows it does not hold yet are searched exactly and the
  two answers merged.
- `RejectedPool`: one tenant's ring buffer of what verification rejected. Record: key = the state
  at a rejected node's parent, token = the rejected node's token, value = the continuation the
  model endorsed from that node in the same forward. It only answers queries whose anchor equals
  the record's token: "had this token been committed here, the model would have gone on like
  this". Cap: `capacity` records; the oldest are overwritten first.
- Record ids: both structures give every record an absolute id, its place in the tenant's
  history (TraceStore: records ever evicted + index; RejectedPool: records ever written before
  it). Ids never change, while store indices shift down on eviction and ring slots are reused.
  A caller that remembers records across an `add` (a visibility watermark, a neighbor followed
  through a request) keeps ids; `next_id` is the id the next record will get.
- Neither structure decides what is searchable: `search` answers among the records whose id is
  below the caller's `before_id`. The drafter's visibility rule is in drafters/oilbird.py.
"""

from __future__ import annotations

import bisect
from typing import Hashable

import torch

from oilbird.errors import ConfigError
from oilbird.semantic_index import FILE_BATCH, ListIndex
from oilbird.semantic_keys import KEY_DTYPES, KeyMatrix, cosine_topk, normalize

__all__ = ["KEY_DTYPES", "KeyMatrix", "RejectedPool", "TraceStore", "normalize"]
INDEX_MODES = ("exact", "lists", "auto")
RETRAIN_GROWTH = 3
"""The lists are trained again once this many times the records they were trained on have been added."""


class TraceStore:
    """One tenant's committed positions: tokens, keys and owner segments (see the module docstring).

    Args:
        dim: hidden size of the keys.
        device: where the keys live (the model's device).
        dtype: "float16" or "int8".
        max_records: cap; past it the oldest segments are evicted first, down to 90% of it.
        index: "exact", "lists" (`ListIndex`) or "auto" (lists once `index_min_records` records, on a CPU).
        index_min_records: where "auto" starts using the lists.
        index_lists, index_probes: the lists' centroids and the lists searched per query.

    Raises:
        ConfigError: for an unknown index or key dtype.
    """

    def __init__(self, dim: int, device: torch.device | str = "cpu", dtype: str = "float16",
                 max_records: int = 1_000_000, index: str = "auto",
                 index_min_records: int = 8_192, index_lists: int = 256, index_probes: int = 8) -> None:
        if index not in INDEX_MODES:
            raise ConfigError(f"index must be one of {INDEX_MODES}, got {index!r}")
        self.keys = KeyMatrix(dim, device, dtype)
        self.tokens: list[int] = []
        self.starts: list[int] = []  # index of the first record of each segment, ascending, distinct
        self.owners: list[Hashable] = []  # the owner of each segment (a request id; None: anonymous)
        self.max_records = max_records
        self.index_mode, self.index_min_records = index, index_min_records
        self.index_lists, self.index_probes = index_lists, index_probes
        self.ann: ListIndex | None = None  # the lists searches read
        self.successor: ListIndex | None = None  # lists retrained on a grown store, filled before they replace `ann`
        self.evicted_records = 0

    def __len__(self) -> int:
        return len(self.tokens)

    # --- record ids: stable across eviction -----------------------------------------------------

    @property
    def next_id(self) -> int:
        """The id the next added record will get (= records ever added)."""
        return self.evicted_records + len(self.tokens)

    def id_of(self, index: int) -> int:
        """The absolute id of the record now at `index`."""
        return self.evicted_records + index

    def index_of(self, record_id: int) -> int:
        """Where record `record_id` is now; negative when it was evicted."""
        return record_id - self.evicted_records

    def count_before(self, record_id: int) -> int:
        """How many held records have an id below `record_id`: they are the first ones."""
        return max(0, min(len(self), self.index_of(record_id)))

    # --- writing --------------------------------------------------------------------------------

    def begin_request(self, owner: Hashable = None) -> None:
        """Open a new segment for `owner`: chains never run from one segment into the next.

        Needed only where one owner's records must not continue its previous ones (a request
        that reuses the id of one served before); `add` opens segments when owners alternate.
        An empty newest segment is not duplicated: it passes to `owner`.
        """
        if self.starts and self.starts[-1] == len(self.tokens):
            self.owners[-1] = owner
        else:
            self.starts.append(len(self.tokens))
            self.owners.append(owner)

    def add(self, tokens: list[int], hidden: torch.Tensor, owner: Hashable = None) -> None:
        """Append records for `tokens`, keyed by the states that predicted them.

        Args:
            tokens: committed tokens of `owner`, in commit order.
            hidden: [m, d] raw states, row j predicted tokens[j].
            owner: whose records these are (a request id); unless it owns the newest segment,
                the records open a new one, so no value runs from another owner's records into them.

        Raises:
            ValueError: if the counts differ.
        """
        if not tokens:
            return
        if hidden.shape[0] != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {hidden.shape[0]} keys")
        if not self.starts or self.owners[-1] != owner:
            self.begin_request(owner)
        self.keys.append(normalize(hidden))
        self.tokens.extend(int(t) for t in tokens)
        if len(self.tokens) > self.max_records:
            self._evict()

    def _evict(self) -> None:
        """Drop the oldest records down to 90% of the cap, on a segment boundary where one allows."""
        cut = len(self.tokens) - int(0.9 * self.max_records)
        i = bisect.bisect_left(self.starts, cut)
        if i < len(self.starts) and self.starts[i] < len(self.tokens):
            cut = self.starts[i]
        head = bisect.bisect_right(self.starts, cut) - 1  # the segment that holds the new first record
        self.keys.drop_front(cut)
        del self.tokens[:cut]
        self.starts = [0] + [s - cut for s in self.starts[head + 1:]]  # the head may be cut mid-way
        self.owners = self.owners[head:]
        self.evicted_records += cut
        for index in (self.ann, self.successor):
            if index is not None:
                index.drop_below(self.evicted_records)

    # --- reading --------------------------------------------------------------------------------

    def segment_end(self, record: int) -> int:
        """One past the index of the last record of `record`'s segment."""
        i = bisect.bisect_right(self.starts, record)
        return self.starts[i] if i < len(self.starts) else len(self.tokens)

    def value(self, record: int, length: int, visible_end: int) -> list[int]:
        """Up to `length` tokens that followed the record at index `record`, within its segment
        (never another owner's records) and before index `visible_end`."""
        end = min(self.segment_end(record), visible_end, record + 1 + length)
        return self.tokens[record + 1:end]

    def uses_index(self) -> bool:
        """Whether searches go through the inverted lists (trained on the first that does). 'auto'
        keeps exact search on a GPU, where one matmul reads even a full store in well under a millisecond."""
        return self.index_mode == "lists" or (self.index_mode == "auto" and self.keys.device.type == "cpu"
                                              and len(self) >= self.index_min_records)

    def search(self, query: torch.Tensor, k: int, before_id: int) -> tuple[list[float], list[int]]:
        """Top-k records with an id below `before_id`, by cosine with the unit `query` [d].

        Args:
            query: [d] unit vector.
            k: most records returned.
            before_id: the caller's watermark; with nothing evicted it is a count of records.

        Returns:
            (similarities, record indices), best first; indices hold until the next `add`.
        """
        visible = self.count_before(before_id)  # ids -> indices, now, after any eviction
        if visible <= 0 or k <= 0:
            return [], []
        if self.uses_index():
            self._keep_index()
            return self._ann_search(query, k, visible)
        return self.keys.top(query, k, 0, visible)

    def _keep_index(self) -> None:
        """Train the lists on first use; file new records; retrain on a store that has grown.

        Centroids trained on a tenant's first records partition its later traffic less evenly
        (lists grow lopsided, searches read more keys) once that traffic has moved on. So after
        `RETRAIN_GROWTH` times as many records as the lists were trained on have been added, a
        successor is trained on the present store and filed a bounded slice per search beside the
        serving lists, and it replaces them once it holds every record.
        """
        if self.ann is None:
            self.ann = ListIndex(self.index_lists, self.index_probes)
            self.ann.train(self.keys, first_id=self.evicted_records)
        self.ann.sync(self.keys, self.evicted_records, least=FILE_BATCH)
        if self.successor is None and self.next_id - self.ann.trained_id >= RETRAIN_GROWTH * self.ann.trained_rows:
            self.successor = ListIndex(self.index_lists, self.index_probes)
            self.successor.train(self.keys, first_id=self.evicted_records)
        if self.successor is not None:
            self.successor.sync(self.keys, self.evicted_records)
            if self.successor.indexed_rows(self.evicted_records) >= len(self):
                self.ann, self.successor = self.successor, None

    def _ann_search(self, query: torch.Tensor, k: int, visible: int) -> tuple[list[float], list[int]]:
        """The lists over the indexed rows merged with exact search over the visible rows not indexed yet."""
        indexed = min(self.ann.indexed_rows(self.evicted_records), visible)
        sims, rows = self.ann.search(self.keys, query, k, self.evicted_records, indexed)
        if indexed < visible:
            more = self.keys.top(query, k, indexed, visible)
            found = sorted(zip(sims + more[0], rows + more[1]), key=lambda pair: -pair[0])[:k]
            sims, rows = [s for s, _ in found], [r for _, r in found]
        return sims, rows

    def bytes_per_record(self) -> int:
        """Key bytes plus the token id (a Python int slot)."""
        return self.keys.bytes_per_row() + 8

    def memory_bytes(self) -> int:
        ann = sum(index.bytes() for index in (self.ann, self.successor) if index is not None)
        return len(self) * self.bytes_per_record() + ann


class RejectedPool:
    """One tenant's ring buffer of rejected-branch records (see the module docstring).

    Record `id` lives in slot `id % capacity` until record `id + capacity` overwrites it.

    Args:
        capacity: records kept (0: the pool keeps nothing); the oldest are overwritten first.
        dim: hidden size of the keys (float16).
        device: where the keys live.
    """

    _UNWRITTEN = 2 ** 62  # id of an empty slot: above every watermark

    def __init__(self, capacity: int, dim: int, device: torch.device | str = "cpu") -> None:
        self.capacity = capacity
        self.keys = torch.zeros((capacity, dim), dtype=torch.float16, device=device)  # [cap, d]
        # Token and id per slot live in Python, with the slots of each token: a search looks up
        # its anchor's few slots instead of comparing the whole ring (two tensor passes a cycle).
        self.tokens: list[int] = [-1] * capacity
        self.ids: list[int] = [self._UNWRITTEN] * capacity
        self.slots_of: dict[int, set[int]] = {}
        self.values: list[list[int]] = [[] for _ in range(capacity)]
        self.next_id = 0  # records ever written: the id of the next one

    @property
    def size(self) -> int:
        """Records held."""
        return min(self.capacity, self.next_id)

    def add(self, keys: torch.Tensor, tokens: list[int], values: list[list[int]]) -> None:
        """Write records, each taking the next id; the oldest are overwritten.

        Args:
            keys: [m, d] raw states at the rejected nodes' parents.
            tokens: the rejected nodes' tokens.
            values: the continuation endorsed from each rejected node.
        """
        m = len(tokens)
        if m == 0 or self.capacity == 0:
            self.next_id += m
            return
        first_id = self.next_id
        if m > self.capacity:  # only the newest fit; the others are written and overwritten at once
            first_id += m - self.capacity
            keys, tokens, values = keys[-self.capacity:], tokens[-self.capacity:], values[-self.capacity:]
        ids = list(range(first_id, first_id + len(tokens)))
        slots = [i % self.capacity for i in ids]
        idx = torch.tensor(slots, device=self.keys.device)  # [m]
        self.keys[idx] = normalize(keys).to(self.keys.device, torch.float16)
        for slot, token, record_id, value in zip(slots, tokens, ids, values):
            old = self.tokens[slot]
            if old != -1:
                self.slots_of[old].discard(slot)
            token = int(token)
            self.tokens[slot], self.ids[slot], self.values[slot] = token, record_id, value
            self.slots_of.setdefault(token, set()).add(slot)
        self.next_id += m

    def search(self, query: torch.Tensor, anchor: int, k: int, before_id: int) -> tuple[list[float], list[int]]:
        """Top-k records with token == `anchor` and an id below `before_id`, by cosine.

        Args:
            query: [d] unit vector.
            anchor: the token the records must have been rejected as.
            k: most records returned.
            before_id: the caller's watermark.

        Returns:
            (similarities, slots), best first; a slot's value is `values[slot]`.
        """
        if self.size == 0 or k <= 0:
            return [], []
        # Filter before scoring: few slots hold the anchor, and scoring the whole ring per cycle
        # was most of the drafter's retrieval time.
        slots = sorted(slot for slot in self.slots_of.get(anchor, ()) if self.ids[slot] < before_id)
        if not slots:
            return [], []
        rows = torch.tensor(slots, device=self.keys.device)  # [n_ok]
        sims, positions = cosine_topk(self.keys, query, k, rows=rows)  # positions into slots
        return sims.tolist(), [slots[p] for p in positions.tolist()]

    def memory_bytes(self) -> int:
        """Keys, token and id per slot, plus the values' list objects."""
        return self.capacity * (self.keys.shape[1] * 2 + 8 + 8) + sum(8 * len(v) + 56 for v in self.values)
