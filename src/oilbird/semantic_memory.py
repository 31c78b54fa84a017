"""The semantic source's state: its config, one tenant's memory, and the visibility watermark.

- `SemanticConfig`: the `sem_*` fields that Oilbird and the transplants add to their host's config
  (defaults: the paper's where it gives them, ALGORITHMS.md §7).
- `SemanticMemory`: what one tenant keeps across requests: the trace store (cap
  `sem_max_records`, oldest requests evicted first), the rejected-branch pool (a ring of
  `sem_rejected_capacity` records, the oldest overwritten first) and the calibrator (constant
  size). Drafters hold one per tenant in a `TenantMap`.
- `Watermark`: the bound of the visibility rule (drafters/oilbird.py): record ids below it are
  searchable. Each request in flight holds its own (requests of one tenant may interleave their
  adds). Ids never shift, so eviction cannot expose the newest records.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from oilbird.semantic_merge import Calibrator
from oilbird.semantic_store import INDEX_MODES, KEY_DTYPES, RejectedPool, TraceStore


@dataclass
class SemanticConfig:
    """The semantic source (Oilbird). Values the paper leaves open were chosen on development data (docs/RESULTS.md)."""

    sem_layer: int = -1
    """Which hidden state keys the store: an index into the model's hidden_states (-1: last layer after the final norm; 0: the static input embedding, the ablation)."""
    sem_granularity: str = "position"
    """'position': query at every drafting cycle (the paper); 'request': one query per request whose neighbors advance with the output (the ablation)."""
    sem_top_k: int = 8
    """Neighbors retrieved per query (trace store and rejected pool together)."""
    sem_theta: float = 0.7
    """Entry floor θ: no semantic entries unless the best cosine similarity reaches it; also the zero point of the similarity-sized depth."""
    sem_floor: bool = True
    """Apply the entry floor (off: always take the top-k, the ablation)."""
    sem_max_depth: int = 16
    """L_max: the longest chain copied from one neighbor."""
    sem_similarity_depth: bool = True
    """Size each chain by its similarity, clamp(round(L_max (s-θ)/(1-θ)), 1, L_max); off: by neighbor rank, L_max/(rank+1)."""
    sem_entry_budget: int = 16
    """Most tree nodes the semantic source may pay for per cycle (0: the source is off, the controlled pair)."""
    sem_entry_share: float = 0.25
    """...and at most this share of the cycle's node budget, so small (hardware-aware) budgets stay mostly lexical."""
    sem_index_prompt: bool = True
    """Also store a record for every prompt token (from the prefill), not only generated ones."""
    sem_key_dtype: str = "float16"
    """Storage of the keys: 'float16' or 'int8' (per-record scale; half the bytes)."""
    sem_max_records: int = 1_000_000
    """Records kept per tenant in the trace store; beyond it the oldest requests are evicted first."""
    sem_index: str = "auto"
    """Nearest-neighbor search: 'exact' (one pass over the keys on the model's device: our kernel on a CPU, a matmul on a GPU), 'lists' (inverted lists: the keys of the 8 of 256 lists nearest the query, scored exactly; oilbird/semantic_index.py) or 'auto' (lists on a CPU once the store holds sem_index_min_records)."""
    sem_index_lists: int = 256
    """'lists': centroids (and inverted lists) of the index, trained once per tenant store."""
    sem_index_probes: int = 8
    """'lists': lists searched per query; more finds more of the exact neighbors and reads more keys."""
    sem_index_min_records: int = 8_192
    """Where 'auto' moves from exact search to the lists: exact search reads every key at every proposal (1.29 ms a retrieval at 30,885 records on two cores), the lists a few percent of them (0.75 ms a retrieval there at stop 45, most of it fixed costs, some since moved into one kernel call), at a recall measured by scripts/retrieval_crossover.py. On the 100-request API-Bank stream (31,000 records at its end) lists from 8,192 records made Oilbird 1.02x faster than from 32,768, at the same τ (docs/RESULTS.md, stop 45)."""
    sem_rejected_pool: bool = True
    """Keep and search the rejected-branch pool."""
    sem_rejected_capacity: int = 4096
    """Records in each tenant's rejected-branch ring buffer; the oldest are overwritten first."""
    sem_rejected_depth: int = 6
    """Longest endorsed continuation stored per rejected node."""
    sem_self_calibrate: bool = True
    """Move θ and the depth online from the observed acceptance of semantic nodes (our design)."""
    sem_calib_target: float = 0.3
    """Self-calibration aims at this share of semantic-paid nodes accepted."""
    sem_calib_alpha: float = 0.2
    """EMA weight of the newest cycle's acceptance."""
    sem_calib_gain: float = 0.1
    """How far θ moves per unit of relative acceptance error."""

    def __post_init__(self) -> None:
        if self.sem_granularity not in ("position", "request"):
            raise ValueError(f"sem_granularity must be 'position' or 'request', got {self.sem_granularity!r}")
        if self.sem_key_dtype not in KEY_DTYPES:
            raise ValueError(f"sem_key_dtype must be one of {KEY_DTYPES}, got {self.sem_key_dtype!r}")
        if self.sem_index not in INDEX_MODES:
            hint = " ('faiss' is gone: 'lists' is the approximate index now)" if self.sem_index == "faiss" else ""
            raise ValueError(f"sem_index must be one of {INDEX_MODES}, got {self.sem_index!r}{hint}")
        if not 1 <= self.sem_index_probes <= self.sem_index_lists:
            raise ValueError(f"need 1 <= sem_index_probes <= sem_index_lists, "
                             f"got {self.sem_index_probes} and {self.sem_index_lists}")
        if not -1.0 <= self.sem_theta < 1.0:
            raise ValueError(f"sem_theta must be in [-1, 1), got {self.sem_theta}")
        if min(self.sem_top_k, self.sem_max_depth, self.sem_max_records, self.sem_rejected_depth) < 1:
            raise ValueError("sem_top_k, sem_max_depth, sem_max_records and sem_rejected_depth must be >= 1")
        if self.sem_entry_budget < 0 or self.sem_rejected_capacity < 0 or not 0 <= self.sem_entry_share <= 1:
            raise ValueError("sem_entry_budget and sem_rejected_capacity must be >= 0, sem_entry_share in [0, 1]")
        # A drafter's config lists SemanticConfig before its host's (`class C(SemanticConfig,
        # HostConfig)`): the host's checks run next in the method resolution order.
        host_checks = getattr(super(), "__post_init__", None)
        if host_checks is not None:
            host_checks()


