"""Drafting below a matched suffix-tree position: the most frequent path, or a best-first tree.

Contract: given a node of `SuffixTree` and how far into its edge a context match reached, draft
at most `budget` tokens whose estimated probability (the product of count ratios along the path)
is at least `min_prob`, as a `Speculation` whose parents come before their children. The tree
only reads nodes here (`count`, `children`, `length`, `seq`, `start`); it is never changed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from heapq import heappop, heappush


@dataclass(slots=True)
class Speculation:
    """A drafted continuation, ready for tree verification (ALGORITHMS.md §1)."""

    token_ids: list[int] = field(default_factory=list)
    """Drafted tokens; a parent always comes before its children."""
    parents: list[int] = field(default_factory=list)
    """Index into `token_ids` of each token's parent; -1 for a child of the (virtual) root."""
    probs: list[float] = field(default_factory=list)
    """Estimated probability of each token's whole path, product of count ratios."""
    score: float = 0.0
    """Sum of `probs`: the expected number of accepted tokens under the count model."""
    match_len: int = 0
    """Context suffix length m whose match produced this draft (0 for an empty draft)."""


def draft_path(node, idx: int, budget: int, min_prob: float) -> Speculation:
    """Follow the most frequent child (ties: smaller token id) while prob >= min_prob.

    Args:
        node: the matched `SuffixTree` node; `idx`: tokens of its edge the match consumed.
        budget: the most tokens to draft.
        min_prob: drafted tokens need at least this estimated probability.
    """
    out = Speculation()
    tokens, parents, probs = out.token_ids, out.parents, out.probs
    prob = 1.0
    while len(tokens) < budget and prob >= min_prob:
        if idx < node.length:  # inside an edge the count, hence prob, is constant
            take = min(node.length - idx, budget - len(tokens))
            first = len(tokens)
            tokens.extend(node.seq[node.start + idx:node.start + idx + take])
            parents.extend(range(first - 1, first + take - 1))
            probs.extend([prob] * take)
            idx += take
        elif node.children:
            _, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
            prob *= child.count / node.count
            node, idx = child, 0
        else:
            break
    out.score = sum(probs)
    return out


def draft_tree(node, idx: int, budget: int, min_prob: float) -> Speculation:
    """Best-first expansion on prob with a max-heap, stopping after `budget` tokens.

    Ties pop the most recently pushed item first, so a popped edge can be emitted as one run
    (its next position has the same, maximal prob) and equal siblings go in rank order.
    """
    out = Speculation()
    tokens, parents, probs = out.token_ids, out.parents, out.probs
    heap = [(-1.0, 0, node, idx, -1)]
    pushes = 0
    while heap and len(tokens) < budget:
        neg_prob, _, node, idx, parent = heappop(heap)
        prob = -neg_prob
        if idx < node.length:
            take = min(node.length - idx, budget - len(tokens))
            first = len(tokens)
            tokens.extend(node.seq[node.start + idx:node.start + idx + take])
            parents.append(parent)
            parents.extend(range(first, first + take - 1))
            probs.extend([prob] * take)
            parent = first + take - 1
            if idx + take < node.length:
                break  # budget spent inside the edge
        # At the edge's end: queue the children whose prob reaches min_prob (a prefix of the
        # descending-count order; ties: smaller token id).
        count = node.count
        ranked = sorted(((-c.count, token, c) for token, c in node.children.items()
                         if prob * c.count / count >= min_prob), key=lambda r: r[:2])
        for neg_count, _, child in reversed(ranked):  # best pushed last pops first on ties
            pushes -= 1
            heappush(heap, (-(prob * -neg_count / count), pushes, child, 0, parent))
    out.score = sum(probs)
    return out
