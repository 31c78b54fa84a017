"""Oilbird's semantic key: past positions re-keyed by the verifier's hidden state (ALGORITHMS.md §7).

Pure parts, independent of any drafter:
- `TraceStore`: one tenant's records. Record r is a committed token x_r keyed by the hidden state
  of the position *before* it (the state whose argmax predicted x_r), L2-normalised and held as
  float16 (or int8 with a per-record scale). Its value is what followed x_r in the same request:
  x_{r+1}, x_{r+2}, ... Records are appended in commit order, one request segment after another;
  the oldest requests are evicted past a cap. Exact cosine search runs as one matmul on the
  keys' device; past a size threshold a FAISS HNSW index answers instead (CPU only).
- `RejectedPool`: a ring buffer of what verification rejected. Record: key = the state at a
  rejected node's parent, token = the rejected node's token, value = the continuation the model
  endorsed from that node in the same forward (up to 6 deep). It only answers queries whose
  anchor equals the record's token: the record says "had this token been committed here, the
  model would have gone on like this".
- `chain_depth`: similarity-sized copy depth, L = clamp(round(L_max (s - θ) / (1 - θ)), 1, L_max).
- `merge_chains`: chains re-walk the host tree from the root; shared nodes are tagged, only the
  divergent tail is paid for, within the semantic entry budget and the node budget.
- `Calibrator`: our self-calibration (the paper names it without a definition): an EMA of the
  acceptance rate of the nodes the semantic source paid for moves the floor θ and the depth.

Strictly online: the caller says how many records are visible (`visible`), and the drafter keeps
that below the records of the cycle it just committed; nothing of the current request's future
exists in a store.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

import torch

from oilbird.errors import ConfigError
from oilbird.tree import DraftTree

SEMANTIC = "sem"  # the source tag of semantic nodes
KEY_DTYPES = ("float16", "int8")


def normalise(vectors: torch.Tensor) -> torch.Tensor:
    """L2-normalise rows in float32, so cosine similarity becomes a dot product. [n, d] -> [n, d]."""
    vectors = vectors.float()
    return vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-6)


class KeyMatrix:
    """A growable [n, d] matrix of unit keys on one device, float16 or int8 + per-row scale."""

    def __init__(self, dim: int, device: torch.device | str, dtype: str = "float16") -> None:
        if dtype not in KEY_DTYPES:
            raise ConfigError(f"key dtype must be one of {KEY_DTYPES}, got {dtype!r}")
        self.dim, self.device, self.kind = dim, torch.device(device), dtype
        self.n = 0
        self._alloc(1024)

    def _alloc(self, capacity: int) -> None:
        torch_dtype = torch.float16 if self.kind == "float16" else torch.int8
        keys = torch.zeros((capacity, self.dim), dtype=torch_dtype, device=self.device)  # [cap, d]
        scales = torch.ones(capacity, dtype=torch.float32, device=self.device)  # [cap]
        if self.n:
            keys[: self.n] = self.keys[: self.n]
            scales[: self.n] = self.scales[: self.n]
        self.keys, self.scales = keys, scales

    def append(self, unit: torch.Tensor) -> None:
        """Append unit rows [m, d] (float32)."""
        m = unit.shape[0]
        if self.n + m > self.keys.shape[0]:
            self._alloc(max(2 * self.keys.shape[0], self.n + m))
        unit = unit.to(self.device)
        if self.kind == "float16":
            self.keys[self.n:self.n + m] = unit.half()
        else:  # symmetric per-row int8: x ~= q * scale
            scale = unit.abs().amax(dim=-1).clamp_min(1e-8) / 127.0  # [m]
            self.keys[self.n:self.n + m] = (unit / scale[:, None]).round().to(torch.int8)
            self.scales[self.n:self.n + m] = scale
        self.n += m

    def drop_front(self, m: int) -> None:
        """Forget the first m rows."""
        keep = self.n - m
        self.keys[:keep] = self.keys[m:self.n].clone()
        self.scales[:keep] = self.scales[m:self.n].clone()
        self.n = keep

    def scores(self, query: torch.Tensor, upto: int, chunk: int = 65536) -> torch.Tensor:
        """Cosine similarity of the unit `query` [d] with rows [0, upto). Returns [upto] float32."""
        if upto <= 0:
            return torch.empty(0)
        if self.kind == "float16":
            q = query.to(self.device, torch.float16)
            return (self.keys[:upto] @ q).float()  # [upto]
        q = query.to(self.device, torch.float16)
        parts = [(self.keys[s:min(upto, s + chunk)].half() @ q).float() * self.scales[s:min(upto, s + chunk)]
                 for s in range(0, upto, chunk)]
        return torch.cat(parts)

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) as float32 [m, d] (dequantised)."""
        rows = self.keys[start:stop].float()
        return rows * self.scales[start:stop, None] if self.kind == "int8" else rows

    def bytes_per_row(self) -> int:
        return self.dim * self.keys.element_size() + (4 if self.kind == "int8" else 0)


