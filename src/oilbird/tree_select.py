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

Estimates learnt only from what was verified can lock in (SAM on Spec-Bench, stop 51;
`ExplorationFloor` in oilbird/acceptance.py): so after `explore_every` forwards in a row in which
the fit verified nothing of a non-empty proposal, the next forward verifies the proposal's
`explore_nodes` likeliest nodes anyway: a probe whose price is bounded by the curve's cost of
those nodes, once in `explore_every + 1` forwards, and paid only by a drafter that has stopped
drafting.

Each estimate is refined by the node's shape in the proposal (`node_shapes` in
oilbird/acceptance.py: how far the drafter went on past it, how many siblings it has), which says
in any drafter's currency how sure the drafter was (`use_shape`, on by default; stop 58).

The floor only fires when a whole proposal is cut. A single key can lock in too, mid-tree: on
Qwen2.5-Coder's API-Bank stream, `oilbird-suffix`'s estimate for one depth-3 key fell to 0.32
after three early misses, every later proposal was cut above it, the nodes under it were never
tried, and half of its trees were then accepted whole (stop 59). So after a tree that the
request's walk accepted whole (context 'full'), the fit also verifies the likeliest node that
deepens the kept tree, if its key has been tried fewer than `extend_trials` times (`extend`): a
young key gets more trials exactly where the request is copying, and a key with a record is left
to it.

