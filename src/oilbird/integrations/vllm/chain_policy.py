"""Which chain of a draft tree a chain-verifying engine should verify, and how much of it.

An engine such as vLLM verifies one chain per request and step, and every draft token it verifies
costs compute whether or not it is accepted. The drafter's tree offers several chains (a lexical
spine, table successors, semantic continuations), each node tagged with its sources and a score
whose meaning differs per source. `ChainCalibrator` turns tags, depth and score into one
currency, learnt online from what the engine accepted: the probability that a node is accepted
given that its parent was. The chain is then walked from the root to the child whose subtree
promises the most accepted tokens (a bottom-up pass over the tree), and cut where the probability of reaching the next node falls below `min_reach`
(a draft token's cost relative to a step's: a node reached with probability p saves p steps),
raised with the batch (`batch_min_reach`): in a batch a draft token costs about as much as any
other token of the forward.

Estimates are kept per tenant (traffic differs between tenants, and nothing one tenant's requests
reveal should steer another's drafts) and start from an optimistic prior, so that a source is
tried before its record can condemn it.
"""

from __future__ import annotations

from oilbird.acceptance import AcceptanceModel, Shape, node_key
from oilbird.tree import DraftTree

MAX_BATCH_REACH = 0.5


def batch_min_reach(min_reach: float, batch_size: int, cap: float = MAX_BATCH_REACH) -> float:
    """The reach a draft token needs when `batch_size` requests share the step.

    Alone, a request's step costs a whole forward and a draft token adds little to it; in a batch
    the forward's fixed cost is shared and every token, drafted or not, costs about the same. With
    a forward costing a + b·tokens, a draft token pays when its reach exceeds
    r·B·τ / (1 + r·B·(1 + k)) (r = b/a, τ tokens per step, k drafts per request). With τ/(1+k)
    near 0.5 that is about `min_reach`·B / (1 + `min_reach`·(B − 1)), `min_reach` at B = 1, capped
    at `cap` (0.5 by default: half of a large batch's drafts would be accepted).
    """
    if batch_size <= 1:
        return min_reach
    return max(min_reach, min(cap, min_reach * batch_size / (1 + min_reach * (batch_size - 1))))


def chain_outcome(drafted: int, accepted: int) -> str:
    """How a verified chain went, as a calibration context: 'idle' (nothing drafted), 'miss'
    (its first draft rejected), 'part' or 'full' (every draft accepted)."""
    if not drafted:
        return "idle"
    if accepted >= drafted:
        return "full"
    return "part" if accepted else "miss"


class ChainCalibrator(AcceptanceModel):
    """`AcceptanceModel` for engines that verify one chain per step."""

    def update(self, chain: DraftTree, accepted: int, context: str = "",
               shapes: list[Shape] | None = None) -> None:
        """A verified chain whose first `accepted` drafts were accepted, proposed in `context`;
        `shapes`: its nodes' shapes in the tree it was chosen from (root first), or None."""
        self.update_tree(chain, list(range(1, accepted + 1)), context, shapes)

    def choose(self, tree: DraftTree, max_len: int, min_reach: float, context: str = "",
               shapes: list[Shape] | None = None, extend_trials: int = 0) -> list[int]:
        """The chain to verify: from the root, the child whose subtree promises the most accepted
        tokens (its estimate times one plus its best child's promise, the earliest built on a
        tie), while the probability of reaching the next node stays at least `min_reach`.
        `context` names the request's situation (`AcceptanceModel`), '' for none; `shapes` the
        tree's `node_shapes`, or None to estimate without them. In context 'full' (the request's
        last chain was accepted whole) the node the cut falls on is verified anyway if its key
        has been tried fewer than `extend_trials` times: a key whose first trials failed would
        otherwise never be tried again, and every key under it with it (our engine's 'fit'
        budget does the same, `tree_select.extend`).

        Returns:
            The path's node indices, root excluded, at most `max_len`.
        """
        n_nodes = len(tree)
        p = self.node_probs(tree, context, shapes)
        best_child = [0.0] * n_nodes  # the best promise among a node's children
        for n in range(n_nodes - 1, 0, -1):  # children come after their parents
            parent = tree.parents[n]
            best_child[parent] = max(best_child[parent], p[n] * (1.0 + best_child[n]))
        path: list[int] = []
        node, reach = 0, 1.0
        while len(path) < max_len:
            children = tree.children(node)
            if not children:
                break
            node = max(children, key=lambda c: (p[c] * (1.0 + best_child[c]), -c))
            reach *= p[node]
            if reach < min_reach:
                if context == "full" and self.trials(node_key(tree, node)) < extend_trials:
                    path.append(node)  # one young key past the cut, then stop
                break
            path.append(node)
        return path
