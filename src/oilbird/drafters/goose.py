"""GOOSE: an anisotropic spine tree from two sources under one node budget (ALGORITHMS.md §6).

- *Spine*: a lexical chain from the request's own text (the context matcher: n-grams of 5, 4, 3
  tokens, earliest occurrence, up to 20 tokens), extended while it is confident, and cut to a
  length that grows with its confidence and with the observed spine acceptance (an EMA).
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

Cross-request state: one `SuccessorTable` per tenant (a `TenantMap`), kept across requests and
forgotten by `drop_tenant`. Each tier holds at most `max_rows` rows; a write to a full tier evicts
the tier's least recently *written* row first (a row moves to the newest end whenever it is
overwritten; reading a row does not refresh it). So a tenant's table holds at most
2 x `max_rows` rows, about `SuccessorTable.memory_bytes()` bytes.
"""

from __future__ import annotations

import math
from collections import OrderedDict, deque
from dataclasses import dataclass

import torch

from oilbird.drafters.base import Drafter
from oilbird.drafters.registry import register
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
    harvest_prefill: bool = True
    """Also fill the successor table from every prompt position's top-K, as GOOSE does. It costs the full-vocabulary logits at every prompt position: a 20-50% slower prefill on a CPU (measured: docs/RESULTS.md)."""

    def __post_init__(self) -> None:
        if self.top_k < 1 or self.node_budget < 1 or self.max_chain < 1 or self.max_rows < 1:
            raise ValueError("top_k, node_budget, max_chain and max_rows must be >= 1")
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


# --- branches: the two-tier successor table -------------------------------------------------

Row = tuple[list[int], list[float]]
"""A successor row: the target's top-k ids, best first, and their softmax scores."""


class SuccessorTable:
    """Successors harvested from the target's top-K: unigram cur -> row, bigram (prev, cur) -> row.

    Each tier is capped at `max_rows` rows and evicts its least recently written row first (see
    the module docstring).

    Args:
        max_rows: the most rows per tier.
        top_k: the row width the harvests use; only sizes the `memory_bytes` estimate.

    Raises:
        ValueError: if `max_rows` is below 1.
    """

    def __init__(self, max_rows: int = 1_000_000, top_k: int = 10) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.top_k = top_k
        # OrderedDict, not dict: evicting the oldest row of a plain dict rescans the deleted
        # slots at its front, which turns a full table's every write into O(rows).
        self.unigram: OrderedDict[int, Row] = OrderedDict()
        self.bigram: OrderedDict[tuple[int, int], Row] = OrderedDict()
        self.evicted_rows = 0
        """Rows evicted by the cap so far (both tiers)."""

    def harvest(self, tokens: list[int], prevs: list[int | None], topk_ids: torch.Tensor,
                topk_logits: torch.Tensor, k: int) -> None:
        """Record each position's top-k (last occurrence wins; the cap evicts the oldest rows).

        Args:
            tokens: token at each position.
            prevs: the token before each position (None: no bigram key).
            topk_ids, topk_logits: [n, >=k] the target's top-k at each position.
            k: the row width to keep.
        """
        ids = topk_ids[:, :k].tolist()
        scores = torch.softmax(topk_logits[:, :k].float(), dim=-1).tolist()  # within top-k
        for token, prev, row_ids, row_scores in zip(tokens, prevs, ids, scores):
            entry = (row_ids, row_scores)  # one pair shared by both tiers until overwritten
            self._write(self.unigram, token, entry)
            if prev is not None:
                self._write(self.bigram, (prev, token), entry)

    def _write(self, tier: OrderedDict, key, entry: Row) -> None:
        tier[key] = entry
        tier.move_to_end(key)  # an overwrite makes the row the most recently written
        if len(tier) > self.max_rows:
            tier.popitem(last=False)
            self.evicted_rows += 1

    def successors(self, prev: int | None, token: int, use_bigram: bool) -> list[tuple[int, float]]:
        """The (id, score) successors of `token`: the bigram row first, else the unigram row.

        Args:
            prev: the token before `token` (None: unigram only).
            token: the token whose successors are wanted.
            use_bigram: whether to consult the bigram tier.

        Returns:
            (successor id, score) pairs, best first; empty when neither tier has a row.
        """
        entry = self.bigram.get((prev, token)) if use_bigram and prev is not None else None
        if entry is None:
            entry = self.unigram.get(token)
        return list(zip(*entry)) if entry else []

    def __len__(self) -> int:
        """Rows in both tiers."""
        return len(self.unigram) + len(self.bigram)

    def memory_bytes(self) -> int:
        """Approximate bytes held: both tiers' rows at a per-row estimate (`_row_bytes`).

        Returns:
            The estimate; at most 2 x max_rows x `_row_bytes(top_k)`.
        """
        return len(self) * _row_bytes(self.top_k)


