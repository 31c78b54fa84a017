"""Online estimates of how likely a draft node is to be accepted, from what was verified.

Drafters tag every node with its sources and a score, but the scores of different sources mean
different things (a suffix-tree frequency, a cosine similarity, a table rank). `AcceptanceModel`
turns tags, depth and score into one currency, learnt from verification outcomes: the probability
that a node is accepted given that its parent was. Engines use it to decide what to verify: vLLM's
adapter picks one chain of the tree (integrations/vllm/chain_policy.py), our own engine picks the
subtree worth its forward's cost (oilbird/tree_select.py).

Estimates start from an optimistic prior, so that a source is tried before its record can
condemn it. Keep one model per tenant: traffic differs between tenants, and nothing one tenant's
requests reveal should steer another's drafts.

A caller may also name the request's *context*, e.g. how its previous verification went: a
request that is copying a past answer keeps copying, one writing new text keeps missing. Each
context keeps counts of its own, shrunk towards the context-free estimate of the same key until
it has seen `context_weight` trials, so a rare context borrows the common record.

The shape of the drafter's tree around a node says how sure the drafter was, in any drafter's
currency (`node_shapes`): a node with a long drafted continuation under it comes from a long or
frequent match, one with siblings from a place where the drafter saw several ways on. On the
make-bench slice, with estimates blind to shapes (`scripts/shape_calibration.py`, stop 58),
SuffixDecoding's leaves were accepted 42% of the times tried against an estimate of 57%, its nodes
with four or more levels under them 94% against 85%; SAM's nodes with four or more levels under
them 87% alone (estimated 72%) and 14% among three or more siblings (estimated 27%). A caller
that passes the shapes gets each key's estimate refined per shape, shrunk towards the key's own
until the shape has seen `shape_weight` trials.

Estimates learnt only from what was verified can lock in: a source whose early drafts failed gets
cut to nothing, and a source that verifies nothing learns nothing, even after the traffic has
turned its way. `ExplorationFloor` is the rule both engines' policies share against that: after
`every` proposals in a row cut to nothing, the next is verified in part anyway (a probe).
"""

from __future__ import annotations

from bisect import bisect_right
from dataclasses import dataclass, field

from oilbird.tree import DraftTree

MAX_DEPTH_KEY = 8
SCORE_BINS = 4
HEIGHT_BINS = (1, 2, 4)  # a subtree's height, bucketed: 0, 1, 2-3, 4 and more
MAX_SIBLINGS_KEY = 3  # a node's siblings, itself included: 1, 2, 3 and more

Shape = tuple[int, int]


def node_key(tree: DraftTree, node: int) -> tuple[str, int, int]:
    """What a node's acceptance is estimated by: its source tags, its depth, its score bin."""
    tags = "+".join(sorted(tree.sources[node])) or "?"
    depth = min(tree.depths[node], MAX_DEPTH_KEY)
    score = min(SCORE_BINS, max(0, int(tree.scores[node] * SCORE_BINS)))
    return tags, depth, score


def node_shapes(tree: DraftTree) -> list[Shape]:
    """Per node, the shape of the drafter's tree around it: (the height of its subtree, bucketed
    by `HEIGHT_BINS`; the number of its parent's children, capped at `MAX_SIBLINGS_KEY`). Read
    from the tree the drafter proposed, before any pruning: a pruned tree has other shapes."""
    parents = tree.parents
    height, children = [0] * len(tree), [0] * len(tree)
    for node in range(len(tree) - 1, 0, -1):  # children come after their parents
        parent = parents[node]
        children[parent] += 1
        height[parent] = max(height[parent], height[node] + 1)
    # bisect_right counts the bin edges at or below a height: its bucket
    return [(0, 1)] + [(bisect_right(HEIGHT_BINS, height[n]), min(MAX_SIBLINGS_KEY, children[parents[n]]))
                       for n in range(1, len(tree))]  # the root's shape is never estimated


def tried_nodes(tree: DraftTree, path: list[int]) -> list[tuple[int, bool]]:
    """The nodes of a verified tree that were tried (their parent accepted, or the root), each
    with whether it was accepted (on `path`, the accepted nodes)."""
    reached = {0, *path}
    return [(node, node in reached) for node in range(1, len(tree)) if tree.parents[node] in reached]


