"""Oilbird: a lexical host drafter plus the semantic source, merged into one tree (ALGORITHMS.md §7).

Every cycle: the host (GOOSE for `oilbird`; PLD or Token Recycling for the transplants) builds its
tree at the full node budget. Where that tree drafts anything (the semantic key extends chains, it
never opens one), the hidden state that predicted the anchor queries the tenant's trace store and
rejected-branch pool; each neighbour offers the continuation that followed it, with a copy depth
sized by its similarity; the chains, best first, re-walk the host tree from the root and pay only
for the nodes where they diverge, within the semantic entry budget. The host's last-built nodes
give way so the total never exceeds the node budget. The same verification forward supplies the
records: each committed token keyed by the state that predicted it, and each rejected node with
the continuation the model endorsed from it.

Strictly online: records enter the store as their tokens are committed; the records of the cycle
just committed are not searchable until the next one (one of them is the query itself), and a
chain never reads past what is committed. Stores are per tenant.

Ablations are config fields (`sem_*`): entry budget 0 (the controlled pair), `sem_layer=0` (the
static input-embedding key), `sem_granularity=request` (one query per request), and
`sem_similarity_depth`, `sem_floor`, `sem_self_calibrate`, `sem_rejected_pool` off.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields
from typing import ClassVar

import torch

from oilbird.drafters.base import Drafter
from oilbird.drafters.goose import Goose, GooseConfig
from oilbird.drafters.pld import PLDConfig, PromptLookup
from oilbird.drafters.registry import register
from oilbird.drafters.token_recycling import TokenRecycling, TokenRecyclingConfig
from oilbird.errors import ConfigError
from oilbird.semantic import (KEY_DTYPES, SEMANTIC, Calibrator, RejectedPool, TraceStore, chain_depth,
                              endorsed_continuation, merge_chains, merge_cost, normalise, rank_depth)
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification


@dataclass
class SemanticConfig:
    """The semantic source (Oilbird). Values the paper leaves open were chosen on development data (docs/RESULTS.md)."""

    sem_layer: int = -1
    """Which hidden state keys the store: an index into the model's hidden_states (-1: last layer after the final norm; 0: the static input embedding, the ablation)."""
    sem_granularity: str = "position"
    """'position': query at every drafting cycle (the paper); 'request': one query per request whose neighbours advance with the output (the ablation)."""
    sem_top_k: int = 8
    """Neighbours retrieved per query (trace store and rejected pool together)."""
    sem_theta: float = 0.7
    """Entry floor θ: no semantic entries unless the best cosine similarity reaches it; also the zero point of the similarity-sized depth."""
    sem_floor: bool = True
    """Apply the entry floor (off: always take the top-k, the ablation)."""
    sem_max_depth: int = 16
    """L_max: the longest chain copied from one neighbour."""
    sem_similarity_depth: bool = True
    """Size each chain by its similarity, clamp(round(L_max (s-θ)/(1-θ)), 1, L_max); off: by neighbour rank, L_max/(rank+1)."""
    sem_entry_budget: int = 16
    """Most tree nodes the semantic source may pay for per cycle (0: the source is off, the controlled pair)."""
    sem_entry_share: float = 0.25
    """...and at most this share of the cycle's node budget, so small (hardware-aware) budgets stay mostly lexical."""
    sem_index_prompt: bool = True
    """Also store a record for every prompt token (from the prefill), not only generated ones."""
    sem_key_dtype: str = "float16"
    """Storage of the keys: 'float16' or 'int8' (per-record scale; half the bytes)."""
    sem_max_records: int = 1_000_000
    """Records kept per tenant; the oldest requests are evicted beyond it."""
    sem_index: str = "auto"
    """Nearest-neighbour search: 'exact' (one matmul on the model's device), 'faiss' (HNSW, CPU) or 'auto' (FAISS on a CPU once the store holds sem_faiss_min_records)."""
    sem_faiss_min_records: int = 50_000
    """The exact/FAISS crossover for 'auto' (measured on a CPU: docs/RESULTS.md)."""
    sem_rejected_pool: bool = True
    """Keep and search the rejected-branch pool."""
    sem_rejected_capacity: int = 4096
    """Records in the rejected-branch ring buffer."""
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
        if self.sem_index not in ("exact", "faiss", "auto"):
            raise ValueError(f"sem_index must be 'exact', 'faiss' or 'auto', got {self.sem_index!r}")
        if not -1.0 <= self.sem_theta < 1.0:
            raise ValueError(f"sem_theta must be in [-1, 1), got {self.sem_theta}")
        if min(self.sem_top_k, self.sem_max_depth, self.sem_max_records, self.sem_rejected_depth) < 1:
            raise ValueError("sem_top_k, sem_max_depth, sem_max_records and sem_rejected_depth must be >= 1")
        if self.sem_entry_budget < 0 or self.sem_rejected_capacity < 0 or not 0 <= self.sem_entry_share <= 1:
            raise ValueError("sem_entry_budget and sem_rejected_capacity must be >= 0, sem_entry_share in [0, 1]")