class SemanticMemory:
    """One tenant's semantic memory, kept across its requests: trace store, rejected pool, calibrator.

    The store and the pool are built at the tenant's first hidden states (their width and device
    come from the model); until then both are None. Caps and eviction orders: module docstring.

    Args:
        config: the drafter's config (SemanticConfig fields).
    """

    def __init__(self, config: SemanticConfig) -> None:
        self.config = config
        self.calibrator = Calibrator(config.sem_theta, config.sem_calib_target, config.sem_calib_alpha,
                                     config.sem_calib_gain)
        self.store: TraceStore | None = None
        self.pool: RejectedPool | None = None

    def ensure(self, states: torch.Tensor) -> TraceStore:
        """The trace store, built (with the pool) for keys like `states` [n, d] on first use."""
        if self.store is None:
            cfg = self.config
            dim, device = states.shape[-1], states.device
            self.store = TraceStore(dim, device, cfg.sem_key_dtype, cfg.sem_max_records,
                                    cfg.sem_index, cfg.sem_index_min_records,
                                    cfg.sem_index_lists, cfg.sem_index_probes)
            self.pool = RejectedPool(cfg.sem_rejected_capacity if cfg.sem_rejected_pool else 0, dim, device)
        return self.store

    def memory_bytes(self) -> int:
        store = self.store.memory_bytes() if self.store is not None else 0
        pool = self.pool.memory_bytes() if self.pool is not None else 0
        return store + pool + self.calibrator.memory_bytes()


@dataclass(frozen=True)
class Watermark:
    """The visibility rule's bound (module docstring), one per request in flight: the request's
    next proposal may search the trace records with an id below `trace` and the rejected records
    with an id below `rejected`, whichever requests added them."""

    trace: int = 0
    rejected: int = 0

    @classmethod
    def all_of(cls, memory: SemanticMemory, but_newest: int = 0) -> Watermark:
        """Every record `memory` holds now, less its `but_newest` newest trace records."""
        trace = memory.store.next_id if memory.store is not None else 0
        rejected = memory.pool.next_id if memory.pool is not None else 0
        return cls(trace=trace - but_newest, rejected=rejected)
