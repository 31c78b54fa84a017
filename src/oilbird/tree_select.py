"""The 'fit' budget: verify, of each drafted tree, the subtree worth its forward's cost.

The 'auto' budget (oilbird/budget.py) picks one tree size per forward and keeps the drafter's
first nodes, trusting the drafter's insertion order to put the likeliest first. A multi-source
tree breaks that trust: its sources' scores are in different currencies, and a long semantic
continuation built early can crowd out a likely lexical sibling. 'fit' instead ranks every node
of the full proposal by its estimated *reach*, the probability that the walk gets to it (the
product, along its path, of P(accepted | parent accepted) from an `AcceptanceModel` learnt online
from this drafter's own verified trees), and keeps the k likeliest nodes, with k chosen per
forward to maximize expected committed tokens per second of forward:

    (1 + sum of the k largest reaches) / cost(k + 1)        (cost: the device's measured curve)

The k likeliest nodes are ancestor-closed (a node's reach never exceeds its parent's, and ties
go to the earlier index), so they form a tree. Lossless by construction: verification decides,
the selection only chooses what to verify.
"""

from __future__ import annotations

from oilbird.acceptance import AcceptanceModel
from oilbird.budget import CostCurve
from oilbird.tree import DraftTree


def reaches(tree: DraftTree, probs: list[float]) -> list[float]:
    """P(the walk reaches node n) for every node: the product of `probs` along its path."""
    out = [1.0] * len(tree)
    for node in range(1, len(tree)):  # parents precede children
        out[node] = out[tree.parents[node]] * probs[node]
    return out


def fit_subtree(reach: list[float], cost) -> list[int]:
    """The nodes to verify: the k of largest reach (root excluded), k maximizing
    (1 + their summed reach) / cost(k + 1).

    Args:
        reach: per node, the probability of reaching it (`reaches`); reach[0] is the root's.
        cost: seconds of a forward over n tokens, n -> float.

    Returns:
        Ascending node indices (ancestor-closed when reach decreases along paths).
    """
    order = sorted(range(1, len(reach)), key=lambda n: (-reach[n], n))
    best_k, best_rate, expected = 0, 1.0 / cost(1), 1.0
    for k, node in enumerate(order, start=1):
        expected += reach[node]
        rate = expected / cost(k + 1)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return sorted(order[:best_k])


class FittedTree:
    """Budget policy 'fit' for one drafter instance (see the module docstring).

    The decode loop asks `choose()` for the proposal's budget, `select(tree)` for the nodes to
    verify, and reports each verified tree to `verified`.

    Args:
        curve: the device's cost curve for this verifier.
        max_budget: the proposal's budget (the loop's cap).
        model: acceptance estimates (a fresh optimistic one by default).
    """

    def __init__(self, curve: CostCurve, max_budget: int, model: AcceptanceModel | None = None) -> None:
        self.curve, self.max_budget = curve, max_budget
        self.model = model or AcceptanceModel()

    def choose(self) -> int:
        """The proposal's budget: the cap; `select` prunes."""
        return self.max_budget

    def select(self, tree: DraftTree) -> list[int]:
        """The nodes of `tree` to verify (ascending, root excluded)."""
        return fit_subtree(reaches(tree, self.model.node_probs(tree)), self.curve.cost)

    def verified(self, offered: int, tree: DraftTree, path: list[int]) -> None:
        """Learn from one verified (selected) tree and its accepted path."""
        self.model.update_tree(tree, path)