class SemanticDrafter(Drafter):
    """A host drafter plus the semantic source. Subclasses set `host_class` and a Config that
    inherits both the host's config and SemanticConfig."""

    host_class: ClassVar[type[Drafter]]

    def __init__(self, config=None) -> None:
        super().__init__(config)
        host_config = self.host_class.Config(**{f.name: getattr(self.config, f.name)
                                                 for f in fields(self.host_class.Config)})
        self.host = self.host_class(host_config)
        self.needs_prefill = True  # the first query (and the prompt's records) come from the prefill
        self.prefill_topk = self.host.needs_prefill and self.host.prefill_topk
        self.stores: dict[str, TraceStore] = {}
        self.pools: dict[str, RejectedPool] = {}
        self.calibrators: dict[str, Calibrator] = {}
        self.cycle = 0  # stamps rejected records, so a cycle never retrieves its own

    # --- request lifecycle --------------------------------------------------------------------

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> None:
        super().start_request(request_id, prompt_ids, tenant)
        self.host.start_request(request_id, prompt_ids, tenant)
        cfg = self.config
        self.calibrator = self.calibrators.setdefault(tenant, Calibrator(
            cfg.sem_theta, cfg.sem_calib_target, cfg.sem_calib_alpha, cfg.sem_calib_gain))
        self.store = self.stores.get(tenant)
        if self.store is not None:
            self.store.begin_request()
        self.query: torch.Tensor | None = None  # unit state that predicted the anchor, [d]
        self.visible = len(self.store) if self.store is not None else 0
        self.request_neighbours: list[tuple[float, int]] | None = None  # granularity=request
        self.request_offset = (0, 0)  # (sequence length, evicted records) when it was taken
        self.paid: list[int] = []
        self.stats = dict(cycles=0, fired=0, retrieve_s=0.0, merge_s=0.0, harvest_s=0.0,
                          sem_paid=0, sem_paid_accepted=0)

    def stop_request(self, request_id: str) -> None:
        self.host.stop_request(request_id)
        super().stop_request(request_id)

    def _ensure_store(self, states: torch.Tensor) -> TraceStore:
        if self.store is None:
            cfg = self.config
            dim, device = states.shape[-1], states.device
            self.store = TraceStore(dim, device, cfg.sem_key_dtype, cfg.sem_max_records,
                                    cfg.sem_index, cfg.sem_faiss_min_records)
            self.store.begin_request()
            self.stores[self.tenant] = self.store
            self.pools[self.tenant] = RejectedPool(cfg.sem_rejected_capacity if cfg.sem_rejected_pool else 0,
                                                   dim, device)
        return self.store

    def _layer(self, hidden_states) -> torch.Tensor:
        if hidden_states is None:
            raise ConfigError(f"{self.name} keys its store by hidden states; "
                              "run the verifier with collect_hidden=True")
        try:
            return hidden_states[self.config.sem_layer]
        except IndexError:
            raise ConfigError(f"sem_layer={self.config.sem_layer} is out of range: the model exposes "
                              f"{len(hidden_states)} hidden states (0 = input embeddings)") from None

    def observe_prefill(self, observation: PrefillObservation) -> None:
        if self.host.needs_prefill:
            self.host.observe_prefill(observation)
        if not observation.tokens:
            return  # a one-token prompt: no state predicted the anchor
        t = time.perf_counter()
        states = self._layer(observation.hidden_states)  # [P, d]; row p predicted prompt[p + 1]
        store = self._ensure_store(states)
        self.query = normalise(states[-1:])[0]
        if self.config.sem_index_prompt:
            store.add(observation.tokens[1:] + [self.anchor], states)
            self.visible = len(store) - 1  # the anchor's own record is the query: not searchable
        else:
            self.visible = len(store)
        self.stats["harvest_s"] += time.perf_counter() - t

    def request_stats(self) -> dict:
        store = self.store
        return dict(self.stats, theta=self.calibrator.theta() if self.config.sem_self_calibrate
                    else self.config.sem_theta,
                    store_records=len(store) if store else 0,
                    bytes_per_record=store.bytes_per_record() if store else 0,
                    faiss=bool(store and store.uses_faiss()))

    def memory_bytes(self) -> int:
        return (self.host.memory_bytes() + sum(s.memory_bytes() for s in self.stores.values())
                + sum(p.memory_bytes() for p in self.pools.values()))

    # --- drafting -----------------------------------------------------------------------------

    def entry_budget(self, budget: int) -> int:
        """Nodes the semantic source may pay for in a cycle of `budget` nodes."""
        return min(self.config.sem_entry_budget, math.floor(self.config.sem_entry_share * budget))

    def propose(self, budget: int) -> DraftTree:
        tree = self.host.propose(budget)
        self.paid = []
        self.stats["cycles"] += 1
        entries = self.entry_budget(budget)
        if entries == 0 or len(tree) <= 1 or self.query is None:
            return tree  # the key extends lexical drafts; it never opens one
        t = time.perf_counter()
        chains = self.retrieve()
        t2 = time.perf_counter()
        self.stats["retrieve_s"] += t2 - t
        if chains:
            # The host's last-built (lowest-priority) nodes give way to the planned entries.
            planned = min(entries, sum(merge_cost(tree, chain) for _, chain in chains))
            tree = tree.truncated(max(1, min(len(tree), budget - planned)))
            self.paid = merge_chains(tree, chains, entries, budget)
            self.stats["fired"] += 1
            self.stats["sem_paid"] += len(self.paid)
        self.stats["merge_s"] += time.perf_counter() - t2
        return tree

    def retrieve(self) -> list[tuple[float, list[int]]]:
        """The semantic chains for this cycle, best first: (similarity, tokens)."""
        cfg, store = self.config, self.store
        calibrate = cfg.sem_self_calibrate
        theta = self.calibrator.theta() if calibrate else cfg.sem_theta
        max_depth = max(1, round(cfg.sem_max_depth * self.calibrator.depth_scale())) if calibrate \
            else cfg.sem_max_depth
        end = len(store)  # values may read anything committed
        if cfg.sem_granularity == "request":
            if self.request_neighbours is None:  # one query per request, at its first cycle
                sims, ids = store.search(self.query, cfg.sem_top_k, self.visible)
                self.request_neighbours = list(zip(sims, ids))
                self.request_offset = (len(self.sequence), store.evicted_records)
            # Each neighbour advances in step with this request's output.
            advance = len(self.sequence) - self.request_offset[0]
            shift = store.evicted_records - self.request_offset[1]
            found = []
            for sim, first in self.request_neighbours:
                first -= shift  # eviction renumbers records
                if first >= 0 and first + advance < min(store.segment_end(first), end):
                    found.append((sim, first + advance, False))
        else:
            sims, ids = store.search(self.query, cfg.sem_top_k, self.visible)
            found = [(s, r, False) for s, r in zip(sims, ids)]
            pool = self.pools[self.tenant]
            if cfg.sem_rejected_pool:
                rs, rids = pool.search(self.query, self.anchor, cfg.sem_top_k, self.cycle - 1)
                found += [(s, r, True) for s, r in zip(rs, rids)]
            found = sorted(found, key=lambda f: -f[0])[: cfg.sem_top_k]
        if not found or (cfg.sem_floor and found[0][0] < theta):
            return []
        chains = []
        for rank, (sim, record, rejected) in enumerate(found):
            depth = chain_depth(sim, theta, max_depth) if cfg.sem_similarity_depth \
                else rank_depth(rank, max_depth)
            chain = (self.pools[self.tenant].values[record][:depth] if rejected
                     else store.value(record, depth, end))
            if chain:
                chains.append((sim, chain))
        return chains

    # --- harvesting ---------------------------------------------------------------------------

    def observe(self, verification: Verification) -> None:
        self.host.observe(verification)
        super().observe(verification)
        t = time.perf_counter()
        ver, tree = verification, verification.tree
        states = self._layer(ver.hidden_states)  # [N, d]
        store = self._ensure_store(states)
        if self.paid:
            accepted = len(set(ver.path) & set(self.paid))
            self.stats["sem_paid_accepted"] += accepted
            self.calibrator.update(len(self.paid), accepted)
        # Committed token j was predicted by the state at node ([root] + path)[j].
        nodes = ([0] + ver.path)[: len(ver.committed)]
        before = len(store)
        store.add(ver.committed, states[nodes])
        self.visible = before  # this cycle's records wait one cycle
        self.query = normalise(states[nodes[-1]:nodes[-1] + 1])[0]
        if self.config.sem_rejected_pool and self.config.sem_entry_budget > 0:
            on_path = set(ver.path)
            rejected = [n for n in range(1, len(tree)) if n not in on_path]
            if rejected:
                preds = ver.argmax.tolist()
                depth = self.config.sem_rejected_depth
                values = [endorsed_continuation(tree, preds, n, depth) for n in rejected]
                parents = [tree.parents[n] for n in rejected]
                self.pools[self.tenant].add(states[parents], [tree.tokens[n] for n in rejected],
                                            values, self.cycle)
        self.cycle += 1
        self.stats["harvest_s"] += time.perf_counter() - t


