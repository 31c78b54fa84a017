"""Oilbird: a lexical host drafter plus the semantic source, merged into one tree (ALGORITHMS.md §7).

Every cycle: the host (GOOSE for `oilbird`; PLD, Token Recycling or SuffixDecoding for the
transplants, oilbird/drafters/oilbird_transplants.py) builds its tree at the full node budget.
Where that tree drafts anything (the semantic key extends chains, it never opens one), the hidden state that predicted the anchor queries the tenant's trace store and
rejected-branch pool (oilbird/semantic_store.py); each neighbor offers the continuation that
followed it, with a copy depth sized by its similarity; the chains, best first, re-walk the host
tree from the root and pay only for the nodes where they diverge, within the semantic entry
budget (oilbird/semantic_merge.py). The host's last-built nodes give way so the total never
exceeds the node budget. The same verification forward supplies the records: each committed
token keyed by the state that predicted it, and each rejected node with the continuation the
model endorsed from it.

Visibility, one rule for both sources (strictly online):
- A record harvested by the forward of cycle c (a committed token in the trace store, a rejected
  node in the rejected pool) is searchable from the proposal of cycle c + 2 on: it skips exactly
  the next proposal, whose query is the state that predicted the new anchor, the key of one of
  those very records (it would find itself at similarity 1.0, above any floor).
- The prompt's records (harvested by the prefill) are searchable from the first proposal, except
  the anchor's own record, which is that proposal's query: it waits like a forward's record, as if
  the prefill were the forward of cycle -1.
- Every record of an earlier request is searchable from the next request's first proposal.
- A chain never reads past what is committed, nor from one request into another.
The rule is held per request, as a `Watermark` in its state: each source's `next_id` taken just
before the request's harvest adds its records. Record ids never shift, so the trace store's
eviction cannot expose the newest records (a bound counted in records would: eviction renumbers
them). When requests of one tenant run concurrently, a request's own newest records still skip
its next proposal, while records another request added before that harvest are searchable from
that very proposal, and those added after it from its following one. The trace store's segments
follow the request id (oilbird/semantic_store.py), so a value is cut where another request's
records intervene instead of splicing them in.

Cross-request state: one `SemanticMemory` per tenant in a `TenantMap`: the trace store (cap
`sem_max_records`, oldest requests evicted first), the rejected pool (a ring of
`sem_rejected_capacity` records, the oldest overwritten first) and the calibrator (constant
size); the host keeps its own per-tenant state. `drop_tenant` forgets both; a request of the
dropped tenant in flight keeps drafting from the memory it holds, and nothing re-creates the
tenant before its next request. Per request (`SemanticState`): the memory, watermark, query and
measurements; the host keeps its own state under the same request id.

External engines (vLLM) may give a partial prefill: only the state that predicted the anchor.
It becomes the first query, and the prompt is not indexed (`observe_prefill`).

Ablations are config fields (`sem_*`): entry budget 0 (the controlled pair), `sem_layer=0` (the
static input-embedding key), `sem_granularity=request` (one query per request), and
`sem_similarity_depth`, `sem_floor`, `sem_self_calibrate`, `sem_rejected_pool` off.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields
from typing import ClassVar

import torch

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.goose import Goose, GooseConfig
from oilbird.drafters.registry import register
from oilbird.errors import ConfigError
from oilbird.semantic_memory import SemanticConfig, SemanticMemory, Watermark
from oilbird.semantic_merge import chain_depth, endorsed_continuation, merge_chains, merge_cost, rank_depth
from oilbird.semantic_snapshot import memory_tensors, restore_memory
from oilbird.semantic_store import normalize
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification


def _new_stats() -> dict:
    return dict(cycles=0, fired=0, retrieve_s=0.0, merge_s=0.0, harvest_s=0.0, sem_paid=0, sem_paid_accepted=0)


@dataclass
class SemanticState(RequestState):
    """A request of a semantic drafter (the host keeps its own state of the same request id)."""

    memory: SemanticMemory | None = None
    """The tenant's memory, kept for the whole request: a drop of the tenant orphans it."""
    watermark: Watermark = field(default_factory=Watermark)
    """This request's visibility bound for its next proposal."""
    query: torch.Tensor | None = None
    """The unit state that predicted the anchor, [d]; None until a state did."""
    request_neighbors: list[tuple[float, int]] | None = None
    """granularity=request: the one query's neighbors, (similarity, record id)."""
    request_start: int = 0
    """Sequence length when the request's one query was made (granularity=request)."""
    paid: list[int] = field(default_factory=list)
    """The nodes the semantic source paid for in the last proposal."""
    stats: dict = field(default_factory=_new_stats)
    """The request's measurements (`request_stats`)."""


