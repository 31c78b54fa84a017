"""Token Recycling (ALGORITHMS.md §5).

Contract:

* State: an adjacency table `A` mapping a token id to the top-k token ids the target predicted
  after it the last time that token was an input of a verification forward. Rows are written
  only by `observe`; a row that was never written is *unobserved* and proposes nothing (the
  official code starts from zeros and would propose token 0; we skip such rows, as GOOSE-ref does).
* Draft: the static "2.2.2" template (80 draft nodes, depth 6) is filled level by level,
  `token[child] = A[token[parent]][rank]`, starting from the anchor. A child whose parent's row is
  unobserved (or too short for its rank) is skipped, and with it its whole subtree. The tree holds
  at most `budget` nodes, root included; the template is breadth-first, so a small budget keeps
  the shallow nodes.
* Update: after every verification forward, for every node `n` of the verified tree (rejected
  ones included), `A[token[n]] = topk_ids[n, :k]`. When a token occurs at several nodes of one
  tree, the last node wins.
* Persistence: the table outlives requests (the official code never resets it), but there is one
  table per *tenant* (a `TenantMap`), so one tenant's traffic never reaches another tenant's
  drafts; `drop_tenant` forgets a tenant's table.
* Cap: a table holds at most `max_rows` rows. A write of a new row to a full table evicts the
  least recently *written* row first (an overwritten row moves to the newest end; reading a row
  does not refresh it). The vocabulary already bounds the table, so the default cap (1,000,000)
  never binds for the vocabularies we serve; it only states the bound (`memory_bytes`).
* Without top-k: an external engine (vLLM) may hand a `Verification` whose `topk_ids` is None.
  The update then writes, for every node whose argmax is known (>= 0), the one-id row
  [argmax] (`verified_topk`): the template then drafts only rank-0 children, a chain.
* Requests: one drafter serves many requests at once, keyed by id; a request's `TokenRecyclingState`
  holds its sequence and its tenant's table (nothing of a request stays on the instance).
* The prefill is not harvested, as in the official TR code (SAMD's TR and GOOSE-ref do harvest
  every prompt position): `needs_prefill` stays False, so no prompt-position top-k is computed
  for this drafter. A fresh tenant's table is therefore empty, and its first forward drafts
  nothing.

Representation: the table is an ordered dict `token id -> list of up to k ids` rather than a
`[V, k]` array. The drafter does not know V, membership doubles as the observed mask, the order
is the eviction order, and last-wins is simply what assignment in node order does (numpy fancy
assignment leaves the winner among duplicate indices unspecified). Drafting is a Python loop over
at most 80 nodes either way, and a numpy table measured no faster (about 48 µs per full 81-node
propose with either, over half of it in `DraftTree.add`). An update costs one `.tolist()` of the
[N, k] top-k (one device transfer) plus N stores and moves to the end: about 21 µs for N = 81
on CPU (15 µs with a plain dict, which cannot evict its oldest row in O(1)).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import torch

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.registry import register
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import Verification

RankPath = tuple[int, ...]
"""A template node: the child ranks along its path from the root (the root itself is ())."""

# The published "2.2.2" template, written as parent rank-path -> number of children (ranks
# 0..n-1). 8/21/25/15/8/3 nodes at depths 1..6; 80 in all.
_SPEC_2_2_2: dict[RankPath, int] = {
    (): 8,
    (0,): 8, (1,): 4, (2,): 3, (3,): 2, (4,): 1, (5,): 1, (6,): 1, (7,): 1,
    (0, 0): 8, (0, 1): 3, (0, 2): 2, (0, 3): 1, (0, 4): 1, (0, 5): 1, (0, 6): 1, (0, 7): 1,
    (1, 0): 2, (1, 1): 1, (2, 0): 1, (3, 0): 1, (4, 0): 1, (5, 0): 1,
    (0, 0, 0): 5, (0, 0, 1): 2, (0, 0, 2): 1, (0, 0, 3): 1, (0, 0, 4): 1,
    (0, 1, 0): 1, (0, 2, 0): 1, (1, 0, 0): 1, (2, 0, 0): 1, (3, 0, 0): 1,
    (0, 0, 0, 0): 3, (0, 0, 0, 1): 1, (0, 0, 0, 2): 1, (0, 0, 1, 0): 1, (0, 1, 0, 0): 1,
    (1, 0, 0, 0): 1,
    (0, 0, 0, 0, 0): 2, (0, 0, 0, 1, 0): 1,
}

_TEMPLATE_SPECS: dict[str, dict[RankPath, int]] = {"2.2.2": _SPEC_2_2_2}


@dataclass
class TokenRecyclingConfig:
    """Token Recycling parameters (TR defaults)."""

    top_k: int = 8
    """k: adjacency row width, the target's top ids kept per row (VerifierConfig.top_k must be
    at least this; template ranks beyond a row's width are skipped)."""
    template: str = "2.2.2"
    """Name of the static tree template filled from the table (80 draft nodes, depth 6)."""
    max_rows: int = 1_000_000
    """Cap on rows of each tenant's adjacency table; a new row written to a full table evicts
    the least recently written one. The vocabulary bounds the table anyway (about 0.5 KB per row
    at top_k = 8)."""

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {self.max_rows}")
        if self.template not in _TEMPLATE_SPECS:
            raise ValueError(f"unknown template {self.template!r}; known templates: "
                             f"{', '.join(sorted(_TEMPLATE_SPECS))}")