class _HNSW:
    """A FAISS HNSW inner-product index over a KeyMatrix's rows, kept in step by `sync`."""

    def __init__(self, dim: int, m: int = 32, ef_search: int = 64) -> None:
        import faiss  # optional at import time; the dependency is installed with the package

        self.index = faiss.IndexHNSWFlat(dim, m, faiss.METRIC_INNER_PRODUCT)
        self.index.hnsw.efSearch = ef_search
        self.n = 0

    def sync(self, keys: KeyMatrix) -> None:
        if keys.n > self.n:
            self.index.add(keys.rows(self.n, keys.n).cpu().numpy())
            self.n = keys.n

    def search(self, query: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        sims, ids = self.index.search(query.float().cpu().numpy()[None], k)
        return torch.from_numpy(sims[0]), torch.from_numpy(ids[0])

    def bytes(self, dim: int) -> int:
        return self.n * (4 * dim + 2 * 32 * 4)  # float32 copy + level-0 links


@dataclass
class Neighbour:
    """One retrieved record: similarity, where it lives and the chain it offers."""

    similarity: float
    record: int
    """Record index in its store (trace store index, or ring slot for rejected records)."""
    chain: list[int]
    rejected: bool = False


class TraceStore:
    """One tenant's committed positions: tokens, keys and request segments (see module docstring).

    Args:
        dim: hidden size of the keys.
        device: where the keys live (the model's device).
        dtype: "float16" or "int8".
        max_records: cap; the oldest requests are evicted (down to 90%) beyond it.
        index: "exact", "faiss" or "auto" (FAISS once `faiss_min_records` records, on a CPU).
        faiss_min_records: the exact/FAISS crossover for "auto".
    """

    def __init__(self, dim: int, device: torch.device | str = "cpu", dtype: str = "float16",
                 max_records: int = 1_000_000, index: str = "auto",
                 faiss_min_records: int = 200_000) -> None:
        if index not in ("exact", "faiss", "auto"):
            raise ConfigError(f"index must be 'exact', 'faiss' or 'auto', got {index!r}")
        self.keys = KeyMatrix(dim, device, dtype)
        self.tokens: list[int] = []
        self.starts: list[int] = []  # first record of each request segment
        self.max_records = max_records
        self.index_mode, self.faiss_min_records = index, faiss_min_records
        self.ann: _HNSW | None = None
        self.evicted_records = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def begin_request(self) -> None:
        """Open a new segment: chains never run from one request into the next."""
        if not self.starts or self.starts[-1] != len(self.tokens):
            self.starts.append(len(self.tokens))

    def add(self, tokens: list[int], hidden: torch.Tensor) -> None:
        """Append records for `tokens`, keyed by the states that predicted them ([m, d])."""
        if not tokens:
            return
        if hidden.shape[0] != len(tokens):
            raise ValueError(f"{len(tokens)} tokens but {hidden.shape[0]} keys")
        if not self.starts:
            self.begin_request()
        self.keys.append(normalise(hidden))
        self.tokens.extend(int(t) for t in tokens)
        if len(self.tokens) > self.max_records:
            self._evict()

    def _evict(self) -> None:
        cut = len(self.tokens) - int(0.9 * self.max_records)
        i = bisect.bisect_left(self.starts, cut)  # evict whole requests where a boundary allows
        if i < len(self.starts) and self.starts[i] < len(self.tokens):
            cut = self.starts[i]
        self.keys.drop_front(cut)
        del self.tokens[:cut]
        self.starts = [s - cut for s in self.starts if s >= cut]
        if not self.starts or self.starts[0] != 0:
            self.starts.insert(0, 0)  # the head of a request cut mid-way
        self.evicted_records += cut
        self.ann = None  # HNSW cannot delete; rebuilt on the next search that wants it

    def segment_end(self, record: int) -> int:
        """One past the last record of `record`'s request segment."""
        i = bisect.bisect_right(self.starts, record)
        return self.starts[i] if i < len(self.starts) else len(self.tokens)

    def value(self, record: int, length: int, visible_end: int) -> list[int]:
        """Up to `length` tokens that followed `record`, within its request and `visible_end`."""
        end = min(self.segment_end(record), visible_end, record + 1 + length)
        return self.tokens[record + 1:end]

    def uses_faiss(self) -> bool:
        if self.index_mode == "faiss":
            return True
        return (self.index_mode == "auto" and self.keys.device.type == "cpu"
                and len(self) >= self.faiss_min_records)

    def search(self, query: torch.Tensor, k: int, visible: int) -> tuple[list[float], list[int]]:
        """Top-k records among the first `visible` by cosine with the unit `query` [d].

        Returns:
            (similarities, record indices), best first.
        """
        visible = min(visible, len(self))
        if visible <= 0 or k <= 0:
            return [], []
        if self.uses_faiss():
            if self.ann is None:
                self.ann = _HNSW(self.keys.dim)
            self.ann.sync(self.keys)
            hidden_after = len(self) - visible  # the newest records are not visible yet
            sims, ids = self.ann.search(query, k + hidden_after)
            keep = [(s, i) for s, i in zip(sims.tolist(), ids.tolist()) if 0 <= i < visible][:k]
            return [s for s, _ in keep], [i for _, i in keep]
        scores = self.keys.scores(query, visible)  # [visible]
        top = scores.topk(min(k, visible))
        return top.values.tolist(), top.indices.tolist()

    def bytes_per_record(self) -> int:
        """Key bytes plus the token id (a Python int slot)."""
        return self.keys.bytes_per_row() + 8

    def memory_bytes(self) -> int:
        ann = self.ann.bytes(self.keys.dim) if self.ann is not None else 0
        return len(self) * self.bytes_per_record() + ann


class RejectedPool:
    """A ring buffer of rejected-branch records (see module docstring).

    Args:
        capacity: records kept; the oldest are overwritten.
        dim, device: as for TraceStore (keys are float16).
    """

    def __init__(self, capacity: int, dim: int, device: torch.device | str = "cpu") -> None:
        self.capacity = capacity
        self.keys = torch.zeros((capacity, dim), dtype=torch.float16, device=device)  # [cap, d]
        self.tokens = torch.full((capacity,), -1, dtype=torch.long, device=device)  # [cap]
        self.cycle = torch.zeros(capacity, dtype=torch.long, device=device)  # [cap] write cycle
        self.values: list[list[int]] = [[] for _ in range(capacity)]
        self.next = 0
        self.size = 0

    def add(self, keys: torch.Tensor, tokens: list[int], values: list[list[int]], cycle: int) -> None:
        """Write records (keys [m, d] raw states) stamped with `cycle`; the oldest are overwritten."""
        m = len(tokens)
        if m == 0 or self.capacity == 0:
            return
        if m > self.capacity:
            keys, tokens, values = keys[-self.capacity:], tokens[-self.capacity:], values[-self.capacity:]
            m = self.capacity
        slots = [(self.next + i) % self.capacity for i in range(m)]
        idx = torch.tensor(slots, device=self.keys.device)
        self.keys[idx] = normalise(keys).to(self.keys.device, torch.float16)
        self.tokens[idx] = torch.tensor(tokens, device=self.keys.device)
        self.cycle[idx] = cycle
        for slot, value in zip(slots, values):
            self.values[slot] = value
        self.next = (self.next + m) % self.capacity
        self.size = min(self.capacity, self.size + m)

    def search(self, query: torch.Tensor, anchor: int, k: int, before_cycle: int) -> tuple[list[float], list[int]]:
        """Top-k records with token == `anchor`, written before `before_cycle`, by cosine."""
        if self.size == 0 or k <= 0:
            return [], []
        scores = (self.keys @ query.to(self.keys.device, torch.float16)).float()  # [cap]
        ok = (self.tokens == anchor) & (self.cycle < before_cycle)
        n_ok = int(ok.sum())
        if n_ok == 0:
            return [], []
        top = scores.masked_fill(~ok, -2.0).topk(min(k, n_ok))
        return top.values.tolist(), top.indices.tolist()

    def memory_bytes(self) -> int:
        return self.capacity * (self.keys.shape[1] * 2 + 8 + 8) + sum(8 * len(v) + 56 for v in self.values)


def endorsed_continuation(tree: DraftTree, preds: list[int], node: int, depth: int) -> list[int]:
    """What the model endorses after `node`: its argmax, then down the child drafting that argmax.

    Args:
        tree: the verified tree.
        preds: the target's argmax at every node.
        node: the (rejected) node to start from.
        depth: at most this many tokens.
    """
    value = [preds[node]]
    current = node
    while len(value) < depth:
        child = tree.child(current, preds[current])
        if child is None:
            break
        value.append(preds[child])
        current = child
    return value


def chain_depth(similarity: float, theta: float, max_depth: int) -> int:
    """Similarity-sized copy depth: clamp(round(L_max (s - θ) / (1 - θ)), 1, L_max)."""
    if theta >= 1.0:
        return 1
    return max(1, min(max_depth, round(max_depth * (similarity - theta) / (1.0 - theta))))


def rank_depth(rank: int, max_depth: int) -> int:
    """The ablation's rank-sized depth: L_max / (rank + 1), at least 1."""
    return max(1, round(max_depth / (rank + 1)))


def merge_cost(tree: DraftTree, chain: list[int]) -> int:
    """cost(γ, T) = |γ| - π(γ, T): the tokens of `chain` not already a root path of `tree`."""
    node, shared = 0, 0
    for token in chain:
        node = tree.child(node, token)
        if node is None:
            break
        shared += 1
    return len(chain) - shared


def merge_chains(tree: DraftTree, chains: list[tuple[float, list[int]]], entry_budget: int,
                 node_budget: int, source: str = SEMANTIC) -> list[int]:
    """Merge chains (best first) into `tree` in place; returns the indices of the nodes paid for.

    Each chain re-walks the tree from the root: nodes it shares are tagged with `source` and cost
    nothing; its divergent tail is appended under the last shared node while the paid total stays
    within `entry_budget` and the tree within `node_budget` (an over-budget chain is truncated).
    """
    paid: list[int] = []
    for similarity, chain in chains:
        node, i = 0, 0
        while i < len(chain) and tree.child(node, chain[i]) is not None:
            node = tree.add(node, chain[i], source, similarity)  # shared: tag only
            i += 1
        for token in chain[i:]:
            if len(paid) >= entry_budget or len(tree) >= node_budget:
                return paid
            node = tree.add(node, token, source, similarity)
            paid.append(node)
    return paid


class Calibrator:
    """Self-calibration: an EMA of the semantic nodes' acceptance moves the floor and the depth.

    When fewer semantic nodes are accepted than `target`, θ rises (fewer, closer neighbours) and
    chains shorten; when more are, θ falls and chains lengthen. θ stays within
    [θ0 - span, min(0.99, θ0 + span)] and the depth scale within [0.5, 1.5].
    """

    def __init__(self, theta: float, target: float, alpha: float, gain: float, span: float = 0.2) -> None:
        self.theta0, self.target, self.alpha, self.gain, self.span = theta, target, alpha, gain, span
        self.ema = target

    def update(self, paid: int, accepted: int) -> None:
        if paid > 0:
            self.ema = self.alpha * (accepted / paid) + (1 - self.alpha) * self.ema

    def theta(self) -> float:
        shifted = self.theta0 + self.gain * (self.target - self.ema) / max(self.target, 1e-6)
        return min(max(shifted, self.theta0 - self.span), min(0.99, self.theta0 + self.span))

    def depth_scale(self) -> float:
        return min(1.5, max(0.5, self.ema / max(self.target, 1e-6)))