class SemanticDrafter(Drafter):
    """A host drafter plus the semantic source. Subclasses set `host_class` and a Config that
    inherits both the host's config and SemanticConfig.

    The host serves the same request ids: every lifecycle call is forwarded to it.
    """

    host_class: ClassVar[type[Drafter]]
    State = SemanticState

    def __init__(self, config=None) -> None:
        super().__init__(config)
        host_config = self.host_class.Config(**{f.name: getattr(self.config, f.name)
                                                 for f in fields(self.host_class.Config)})
        self.host = self.host_class(host_config)
        self.needs_prefill = True  # the first query (and the prompt's records) come from the prefill
        self.prefill_topk = self.host.needs_prefill and self.host.prefill_topk
        self.uses_topk = self.host.uses_topk  # the semantic source reads hidden states only
        self.hidden_layer = self.config.sem_layer  # the one hidden state the verifier computes for us
        self.memories: TenantMap[SemanticMemory] = TenantMap(lambda: SemanticMemory(self.config))

    # --- request lifecycle --------------------------------------------------------------------

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> SemanticState:
        state = super().start_request(request_id, prompt_ids, tenant)
        try:
            self.host.start_request(request_id, prompt_ids, tenant)
        except BaseException:
            self.requests.pop(request_id, None)
            raise
        state.memory = self.memories.get(tenant)
        if state.memory.store is not None:
            state.memory.store.begin_request(request_id)  # even if an earlier request had this id
        state.watermark = Watermark.all_of(state.memory)  # no earlier request holds this one's query
        return state

    def stop_request(self, request_id: str) -> SemanticState | None:
        self.host.stop_request(request_id)
        return super().stop_request(request_id)

    def drop_tenant(self, tenant: str) -> None:
        """Forget `tenant`'s semantic memory and the host's state of it (see Drafter.drop_tenant)."""
        super().drop_tenant(tenant)
        self.host.drop_tenant(tenant)

    def memory_bytes(self) -> int:
        """The tenants' semantic memories plus what the host keeps across requests."""
        return super().memory_bytes() + self.host.memory_bytes()

    def restrict_proposal(self, request_id: str, nodes: list[int]) -> None:
        """Renumber the semantic source's paid nodes into the chain the engine verifies (the
        calibrator compares them with the accepted path)."""
        self.host.restrict_proposal(request_id, nodes)
        state = self.state(request_id)
        paid = set(state.paid)
        state.paid = [i + 1 for i, node in enumerate(nodes) if node in paid]

    def snapshot_tenants(self) -> list[str]:
        """Tenants whose trace store holds records (the host's pools are rebuilt from text)."""
        return [t for t in self.memories.tenants() if memory_tensors(self.memories.peek(t))]

    def tenant_snapshot(self, tenant: str) -> dict:
        """The tenant's trace store as tensors (oilbird/semantic_snapshot.py); {} if it has none."""
        memory = self.memories.peek(tenant)
        return memory_tensors(memory) if memory is not None else {}

    def restore_tenant_snapshot(self, tenant: str, tensors: dict) -> None:
        """Load a trace store written by `tenant_snapshot` into the tenant's (empty) memory."""
        restore_memory(self.memories.get(tenant), tensors)

    def _layer(self, hidden: torch.Tensor | None) -> torch.Tensor:
        if hidden is None:
            raise ConfigError(f"{self.name} keys its store by hidden states; run the verifier "
                              f"with hidden_layer={self.hidden_layer} (the decode loop passes "
                              "the drafter's `hidden_layer`)")
        return hidden

    def observe_prefill(self, request_id: str, observation: PrefillObservation) -> None:
        """Take the first query from the prefill and, where it covers the prompt, index the prompt.

        A full observation holds a state per prefilled token (row p predicted prompt[p + 1]).
        A partial one (an external engine such as vLLM) holds fewer rows, typically just the
        last one (the state that predicted the anchor): that row is the first query and nothing
        of the prompt is indexed. Its top-k may be None (only the host may read it).
        """
        state = self.state(request_id)
        if self.host.needs_prefill:
            self.host.observe_prefill(request_id, observation)
        if not observation.tokens:
            return  # a one-token prompt: no state predicted the anchor
        t = time.perf_counter()
        states = self._layer(observation.hidden)  # [P, d] (full) or [<P, d] (partial)
        memory = state.memory
        store = memory.ensure(states)
        if len(states):
            state.query = normalize(states[-1:])[0]  # [d]
        indexed = self.config.sem_index_prompt and len(states) == len(observation.tokens)
        if indexed:
            # Positions a prefix cache reused were indexed with the earlier request that computed
            # them (same tokens, same states): adding them again would only grow the store (58%
            # of API-Bank's prompt tokens) and every later search, not add a draft.
            first = min(observation.reused, len(states) - 1)  # the newest record is this query's
            store.add((observation.tokens[1:] + [state.anchor])[first:], states[first:], owner=request_id)
        # The anchor's own record (the newest) is this query: it waits like a forward's record.
        state.watermark = Watermark.all_of(memory, but_newest=int(indexed))
        state.stats["harvest_s"] += time.perf_counter() - t

    def request_stats(self, request_id: str) -> dict:
        state = self.state(request_id)
        memory = state.memory
        store = memory.store if memory is not None else None
        theta = self.config.sem_theta
        if self.config.sem_self_calibrate and memory is not None:
            theta = memory.calibrator.theta()
        return dict(state.stats, theta=theta, store_records=len(store) if store else 0,
                    bytes_per_record=store.bytes_per_record() if store else 0,
                    lists=bool(store and store.uses_index()))

    # --- drafting -----------------------------------------------------------------------------

    def entry_budget(self, budget: int) -> int:
        """Nodes the semantic source may pay for in a cycle of `budget` nodes."""
        return min(self.config.sem_entry_budget, math.floor(self.config.sem_entry_share * budget))

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        tree = self.host.propose(request_id, budget)
        state.paid = []
        stats = state.stats
        stats["cycles"] += 1
        entries = self.entry_budget(budget)
        if entries == 0 or len(tree) <= 1 or state.query is None:
            return tree  # the key extends lexical drafts; it never opens one
        t = time.perf_counter()
        chains = self.retrieve(state)
        t2 = time.perf_counter()
        stats["retrieve_s"] += t2 - t
        if chains:
            # The host's last-built (lowest-priority) nodes give way to the planned entries.
            planned = min(entries, sum(merge_cost(tree, chain) for _, chain in chains))
            tree = tree.truncated(max(1, min(len(tree), budget - planned)))
            state.paid = merge_chains(tree, chains, entries, budget)
            stats["fired"] += 1
        stats["merge_s"] += time.perf_counter() - t2
        return tree

    def retrieve(self, state: SemanticState) -> list[tuple[float, list[int]]]:
        """The semantic chains of `state`'s request for this cycle, best first: (similarity, tokens)."""
        cfg, store, pool = self.config, state.memory.store, state.memory.pool
        calibrator = state.memory.calibrator
        theta = calibrator.theta() if cfg.sem_self_calibrate else cfg.sem_theta
        max_depth = cfg.sem_max_depth
        if cfg.sem_self_calibrate:
            max_depth = max(1, round(max_depth * calibrator.depth_scale()))
        found = self._request_neighbors(state) if cfg.sem_granularity == "request" \
            else self._position_neighbors(state)
        if not found or (cfg.sem_floor and found[0][0] < theta):
            return []
        chains = []
        for rank, (sim, record, rejected) in enumerate(found):
            depth = chain_depth(sim, theta, max_depth) if cfg.sem_similarity_depth \
                else rank_depth(rank, max_depth)
            # Values may read anything committed: the whole store (within the record's segment).
            chain = pool.values[record][:depth] if rejected else store.value(record, depth, len(store))
            if chain:
                chains.append((sim, chain))
        return chains

    def _position_neighbors(self, state: SemanticState) -> list[tuple[float, int, bool]]:
        """This cycle's query against both sources: (similarity, store index or pool slot, rejected)."""
        cfg, mark, memory = self.config, state.watermark, state.memory
        sims, indices = memory.store.search(state.query, cfg.sem_top_k, mark.trace)
        found = [(s, i, False) for s, i in zip(sims, indices)]
        if cfg.sem_rejected_pool:
            sims, slots = memory.pool.search(state.query, state.anchor, cfg.sem_top_k, mark.rejected)
            found += [(s, slot, True) for s, slot in zip(sims, slots)]
        return sorted(found, key=lambda f: -f[0])[: cfg.sem_top_k]

    def _request_neighbors(self, state: SemanticState) -> list[tuple[float, int, bool]]:
        """The request's one query (made at its first drafting cycle), each neighbor advanced in
        step with this request's output, within the neighbor's segment: (similarity, store index, False)."""
        store = state.memory.store
        if state.request_neighbors is None:
            sims, indices = store.search(state.query, self.config.sem_top_k, state.watermark.trace)
            state.request_neighbors = [(s, store.id_of(i)) for s, i in zip(sims, indices)]
            state.request_start = len(state.sequence)
        advance = len(state.sequence) - state.request_start
        found = []
        for sim, record_id in state.request_neighbors:
            index = store.index_of(record_id)  # ids survive eviction; a negative index was evicted
            if index >= 0 and index + advance < store.segment_end(index):
                found.append((sim, index + advance, False))
        return found

    # --- harvesting ---------------------------------------------------------------------------

    def observe(self, request_id: str, verification: Verification) -> SemanticState:
        """Harvest a forward of the request: its committed tokens (trace store) and, with the
        rejected pool on, its rejected nodes. Reads the argmax and hidden states, never the top-k
        (which may be None; only the host may read it)."""
        self.host.observe(request_id, verification)
        state = super().observe(request_id, verification)
        if verification.hidden is None:
            return state  # text only (a replay of the request log, oilbird/pool_state.py): the host's
        t = time.perf_counter()
        ver, memory = verification, state.memory
        states = self._layer(ver.hidden)  # [N, d]
        store = memory.ensure(states)
        if state.paid:  # counted here, after an engine's pruning ('fit', vLLM's chain) renumbered them
            accepted = len(set(ver.path) & set(state.paid))
            state.stats["sem_paid"] += len(state.paid)
            state.stats["sem_paid_accepted"] += accepted
            memory.calibrator.update(len(state.paid), accepted)
        # The visibility rule: this forward's records, about to be added to both sources, wait
        # for this request's proposal after next (its next query is one of their keys). Records
        # other requests add later wait for this request's next harvest.
        state.watermark = Watermark.all_of(memory)
        nodes = ([0] + ver.path)[: len(ver.committed)]  # committed token j was predicted by nodes[j]
        if nodes:
            store.add(ver.committed, states[nodes], owner=request_id)
            state.query = normalize(states[nodes[-1]:nodes[-1] + 1])[0]  # [d]
        if self.config.sem_rejected_pool and self.config.sem_entry_budget > 0:
            self._harvest_rejected(memory, ver, states)
        state.stats["harvest_s"] += time.perf_counter() - t
        return state

    def _harvest_rejected(self, memory: SemanticMemory, ver: Verification, states: torch.Tensor) -> None:
        """Add a record per rejected node: its parent's state [d], its token, the endorsed continuation."""
        tree, on_path = ver.tree, set(ver.path)
        rejected = [n for n in range(1, len(tree)) if n not in on_path]
        if not rejected:
            return
        preds = ver.argmax.tolist()
        depth = self.config.sem_rejected_depth
        values = [endorsed_continuation(tree, preds, n, depth) for n in rejected]
        parents = [tree.parents[n] for n in rejected]
        memory.pool.add(states[parents], [tree.tokens[n] for n in rejected], values)  # keys [m, d]