def _row_bytes(k: int) -> int:
    """Estimated bytes per successor-table row of width k (CPython, 64-bit).

    A row costs its OrderedDict slot and link node (~100), its key (an int, or a 2-tuple of
    ints, ~70), the 2-tuple pairing its lists (~56) and the lists: ids (56 + 8k, 32 per int
    object) and scores (56 + 8k, 24 per float). A harvest shares one pair between the two tiers,
    so counting it in full per row errs high. Measured with tracemalloc at k = 10: 1,010 bytes
    per row with no pair shared, 623 with every pair shared; this gives 1,058.
    """
    return 170 + 56 + 2 * 56 + (8 + 32 + 8 + 24) * k


# --- the tree ------------------------------------------------------------------------------

def build_goose_tree(anchor: int, prev_anchor: int | None, chain: list[int], c: float, ema: float,
                     table: SuccessorTable, cfg: GooseConfig, budget: int) -> tuple[DraftTree, list[int]]:
    """GOOSE's Algorithm 1. Returns the tree and the indices of its spine nodes."""
    total = min(budget, cfg.node_budget + math.floor(c * cfg.budget_extension))
    tree = DraftTree.root(anchor)
    r0 = 0.15 if ema < 0.2 else 0.30 if ema < 0.4 else 0.50
    r = r0 + c * (1 - r0)
    spine_len = min(len(chain), math.floor(total * r), total - 1)
    spine = []
    node = 0
    for token in chain[:spine_len]:
        node = tree.add(node, token, SPINE, c)
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


@register
class Goose(Drafter):
    """GOOSE: context-matched spine plus successor-table branches in one tree."""

    name = "goose"
    Config = GooseConfig
    needs_prefill = True  # the successor table harvests every prompt position too (configurable)

    def __init__(self, config: GooseConfig | None = None) -> None:
        super().__init__(config)
        self.needs_prefill = self.config.harvest_prefill
        cfg = self.config
        # One table per tenant: no cross-tenant drafts.
        self.tables: TenantMap[SuccessorTable] = TenantMap(
            lambda: SuccessorTable(cfg.max_rows, cfg.top_k))
        self.spine_nodes: list[int] = []

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> None:
        super().start_request(request_id, prompt_ids, tenant)
        # The request keeps its table: a drop_tenant while it runs orphans it rather than
        # breaking the request, and nothing re-creates the tenant until its next request.
        self.table = self.tables.get(tenant)
        self.matcher = ContextMatcher(self.config.ngrams(), self.config.consensus_min)
        self.matcher.extend(prompt_ids)
        self.ema = self.config.ema_init
        self.spine_nodes = []

    def observe_prefill(self, observation: PrefillObservation) -> None:
        tokens = observation.tokens
        prevs = [None] + tokens[:-1]
        self.table.harvest(tokens, prevs, observation.topk_ids, observation.topk_logits,
                           self.config.top_k)

    def propose(self, budget: int) -> DraftTree:
        chain, c = propose_spine(self.matcher, self.sequence, self.config)
        prev = self.sequence[-2] if len(self.sequence) > 1 else None
        tree, self.spine_nodes = build_goose_tree(self.anchor, prev, chain, c, self.ema,
                                                  self.table, self.config, budget)
        return tree

    def observe(self, verification: Verification) -> None:
        tree = verification.tree
        prevs = [None] + [tree.tokens[p] for p in tree.parents[1:]]  # the root's key uses none
        self.table.harvest(tree.tokens, prevs, verification.topk_ids, verification.topk_logits,
                           self.config.top_k)
        if self.spine_nodes:
            accepted = len(set(verification.path) & set(self.spine_nodes))
            rate = accepted / len(self.spine_nodes)
            self.ema = self.config.ema_alpha * rate + (1 - self.config.ema_alpha) * self.ema
        super().observe(verification)
        self.matcher.extend(verification.committed)