@dataclass
class AcceptanceModel:
    """Online acceptance estimates for one tenant's draft nodes, keyed by `node_key`."""

    prior: float = 0.8
    """The estimate of a key never tried: optimistic, so that a source is tried before its record
    can condemn it."""
    prior_weight: float = 2.0
    """How many observations the prior counts as."""
    context_weight: float = 8.0
    """How many trials a context's own counts need to weigh as much as the context-free estimate
    they are shrunk towards."""
    shape_weight: float = 4.0
    """How many trials a key's counts in one tree shape (`node_shapes`) need to weigh as much as
    the key's estimate over all shapes they are shrunk towards."""
    counts: dict[tuple[str, int, int], list[int]] = field(default_factory=dict)
    """key -> [times verified with its parent accepted, times accepted]."""
    context_counts: dict[tuple[str, tuple[str, int, int]], list[int]] = field(default_factory=dict)
    """(context, key) -> the same counts, for trials made in that context."""
    shape_counts: dict[tuple[tuple[str, int, int], Shape], list[int]] = field(default_factory=dict)
    """(key, shape) -> the same counts, for trials of nodes of that shape."""

    def p_accept(self, key: tuple[str, int, int], context: str = "", shape: Shape | None = None) -> float:
        """P(accepted | parent accepted) for a node of this key, in this context ('' for none),
        of this shape (`node_shapes`; None: any)."""
        tried, accepted = self.counts.get(key, (0, 0))
        estimate = (accepted + self.prior * self.prior_weight) / (tried + self.prior_weight)
        if shape is not None:
            tried, accepted = self.shape_counts.get((key, shape), (0, 0))
            estimate = (accepted + estimate * self.shape_weight) / (tried + self.shape_weight)
        if not context:
            return estimate
        tried, accepted = self.context_counts.get((context, key), (0, 0))
        return (accepted + estimate * self.context_weight) / (tried + self.context_weight)

    def trials(self, key: tuple[str, int, int]) -> int:
        """How many times a node of this key was tried (its parent accepted)."""
        return self.counts.get(key, (0, 0))[0]

    def node_probs(self, tree: DraftTree, context: str = "", shapes: list[Shape] | None = None) -> list[float]:
        """P(accepted | parent accepted) for every node; 1 for the root. `shapes`: per node (root
        included), its shape in the proposed tree (`node_shapes`), or None to ignore shapes."""
        return [1.0] + [self.p_accept(node_key(tree, n), context, shapes[n] if shapes else None)
                        for n in range(1, len(tree))]

    def update_tree(self, tree: DraftTree, path: list[int], context: str = "",
                    shapes: list[Shape] | None = None) -> None:
        """A verified tree and its accepted path: every node whose parent was accepted (or is the
        root) was tried; those on the path were accepted. `shapes` as in `node_probs`."""
        for node, hit in tried_nodes(tree, path):
            key = node_key(tree, node)
            _count(self.counts, key, hit)
            if shapes:
                _count(self.shape_counts, (key, shapes[node]), hit)
            if context:
                _count(self.context_counts, (context, key), hit)


@dataclass
class ExplorationFloor:
    """When a policy whose estimates cut a non-empty proposal to nothing should verify some of it
    anyway (see the module docstring). One per acceptance model: per drafter instance in our
    engine, per tenant in the vLLM adapter.

    Raises:
        ValueError: a negative `every`.
    """

    every: int = 8
    """Proposals in a row cut to nothing before a probe; 0: never probe."""
    idle: int = 0
    """Proposals cut to nothing since the last one that drafted (or the last probe)."""
    probes: int = 0
    """Probes so far."""

    def __post_init__(self) -> None:
        if self.every < 0:
            raise ValueError(f"explore_every must be >= 0 (0: never), got {self.every}")

    def drafted(self) -> None:
        """The estimates kept some of a proposal: the count starts again."""
        self.idle = 0

    def probe_due(self) -> bool:
        """The estimates cut a non-empty proposal to nothing: True (a probe, counted) on every
        `every + 1`-th such proposal in a row, else False."""
        if self.every and self.idle >= self.every:
            self.idle, self.probes = 0, self.probes + 1
            return True
        self.idle += 1
        return False


def _count(table: dict, key, hit: bool) -> None:
    entry = table.setdefault(key, [0, 0])
    entry[0] += 1
    entry[1] += hit