def template_paths(name: str = "2.2.2") -> list[RankPath]:
    """The draft nodes of template `name` as rank-paths, in breadth-first order.

    All depth-1 nodes come first, then all depth-2 nodes, and so on; within a depth, nodes follow
    their parents' order, then rank. So parents always precede children, and any prefix is a
    valid template that keeps the shallow nodes.

    Args:
        name: a known template name ("2.2.2").

    Returns:
        The rank-paths of the draft nodes (the root, (), is not listed).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    try:
        spec = _TEMPLATE_SPECS[name]
    except KeyError:
        raise ValueError(f"unknown template {name!r}; known templates: "
                         f"{', '.join(sorted(_TEMPLATE_SPECS))}") from None
    paths: list[RankPath] = []
    frontier: list[RankPath] = [()]
    while frontier:
        level = [parent + (rank,) for parent in frontier for rank in range(spec.get(parent, 0))]
        paths.extend(level)
        frontier = level
    return paths


def template_plan(paths: Sequence[RankPath]) -> list[tuple[int, int]]:
    """Per template node, (parent slot, rank), where slot 0 is the root and slot i+1 is paths[i].

    Precomputed once so drafting needs no tuple lookups.

    Raises:
        ValueError: if a node's parent is not listed before it.
    """
    slot = {(): 0}
    plan = []
    for i, path in enumerate(paths):
        parent = path[:-1]
        if parent not in slot:
            raise ValueError(f"template node {path} comes before its parent {parent}")
        plan.append((slot[parent], path[-1]))
        slot[path] = i + 1
    return plan


class AdjacencyTable:
    """The TR adjacency table: token id -> the target's top-k next ids, best first.

    An ordered dict of rows (see the module docstring for why not a [V, k] array); a token
    without a row is unobserved. At most `max_rows` rows: a new row written to a full table
    evicts the least recently written row.

    Args:
        k: the most ids a row keeps.
        max_rows: the most rows the table keeps.

    Raises:
        ValueError: if `max_rows` is below 1.
    """

    def __init__(self, k: int, max_rows: int = 1_000_000) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.k = k
        self.max_rows = max_rows
        # OrderedDict, not dict: evicting the oldest row of a plain dict rescans the deleted
        # slots at its front, which would make every write to a full table O(rows).
        self.rows: OrderedDict[int, list[int]] = OrderedDict()
        self.evicted_rows = 0
        """Rows evicted by the cap so far."""

    def __len__(self) -> int:
        """The number of observed rows."""
        return len(self.rows)

    def observed(self, token: int) -> bool:
        """Whether `token`'s row was ever written (and not evicted since)."""
        return token in self.rows

    def row(self, token: int) -> list[int] | None:
        """`token`'s row (best first), or None when unobserved."""
        return self.rows.get(token)

    def update(self, tokens, topk_ids) -> None:
        """Overwrite row tokens[n] with topk_ids[n, :k] for every n; on duplicates the last wins.

        Each written row becomes the most recently written; beyond `max_rows` the least recently
        written rows are evicted.

        Args:
            tokens: [N] input token ids of one forward (a list, or a tensor / array).
            topk_ids: [N, >=1] the target's top ids at each of those inputs, best first
                (a tensor / array, converted once, or nested lists).

        Raises:
            ValueError: if the two lengths differ.
        """
        if hasattr(tokens, "tolist"):
            tokens = tokens.tolist()  # tensor elements would hash by identity, not value
        if hasattr(topk_ids, "tolist"):
            topk_ids = topk_ids[:, : self.k].tolist()  # one conversion (and transfer) per forward
        else:
            topk_ids = [list(r[: self.k]) for r in topk_ids]
        if len(tokens) != len(topk_ids):
            raise ValueError(f"{len(tokens)} tokens but {len(topk_ids)} top-k rows")
        rows = self.rows
        for token, ids in zip(tokens, topk_ids):  # in node order, so the last duplicate wins
            rows[token] = ids
            rows.move_to_end(token)  # an overwrite makes the row the most recently written
        while len(rows) > self.max_rows:  # once per forward: the same rows survive as per write
            rows.popitem(last=False)
            self.evicted_rows += 1

    def memory_bytes(self) -> int:
        """Approximate bytes held (CPython, 64-bit).

        Per row: its OrderedDict slot and link node (~100), the key int (32) and a k-id list
        (56 + 8k, 32 per int object). Measured with tracemalloc at k = 8: 498 bytes per row
        against this estimate's 508.

        Returns:
            The estimate, at most max_rows times the per-row bytes.
        """
        return len(self.rows) * (100 + 32 + 56 + (8 + 32) * self.k)