@dataclass
class OilbirdConfig(SemanticConfig, GooseConfig):
    """Oilbird: GOOSE's two-source tree (GooseConfig fields) plus the semantic source (sem_* fields)."""

    spine: str = "pool"
    """Where the spine comes from: 'pool' (the longest suffix match in the request and its
    tenant's past requests; ALGORITHMS.md §7 reads Oilbird's lexical key as a suffix automaton
    over the cross-request store) or 'context' (GOOSE's n-grams of the request's own text)."""
    spine_occurrence: str = "frequent"
    """Which continuation of the pool's match the spine follows: token by token the most frequent
    one ('frequent'), or the text after its first or most recent occurrence ('first', 'recent';
    `SAMConfig.occurrence`). 'frequent' with `spine_count_scores`, against 'first' on one cost
    curve (stop 61, docs/RESULTS.md): +4.6% tokens per priced second on 100 API-Bank requests,
    +1.9% on the make-bench slice, +1.7% on 52 Spec-Bench questions, +0.8% on Qwen-0.5B's 40."""
    spine_count_scores: bool = True
    """Score each spine node by the match's confidence times its path's probability under the
    pool's occurrence counts, so the 'fit' budget can tell a continuation the pool agrees on from
    one it saw once (`GooseConfig.spine_count_scores`)."""
    harvest_prefill: bool = False
    """Also fill the successor table from every prompt position's top-K (GOOSE's harvest). Off by default, as in Token Recycling's official code: on the make-bench slice it bought 2% of τ (3.36 against 3.29) for a 19% longer prefill, and Oilbird was faster without it (1.81x against 1.70x vs ar; docs/RESULTS.md)."""


@register
class Oilbird(SemanticDrafter):
    """Oilbird: GOOSE host + semantic source."""

    name = "oilbird"
    Config = OilbirdConfig
    host_class = Goose
