"""GOOSE: an anisotropic spine tree from two sources under one node budget (ALGORITHMS.md §6).

- *Spine*: a lexical chain from the request's own text (the context matcher: n-grams of 5, 4, 3
  tokens, earliest occurrence, up to 20 tokens), extended while it is confident, and cut to a
  length that grows with its confidence and with the observed spine acceptance (an EMA).
  With `spine='pool'` the chain comes instead from the longest suffix match in the request or
  its tenant's past requests (suffix automata, `oilbird/drafters/sam.py`), the reading of
  Oilbird's lexical key in ALGORITHMS.md §7; a match of m tokens gets the confidence of a
  context chain of m tokens. With `spine_count_scores` each spine node's score is that
  confidence times its path's probability under the pool's counts (`SAMConfig.count_scores`).
- *Branches*: successors from a two-tier successor table (bigram (prev, cur) first, then unigram
  cur) harvested from the target's top-K at every node of every forward, rejected nodes and the
  prefill included. Scores are the softmax over the top-K logits. (GOOSE calls it an adjacency
  table; it is a different structure from Token Recycling's `AdjacencyTable`.)
- One budget B' = 60 + floor(40·c): the spine takes floor(B'·r) nodes, then the rest is split
  between branches at the root and branches along the spine (weights 1/i), and grown breadth
  first to depth 6. Shared prefixes are paid once: a branch successor equal to the next spine
  token only adds its tag to the spine node.

Every node is tagged with the sources that proposed it: "pld" for the spine (it is prompt lookup)
and "tr" for table successors.

Cross-request state: one `SuccessorTable` per tenant (a `TenantMap`; oilbird/drafters/goose_table.py),
kept across requests and forgotten by `drop_tenant`; each tier holds at most `max_rows` rows and
evicts its least recently written row first, so a tenant's table holds at most 2 x `max_rows`
rows. Per-request state (the context matcher, the spine-acceptance EMA, the last spine) lives in
a `GooseState`, so one instance serves concurrent requests.

Without the target's top-K (an external engine may give only the argmax), a forward harvests its
nodes' known argmax as top-1 rows (see `verified_topk`), and a prefill without top-K harvests
nothing.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.goose_table import SuccessorTable
from oilbird.drafters.registry import register
from oilbird.drafters.sam import SAMConfig, SAMDrafter
from oilbird.drafters.token_recycling import verified_topk
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification

SPINE, BRANCH = "pld", "tr"


@dataclass
class GooseConfig:
    """GOOSE parameters (values of the GOOSE reference code)."""

    node_budget: int = 60
    """Base node budget B0 per forward (the decode loop's budget caps it further)."""
    budget_extension: int = 40
    """Extra nodes at full confidence: B' = node_budget + floor(c * budget_extension)."""
    max_branch_depth: int = 6
    """Only branch nodes shallower than this grow children."""
    top_k: int = 10
    """K: successors kept per successor-table row."""
    min_score: float = 0.01
    """Successors scoring below this are not drafted."""
    spine_branch_share: float = 0.5
    """Share of the branch budget spent along the spine (the rest goes under the root)."""
    max_chain: int = 20
    """Tokens copied per context match."""
    extended_chain: int = 100
    """Cap on a confidently extended chain: floor(c * extended_chain)."""
    ngram_sizes: str = "5,4,3"
    """N-gram sizes of the context matcher, tried longest first."""
    long_match: int = 8
    """Chains at least this long get confidence 0.7 to 0.9."""
    extension_confidence: float = 0.6
    """Chains above this confidence are extended by re-matching from their end."""
    consensus_min: int = 2
    """Occurrences, all followed by the same token, that make a match a consensus (c = 1)."""
    ema_alpha: float = 0.3
    """Weight of the newest cycle in the spine-acceptance EMA."""
    ema_init: float = 0.5
    """Spine-acceptance EMA at the start of a request."""
    use_bigram: bool = True
    """Consult the (prev, cur) tier before the unigram tier."""
    max_rows: int = 1_000_000
    """Cap on rows per tier (unigram, bigram) of each tenant's successor table; a write to a
    full tier evicts its least recently written row. About 1 KB per row at top_k = 10."""
    spine: str = "context"
    """Where the spine comes from: 'context' (GOOSE: n-grams of the request's own text) or 'pool'
    (the longest suffix match in the request and its tenant's past requests, as `sam` drafts)."""
    spine_occurrence: str = "first"
    """spine='pool': copy the spine from the first or the most recent occurrence of the match,
    or follow its most frequent continuation ('first', 'recent', 'frequent': `SAMConfig.occurrence`)."""
    spine_count_scores: bool = False
    """spine='pool': score each spine node by the confidence times its path's probability under
    the pool's occurrence counts, instead of the confidence alone (`SAMConfig.count_scores`)."""
    spine_live: bool = True
    """spine='pool': also match the committed text of the tenant's other requests in flight
    (`SAMConfig.live`): in an engine's batch a request drafts from the answers its neighbors
    are writing, as SuffixDecoding does. One request at a time it changes nothing."""
    harvest_prefill: bool = True
    """Also fill the successor table from every prompt position's top-K, as GOOSE does. It costs the full-vocabulary logits at every prompt position: a 20-50% slower prefill on a CPU (measured: docs/RESULTS.md)."""

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.node_budget < 1 or self.max_chain < 1 or self.max_rows < 1:
            raise ValueError("top_k, node_budget, max_chain and max_rows must be >= 1")
        if self.spine not in ("context", "pool"):
            raise ValueError(f"spine must be 'context' or 'pool', got {self.spine!r}")
        if self.spine_occurrence not in ("first", "recent", "frequent"):
            raise ValueError("spine_occurrence must be 'first', 'recent' or 'frequent', "
                             f"got {self.spine_occurrence!r}")
        if not self.ngrams():
            raise ValueError(f"ngram_sizes must list positive sizes, got {self.ngram_sizes!r}")

    def ngrams(self) -> tuple[int, ...]:
        sizes = sorted({int(x) for x in self.ngram_sizes.split(",") if x.strip()}, reverse=True)
        return tuple(n for n in sizes if n > 0)


# --- spine: the context matcher ------------------------------------------------------------

@dataclass
class _Occurrences:
    first: int  # earliest start with a following token
    count: int  # occurrences with a following token
    follower: int | None  # the token all occurrences are followed by, None once they disagree


class ContextMatcher:
    """N-gram index over one request's text: earliest occurrence, count and consensus follower."""

    def __init__(self, sizes: tuple[int, ...], consensus_min: int = 2) -> None:
        self.sizes = sizes
        self.consensus_min = consensus_min
        self.seq: list[int] = []
        self.table: dict[int, dict[tuple[int, ...], _Occurrences]] = {n: {} for n in sizes}

    def extend(self, tokens) -> None:
        for token in tokens:
            self.seq.append(int(token))
            end = len(self.seq) - 1  # n-grams ending before `end` now have a follower
            for n, table in self.table.items():
                start = end - n
                if start < 0:
                    continue
                key = tuple(self.seq[start:end])
                occ = table.get(key)
                if occ is None:
                    table[key] = _Occurrences(start, 1, self.seq[end])
                else:
                    occ.count += 1
                    if occ.follower != self.seq[end]:
                        occ.follower = None

    def match(self, text_tail: list[int], max_tokens: int) -> tuple[list[int], bool]:
        """Continuation of the longest n-gram ending `text_tail`, and whether it is a consensus."""
        for n in self.sizes:
            if len(text_tail) < n:
                continue
            occ = self.table[n].get(tuple(text_tail[-n:]))
            if occ is not None:
                chain = self.seq[occ.first + n:occ.first + n + max_tokens]
                return chain, occ.follower is not None and occ.count >= self.consensus_min
        return [], False


def chain_confidence(chain: list[int], consensus: bool, long_match: int = 8) -> float:
    """GOOSE's confidence c in [0, 1] of a context-matched chain."""
    if not chain:
        return 0.0
    if consensus:
        return 1.0
    length = len(chain)
    if length >= long_match:
        return min(0.9, 0.7 + 0.2 * (length - long_match) / 12)
    return 0.6 * length / long_match


def propose_spine(matcher: ContextMatcher, text: list[int], cfg: GooseConfig) -> tuple[list[int], float]:
    """The spine chain and its confidence, extended by re-matching while confident."""
    tail_len = max(cfg.ngrams())
    chain, consensus = matcher.match(text[-tail_len:], cfg.max_chain)
    c = chain_confidence(chain, consensus, cfg.long_match)
    if c > cfg.extension_confidence:
        limit = math.floor(cfg.extended_chain * c)
        while len(chain) < limit:
            tail = (text + chain)[-tail_len:]
            more, more_consensus = matcher.match(tail, cfg.max_chain)
            if not more:
                break
            chain.extend(more[: limit - len(chain)])
            if c == 1.0 and not more_consensus:
                break  # the first non-consensus proposal is kept, then extension stops
    return chain, c


# --- the tree ------------------------------------------------------------------------------

def build_goose_tree(anchor: int, prev_anchor: int | None, chain: list[int], c: float, ema: float,
                     table: SuccessorTable, cfg: GooseConfig, budget: int,
                     spine_probs: list[float] | None = None) -> tuple[DraftTree, list[int]]:
    """GOOSE's Algorithm 1. Returns the tree and the indices of its spine nodes.

    `spine_probs`, where given, scales each spine node's score (the confidence `c`) by its
    path's probability; it changes no node, only what the 'fit' budget reads."""
    total = min(budget, cfg.node_budget + math.floor(c * cfg.budget_extension))
    tree = DraftTree.root(anchor)
    r0 = 0.15 if ema < 0.2 else 0.30 if ema < 0.4 else 0.50
    r = r0 + c * (1 - r0)
    spine_len = min(len(chain), math.floor(total * r), total - 1)
    spine = []
    node = 0
    for i, token in enumerate(chain[:spine_len]):
        node = tree.add(node, token, SPINE, c if spine_probs is None else c * spine_probs[i])
        spine.append(node)

    def succ(parent: int) -> list[tuple[int, float]]:
        prev = tree.tokens[tree.parents[parent]] if parent > 0 else prev_anchor
        return table.successors(prev, tree.tokens[parent], cfg.use_bigram)

    queue: deque[tuple[int, float]] = deque()

    def attach(parent: int, allowance: int) -> int:
        """Attach up to `allowance` new successors under `parent`; returns how many were paid."""
        paid = 0
        for token, score in succ(parent):
            if paid >= allowance or len(tree) >= total or score < cfg.min_score:
                break
            existing = tree.child(parent, token)
            child = tree.add(parent, token, BRANCH, score)  # a spine match only gains the tag
            if existing is None:
                paid += 1
                if tree.depths[child] < cfg.max_branch_depth:
                    queue.append((child, score))
        return paid

    branch_budget = total - 1 - spine_len
    spine_share = max(1, math.floor(cfg.spine_branch_share * branch_budget)) if spine else 0
    spine_share = min(spine_share, branch_budget)
    attach(0, branch_budget - spine_share)
    if spine:
        weights = [1.0 / i for i in range(1, len(spine) + 1)]
        norm = sum(weights)
        left = spine_share
        for node, w in zip(spine, weights):
            if left <= 0:
                break
            left -= attach(node, min(left, max(1, math.floor(spine_share * w / norm))))
    while queue and len(tree) < total:
        node, score = queue.popleft()
        options = succ(node)
        remaining = total - len(tree)
        width = max(1, min(len(options), math.ceil(remaining * score)))
        width = min(width, max(1, cfg.top_k // tree.depths[node]))
        for token, s in options[:width]:
            if len(tree) >= total or s < cfg.min_score:
                break
            existing = tree.child(node, token)
            child = tree.add(node, token, BRANCH, score * s)
            if existing is None and tree.depths[child] < cfg.max_branch_depth:
                queue.append((child, score * s))
    return tree, spine


@dataclass
class GooseState(RequestState):
    """A GOOSE request: its tenant's table, its own text index, and its spine feedback."""

    table: SuccessorTable | None = None
    """The tenant's successor table, kept for the whole request: a drop of the tenant orphans it."""
    matcher: ContextMatcher | None = None
    """The context matcher over the request's committed sequence (spine='context' only)."""
    ema: float = 0.5
    """Spine-acceptance EMA (starts at `ema_init`)."""
    spine_nodes: list[int] = field(default_factory=list)
    """The spine's node indices in the last proposed tree (empty: no spine, or none proposed yet)."""


@register
class Goose(Drafter):
    """GOOSE: context-matched spine plus successor-table branches in one tree.

    One instance serves many requests (keyed by id); each request's tenant selects its table.
    """

    name = "goose"
    Config = GooseConfig
    State = GooseState
    needs_prefill = True  # the successor table harvests every prompt position too (configurable)
    uses_topk = True  # the successor table's branches are the verifier's top-k

    def __init__(self, config: GooseConfig | None = None) -> None:
        super().__init__(config)
        self.needs_prefill = self.config.harvest_prefill
        cfg = self.config
        # One table per tenant: no cross-tenant drafts.
        self.tables: TenantMap[SuccessorTable] = TenantMap(
            lambda: SuccessorTable(cfg.max_rows, cfg.top_k))
        # spine='pool': a SAM drafter serves the same request ids as the spine's source.
        self.pool_spine = SAMDrafter(SAMConfig(max_candidates=1, occurrence=cfg.spine_occurrence,
                                               count_scores=cfg.spine_count_scores,
                                               live=cfg.spine_live)) \
            if cfg.spine == "pool" else None

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> GooseState:
        state = super().start_request(request_id, prompt_ids, tenant)
        # The request keeps its table: a drop_tenant while it runs orphans it rather than
        # breaking the request, and nothing re-creates the tenant until its next request.
        state.table = self.tables.get(tenant)
        if self.pool_spine is None:  # spine='pool' never reads the context matcher
            state.matcher = ContextMatcher(self.config.ngrams(), self.config.consensus_min)
            state.matcher.extend(prompt_ids)
        state.ema = self.config.ema_init
        if self.pool_spine is not None:
            try:
                self.pool_spine.start_request(request_id, prompt_ids, tenant)
            except BaseException:
                self.requests.pop(request_id, None)
                raise
        return state

    def stop_request(self, request_id: str) -> GooseState | None:
        if self.pool_spine is not None:
            self.pool_spine.stop_request(request_id)  # the request joins the spine's pool
        return super().stop_request(request_id)

    def drop_tenant(self, tenant: str) -> None:
        super().drop_tenant(tenant)
        if self.pool_spine is not None:
            self.pool_spine.drop_tenant(tenant)

    def memory_bytes(self) -> int:
        return super().memory_bytes() + (self.pool_spine.memory_bytes() if self.pool_spine else 0)

    def observe_prefill(self, request_id: str, observation: PrefillObservation) -> None:
        """Harvest the prompt positions' top-K into the request's table.

        Rows align with the *last* prefilled tokens when the observation holds fewer rows than
        tokens (a partial prefill); without top-K (None) nothing is harvested.
        """
        state = self.state(request_id)
        ids, logits = observation.topk_ids, observation.topk_logits
        if ids is None or logits is None:
            return
        tokens = observation.tokens
        prevs = [None] + tokens[:-1]
        rows = min(len(tokens), len(ids))  # a full prefill has a row per token
        first = len(tokens) - rows
        state.table.harvest(tokens[first:], prevs[first:], ids[len(ids) - rows:],
                            logits[len(ids) - rows:], self.config.top_k)

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        probs = None
        if self.pool_spine is None:
            chain, c = propose_spine(state.matcher, state.sequence, self.config)
        else:
            chain, matched, probs = self.pool_spine.longest_match(request_id, budget - 1)
            c = chain_confidence([0] * matched, False, self.config.long_match) if chain else 0.0
        prev = state.sequence[-2] if len(state.sequence) > 1 else None
        tree, state.spine_nodes = build_goose_tree(state.anchor, prev, chain, c, state.ema,
                                                   state.table, self.config, budget, probs)
        return tree

    def restrict_proposal(self, request_id: str, nodes: list[int]) -> None:
        """Renumber the spine's nodes into the chain the engine verifies (the EMA counts them)."""
        state = self.state(request_id)
        spine = set(state.spine_nodes)
        state.spine_nodes = [i + 1 for i, node in enumerate(nodes) if node in spine]

    def observe(self, request_id: str, verification: Verification) -> GooseState:
        """Harvest every verified node's top-K (or known argmax), update the spine EMA, and
        extend the request's sequence and matcher with the committed tokens."""
        state = self.state(request_id)
        tree = verification.tree
        nodes, ids, logits = verified_topk(verification)
        parents = tree.parents
        prevs = [tree.tokens[parents[n]] if n > 0 else None for n in nodes]  # the root's key uses none
        state.table.harvest([tree.tokens[n] for n in nodes], prevs, ids, logits, self.config.top_k)
        if state.spine_nodes:
            accepted = len(set(verification.path) & set(state.spine_nodes))
            rate = accepted / len(state.spine_nodes)
            state.ema = self.config.ema_alpha * rate + (1 - self.config.ema_alpha) * state.ema
        super().observe(request_id, verification)
        if self.pool_spine is None:
            state.matcher.extend(verification.committed)
        else:
            self.pool_spine.observe(request_id, verification)
        return state