@dataclass
class OilbirdConfig(SemanticConfig, GooseConfig):
    """Oilbird: GOOSE's two-source tree (GooseConfig fields) plus the semantic source (sem_* fields)."""

    def __post_init__(self) -> None:
        GooseConfig.__post_init__(self)
        SemanticConfig.__post_init__(self)


@dataclass
class OilbirdPLDConfig(SemanticConfig, PLDConfig):
    """The semantic source transplanted into prompt lookup (PLDConfig fields plus sem_* fields)."""

    def __post_init__(self) -> None:
        PLDConfig.__post_init__(self)
        SemanticConfig.__post_init__(self)


@dataclass
class OilbirdTRConfig(SemanticConfig, TokenRecyclingConfig):
    """The semantic source transplanted into Token Recycling (its fields plus sem_* fields)."""

    def __post_init__(self) -> None:
        TokenRecyclingConfig.__post_init__(self)
        SemanticConfig.__post_init__(self)


@register
class Oilbird(SemanticDrafter):
    """Oilbird: GOOSE host + semantic source."""

    name = "oilbird"
    Config = OilbirdConfig
    host_class = Goose


@register
class OilbirdPLD(SemanticDrafter):
    """The semantic source inside prompt lookup, at PLD's unchanged budget."""

    name = "oilbird-pld"
    Config = OilbirdPLDConfig
    host_class = PromptLookup


@register
class OilbirdTR(SemanticDrafter):
    """The semantic source inside Token Recycling, at TR's unchanged budget."""

    name = "oilbird-tr"
    Config = OilbirdTRConfig
    host_class = TokenRecycling