The estimates may also be conditioned on how the request's previous tree went (`tree_outcome`:
'idle', 'miss', 'part', 'full'), as the vLLM chain policy's are: a request that is copying a
past answer keeps copying, one writing new text keeps missing, and the fit spends accordingly.
"""

from __future__ import annotations

from oilbird.acceptance import AcceptanceModel, ExplorationFloor, Shape, node_key, node_shapes, tried_nodes
from oilbird.budget import FIT_OBJECTIVES
from oilbird.cost_curve import CostCurve
from oilbird.tree import DraftTree


def reaches(tree: DraftTree, probs: list[float]) -> list[float]:
    """P(the walk reaches node n) for every node: the product of `probs` along its path."""
    out = [1.0] * len(tree)
    for node in range(1, len(tree)):  # parents precede children
        out[node] = out[tree.parents[node]] * probs[node]
    return out


def fit_subtree(reach: list[float], cost, rate: float | None = None) -> list[int]:
    """The nodes to verify: the k of largest reach (root excluded), k maximizing this forward's
    expected tokens per second, (1 + their summed reach) / cost(k + 1); or, given the stream's
    long-run `rate` (tokens per second), the expected tokens beyond what the forward's time
    earns at that rate, (1 + their summed reach) - rate * cost(k + 1).

    Args:
        reach: per node, the probability of reaching it (`reaches`); reach[0] is the root's.
        cost: seconds of a forward over n tokens, n -> float.
        rate: the long-run tokens per second of forward; None: maximize each forward's own.

    Returns:
        Ascending node indices (ancestor-closed when reach decreases along paths).
    """
    order = _by_reach(reach)

    def value(expected: float, seconds: float) -> float:
        return expected / seconds if rate is None else expected - rate * seconds

    best_k, best, expected = 0, value(1.0, cost(1)), 1.0
    for k, node in enumerate(order, start=1):
        expected += reach[node]
        v = value(expected, cost(k + 1))
        if v > best:
            best_k, best = k, v
    return sorted(order[:best_k])


def likeliest(reach: list[float], k: int) -> list[int]:
    """The `k` nodes of largest reach (root excluded, ties to the earlier index), ascending:
    ancestor-closed when reach decreases along paths."""
    return sorted(_by_reach(reach)[:k])


def extend(tree: DraftTree, keep: list[int], reach: list[float], eligible) -> list[int]:
    """`keep` plus the likeliest node that deepens it (a child of one of its leaves) for which
    `eligible(node)` holds, if any: still ancestor-closed."""
    kept = set(keep)
    leaves = kept - {tree.parents[n] for n in kept}
    frontier = [n for n in range(1, len(tree)) if n not in kept and tree.parents[n] in leaves and eligible(n)]
    if frontier:
        kept.add(max(frontier, key=lambda n: (reach[n], -n)))
    return sorted(kept)


def _by_reach(reach: list[float]) -> list[int]:
    return sorted(range(1, len(reach)), key=lambda n: (-reach[n], n))


def tree_outcome(tree: DraftTree, path: list[int]) -> str:
    """How a verified tree went, as a calibration context (`AcceptanceModel`): 'idle' (nothing
    drafted), 'miss' (every child of the root rejected), 'full' (the accepted path ends at a leaf:
    all the tree offered along it was accepted) or 'part'."""
    if len(tree) == 1:
        return "idle"
    if not path:
        return "miss"
    return "part" if tree.children(path[-1]) else "full"


class FittedTree:
    """Budget policy 'fit' for one drafter instance (see the module docstring).

    The decode loop asks `choose()` for the proposal's budget, `select(tree, context)` for the
    nodes to verify, and reports each verified tree to `verified`; `context` is the outcome of
    the request's previous tree ('' for its first).

    Args:
        curve: the device's cost curve for this verifier.
        max_budget: the proposal's budget (the loop's cap).
        model: acceptance estimates (a fresh optimistic one by default).
        use_context: condition the estimates on the context (false: ignore it).
        objective: 'step' (each forward's own tokens per second) or 'rate' (tokens beyond what
            the forward's time earns at the long-run rate of this policy's verified trees).
        explore_every: after this many forwards in a row that verified nothing of a non-empty
            proposal, probe (0: never; see the module docstring).
        explore_nodes: the probe's size: the proposal's likeliest nodes, root excluded.
        use_shape: refine the estimates by each node's shape in the proposal (`node_shapes`:
            how far the drafter continued past it, how many siblings it has).
        extend_trials: after a tree the request's walk accepted whole (context 'full'), also
            verify the likeliest node that deepens the kept tree (a child of a kept leaf) whose
            key was tried fewer than this many times (`extend`; 0: never).

    Raises:
        ValueError: an unknown objective, a negative `explore_every` or `extend_trials`, or
            `explore_nodes` < 1.
    """

    def __init__(self, curve: CostCurve, max_budget: int, model: AcceptanceModel | None = None,
                 use_context: bool = False, objective: str = "step", explore_every: int = 8,
                 explore_nodes: int = 3, use_shape: bool = True, extend_trials: int = 8) -> None:
        if objective not in FIT_OBJECTIVES:
            raise ValueError(f"fit objective must be one of {FIT_OBJECTIVES}, got {objective!r}")
        if explore_nodes < 1:
            raise ValueError(f"explore_nodes must be >= 1, got {explore_nodes}")
        if extend_trials < 0:
            raise ValueError(f"extend_trials must be >= 0 (0: never), got {extend_trials}")
        self.floor, self.explore_nodes = ExplorationFloor(explore_every), explore_nodes
        self.curve, self.max_budget, self.use_context = curve, max_budget, use_context
        self.use_shape, self.extend_trials = use_shape, extend_trials
        self._shapes: list[Shape] | None = None  # the selected nodes' shapes in their proposal, root first
        self.model = model or AcceptanceModel()
        self.objective = objective
        # Committed tokens and curve-priced seconds of the verified trees, starting from one
        # autoregressive step's worth: the long-run rate of the 'rate' objective.
        self.tokens, self.seconds = 1.0, curve.cost(1)
        self.predicted = 0.0
        """Expected committed tokens of the verified trees, summed as the model estimated them
        when each was chosen; against `tokens`, how honest the estimates are (`calibration`)."""
        self.by_shape: dict[Shape, list[float]] = {}
        """A node shape (`node_shapes`) -> [its nodes tried, their estimates summed, accepted]:
        the estimates' honesty per shape, kept whether or not they use shapes."""

    def choose(self) -> int:
        """The proposal's budget: the cap; `select` prunes."""
        return self.max_budget

    def select(self, tree: DraftTree, context: str = "") -> list[int]:
        """The nodes of `tree` to verify (ascending, root excluded)."""
        shapes = node_shapes(tree)
        probs = self.model.node_probs(tree, context if self.use_context else "",
                                      shapes if self.use_shape else None)
        rate = self.tokens / self.seconds if self.objective == "rate" else None
        reach = reaches(tree, probs)
        keep = fit_subtree(reach, self.curve.cost, rate)
        if len(tree) > 1:  # else nothing offered: nothing learnt either way
            if keep:
                self.floor.drafted()
            elif self.floor.probe_due():
                keep = likeliest(reach, self.explore_nodes)
            if keep and context == "full" and self.extend_trials:
                keep = extend(tree, keep, reach, lambda n: self.model.trials(node_key(tree, n)) < self.extend_trials)
        # The verified tree is the proposal pruned to `keep`, renumbered in order: its nodes'
        # shapes are those they had in the proposal, kept here for `verified`.
        self._shapes = [shapes[0]] + [shapes[n] for n in keep]
        return keep

    def verified(self, offered: int, tree: DraftTree, path: list[int], context: str = "") -> None:
        """Learn from one verified (selected) tree, proposed in `context`, and its accepted path."""
        context = context if self.use_context else ""
        shapes, self._shapes = self._shapes, None
        if shapes is not None and len(shapes) != len(tree):
            shapes = None  # not the tree `select` chose: it teaches the keys' estimates only
        used = shapes if self.use_shape else None
        probs = self.model.node_probs(tree, context, used)
        self.predicted += sum(reaches(tree, probs))
        if shapes is not None:
            self._tally(tree, path, probs, shapes)
        self.model.update_tree(tree, path, context, used)
        self.tokens += 1 + len(path)
        self.seconds += self.curve.cost(len(tree))

    def _tally(self, tree: DraftTree, path: list[int], probs: list[float], shapes: list[Shape]) -> None:
        """Count each tried node under its shape: its estimate, its outcome."""
        for node, hit in tried_nodes(tree, path):
            tally = self.by_shape.setdefault(shapes[node], [0, 0.0, 0])
            tally[0] += 1
            tally[1] += probs[node]
            tally[2] += hit

    def calibration(self) -> dict:
        """Committed and predicted tokens of the verified trees (the predictions before each
        tree's outcome was learnt), and their ratio: above 1, the estimates were optimistic;
        `probes`: the forwards verified as exploration probes; `by_shape`: per node shape
        ('h<height bin> s<siblings>', `node_shapes`), the nodes tried, their mean estimate of
        P(accepted | parent accepted) and the share accepted."""
        committed = self.tokens - 1.0  # less the starting step's worth
        by_shape = {f"h{h} s{s}": dict(tried=n, estimate=est / n, accepted=hits / n)
                    for (h, s), (n, est, hits) in sorted(self.by_shape.items())}
        return dict(committed=committed, predicted=self.predicted,
                    ratio=self.predicted / committed if committed else None, probes=self.floor.probes,
                    by_shape=by_shape)
