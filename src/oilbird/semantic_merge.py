"""Oilbird's semantic chains: how retrieved neighbors become draft-tree nodes (ALGORITHMS.md §7).

Contract (pure functions of trees and numbers, independent of any store or drafter):
- `endorsed_continuation`: the value of a rejected-branch record, read off the verified tree.
- `chain_depth`: the similarity-sized copy depth, L = clamp(round(L_max (s - θ) / (1 - θ)), 1, L_max);
  `rank_depth` the ablation's rank-sized one.
- `merge_cost` / `merge_chains`: chains re-walk the host tree from the root; nodes they share
  are tagged with the `SEMANTIC` source and cost nothing, only the divergent tail is paid for,
  within the semantic entry budget and the node budget.
- `Calibrator`: our self-calibration (the paper names it without a definition): an EMA of the
  acceptance rate of the nodes the semantic source paid for moves the floor θ and the depth.
  Constant size: a handful of floats per tenant.
"""

from __future__ import annotations

from oilbird.tree import DraftTree

SEMANTIC = "sem"  # the source tag of semantic nodes


def endorsed_continuation(tree: DraftTree, preds: list[int], node: int, depth: int) -> list[int]:
    """What the model endorses after `node`: its argmax, then down the child drafting that argmax.

    Args:
        tree: the verified tree.
        preds: the target's argmax at every node.
        node: the (rejected) node to start from.
        depth: at most this many tokens.

    Returns:
        1 to `depth` tokens.
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
    """Similarity-sized copy depth: clamp(round(L_max (s - θ) / (1 - θ)), 1, L_max).

    Args:
        similarity: the neighbor's cosine s.
        theta: the floor θ (zero point of the scale).
        max_depth: L_max.

    Returns:
        A depth in [1, L_max].
    """
    if theta >= 1.0:
        return 1
    return max(1, min(max_depth, round(max_depth * (similarity - theta) / (1.0 - theta))))


def rank_depth(rank: int, max_depth: int) -> int:
    """The ablation's rank-sized depth: L_max / (rank + 1), at least 1 (rank 0 is the best)."""
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
    """Merge chains (best first) into `tree` in place.

    Each chain re-walks the tree from the root: nodes it shares are tagged with `source` and cost
    nothing; its divergent tail is appended under the last shared node while the paid total stays
    within `entry_budget` and the tree within `node_budget` (an over-budget chain is truncated).

    Args:
        tree: the host tree, root = the anchor.
        chains: (similarity, tokens) pairs, best first.
        entry_budget: most nodes paid for.
        node_budget: most nodes in the tree, root included.

    Returns:
        The indices of the nodes paid for.
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

    When fewer semantic nodes are accepted than `target`, θ rises (fewer, closer neighbors) and
    chains shorten; when more are, θ falls and chains lengthen. θ stays within
    [θ0 - span, min(0.99, θ0 + span)] and the depth scale within [0.5, 1.5]. One per tenant,
    constant size (no cap needed).

    Args:
        theta: the configured floor θ0.
        target: the acceptance share aimed at.
        alpha: EMA weight of the newest cycle.
        gain: how far θ moves per unit of relative acceptance error.
        span: the most θ moves away from θ0.
    """

    def __init__(self, theta: float, target: float, alpha: float, gain: float, span: float = 0.2) -> None:
        self.theta0, self.target, self.alpha, self.gain, self.span = theta, target, alpha, gain, span
        self.ema = target

    def update(self, paid: int, accepted: int) -> None:
        """Fold in one cycle: `accepted` of the `paid` semantic nodes were accepted."""
        if paid > 0:
            self.ema = self.alpha * (accepted / paid) + (1 - self.alpha) * self.ema

    def theta(self) -> float:
        """The floor θ now."""
        shifted = self.theta0 + self.gain * (self.target - self.ema) / max(self.target, 1e-6)
        return min(max(shifted, self.theta0 - self.span), min(0.99, self.theta0 + self.span))

    def depth_scale(self) -> float:
        """The factor on L_max now."""
        return min(1.5, max(0.5, self.ema / max(self.target, 1e-6)))

    def memory_bytes(self) -> int:
        """Six floats: constant."""
        return 6 * 8