def draft_from_table(anchor: int, table: AdjacencyTable, plan: Sequence[tuple[int, int]],
                     budget: int, source: str = "tr") -> DraftTree:
    """Fill a template from the table, level by level, within `budget` nodes.

    token[child] = row(token[parent])[rank]. A slot whose parent slot was skipped, whose parent's
    row is unobserved, or whose rank is beyond the row's width is skipped, and so is its subtree.
    Node score = product over the path of 1 / (1 + rank): 1/2 for a rank-1 child of a rank-0
    child, and so on, a cheap stand-in for the path's probability that only decreases with depth
    and rank (the verifier ignores it; merging drafters may rank by it).

    Args:
        anchor: the root token (the last committed token).
        table: the adjacency table to read.
        plan: `template_plan(template_paths(...))`.
        budget: the most nodes in the tree, root included (<= 1 gives the root only).
        source: source tag for the drafted nodes.

    Returns:
        A DraftTree with at most `budget` nodes; siblings holding the same token are merged.
    """
    tree = DraftTree.root(anchor)
    if budget <= 1:
        return tree
    rows = table.rows
    # Per slot (0 = root, i+1 = plan[i]): the tree node holding it, its row (None = draft nothing
    # below it) and its score. Skipped slots get node -1 and row None, so their subtrees vanish.
    slot_node = [0]
    slot_row = [rows.get(anchor)]
    slot_score = [1.0]
    for parent_slot, rank in plan:
        row = slot_row[parent_slot]
        if row is None or rank >= len(row):
            slot_node.append(-1)
            slot_row.append(None)
            slot_score.append(0.0)
            continue
        token = row[rank]
        score = slot_score[parent_slot] / (1 + rank)
        slot_node.append(tree.add(slot_node[parent_slot], token, source, score))
        slot_row.append(rows.get(token))
        slot_score.append(score)
        if len(tree) >= budget:
            break
    return tree


def verified_topk(verification: Verification) -> tuple[list[int], torch.Tensor, torch.Tensor]:
    """What one forward predicted after each verified node, as top-k rows.

    With top-k (the verifier's own forwards): every node of the tree and `topk_ids` unchanged
    (one row per node), with `topk_logits` (zeros if only those are missing). Without
    (`topk_ids` None, as an external engine may give): only the nodes whose argmax is known
    (>= 0; the engine marks the rest -1), each with its argmax as a one-id row and logit 0 (a
    softmax over the row scores it 1.0).

    Returns:
        (nodes ascending, ids [len(nodes), k'], logits [len(nodes), k']).
    """
    ids = verification.topk_ids
    if ids is not None:
        logits = verification.topk_logits
        return (list(range(len(verification.tree))), ids,
                logits if logits is not None else torch.zeros(ids.shape))
    argmax = torch.as_tensor(verification.argmax).reshape(-1)
    nodes = torch.nonzero(argmax >= 0).flatten()
    ids = argmax[nodes].unsqueeze(1)  # [n, 1]
    return nodes.tolist(), ids, torch.zeros(ids.shape)


@dataclass
class TokenRecyclingState(RequestState):
    """A TR request: its tenant's adjacency table, held for the whole request."""

    table: AdjacencyTable | None = None
    """A drop of the tenant while the request runs orphans this table rather than breaking it."""


@register
class TokenRecycling(Drafter):
    """TR: a static template filled from the target's recycled top-k predictions, one table per tenant.

    One instance serves many requests (keyed by id); each request drafts from its tenant's table.
    """

    name = "tr"
    Config = TokenRecyclingConfig
    State = TokenRecyclingState
    uses_topk = True  # the adjacency rows are the verifier's top-k

    def __init__(self, config: TokenRecyclingConfig | None = None) -> None:
        super().__init__(config)
        self.plan = template_plan(template_paths(self.config.template))
        cfg = self.config
        # tenant -> its table, kept across requests
        self.tables: TenantMap[AdjacencyTable] = TenantMap(
            lambda: AdjacencyTable(cfg.top_k, cfg.max_rows))

    def start_request(self, request_id: str, prompt_ids: list[int],
                      tenant: str = "default") -> TokenRecyclingState:
        state = super().start_request(request_id, prompt_ids, tenant)
        # The request keeps its table: a drop_tenant while it runs orphans it, and nothing
        # re-creates the tenant before its next request. The prompt is not harvested (official TR).
        state.table = self.tables.get(tenant)
        return state

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        return draft_from_table(state.anchor, state.table, self.plan, budget, self.name)

    def observe(self, request_id: str, verification: Verification) -> TokenRecyclingState:
        """Extend the request's sequence and write every verified node's row (see the module
        docstring; without top-k, the known argmax as a one-id row)."""
        state = super().observe(request_id, verification)
        nodes, ids, _ = verified_topk(verification)
        tokens = verification.tree.tokens
        state.table.update([tokens[n] for n in nodes] if verification.topk_ids is None else tokens, ids)
        return state
