"""FLy's loose acceptance rule (seed 001; ALGORITHMS.md §8): lossy by design, off unless asked.

Strict verification commits a draft token only when it equals the target's argmax. FLy also
commits a mismatching draft token d_j when
- the target was uncertain there (entropy gate): H_j >= θ, where H_j is the entropy of the
  target's distribution that predicts d_j; θ <= 0.01 switches the gate off;
- and the draft agrees with the target again right after it (deferred window, the reference
  code's semantics): the next W - 1 draft tokens d_{j+1..j+W-1} are exact matches, and the draft
  goes on at least to d_{j+W} (the boundary rule: with K drafts a mismatch is forgivable only at
  j <= K - W - 1). W = 0 leaves only the gate; K < W (or K = W) makes the rule strict.
The draft's own tokens are committed, forgiven ones included, then the target's argmax after the
last accepted one, exactly as strict verification commits its bonus token: the target's later
logits were computed on the draft tokens, so the cache stays consistent.

On a tree (the training-free drafters), the same rule walks from the root: follow the child that
equals the argmax; where none does, forgive the mismatching child whose window holds (gate at the
parent), preferring the one with the longest exact run below it. On a chain this is exactly the
rule above. (The reference code's tree mode applies the window per path without the gate; ours
applies both.)

Everything here is pure: per-node entropies from logits, and the walk over a `DraftTree`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from oilbird.tree import DraftTree

ENTROPIES = ("top3", "normalized")


@dataclass
class FlyConfig:
    """FLy's loose acceptance (the paper's defaults). Lossy: results are labeled and never audited as lossless."""

    theta: float = 0.3
    """Entropy gate θ: a mismatch is forgivable only where the target's entropy is >= θ (θ <= 0.01: no gate; θ = 1: strict with 'normalized', nearly so with 'top3', which exceeds 1 only near a three-way tie)."""
    window: int = 6
    """Deferred window W, the mismatch included: the next W - 1 draft tokens must match exactly, and the draft must go on past them (W = 0: gate only; W >= K: strict)."""
    entropy: str = "top3"
    """'top3': the reference code's −Σ p log p over the 3 most likely tokens of the full softmax, in nats (at most ln 3); 'normalized': the paper's full-vocabulary entropy divided by log V (in [0, 1])."""

    def __post_init__(self) -> None:
        if self.entropy not in ENTROPIES:
            raise ValueError(f"fly entropy must be one of {', '.join(ENTROPIES)}, got {self.entropy!r}")
        if self.window < 0:
            raise ValueError(f"fly window must be >= 0, got {self.window}")
        if self.theta < 0:
            raise ValueError(f"fly theta must be >= 0, got {self.theta}")


def entropy(logits: torch.Tensor, kind: str = "top3") -> torch.Tensor:
    """Per-row entropy of softmax(logits).

    Args:
        logits: [N, V] target logits.
        kind: 'top3' (nats, the three largest terms only) or 'normalized' (all terms, / log V).

    Returns:
        [N] float32 entropies.
    """
    logp = torch.log_softmax(logits.float(), dim=-1)  # [N, V]
    if kind == "top3":
        top = logp.topk(min(3, logp.shape[-1]), dim=-1).values  # [N, 3]
        return -(top.exp() * top).sum(dim=-1)
    if kind == "normalized":
        h = -(logp.exp() * logp).nan_to_num().sum(dim=-1)  # [N]; 0 * -inf terms count as 0
        return h / math.log(logits.shape[-1])
    raise ValueError(f"unknown entropy {kind!r}; use one of {', '.join(ENTROPIES)}")


def _exact_run(tree: DraftTree, preds: list[int], node: int, limit: int) -> tuple[int, int]:
    """Follow argmax children from `node` for at most `limit` steps: (steps taken, node reached)."""
    steps = 0
    while steps < limit:
        child = tree.child(node, preds[node])
        if child is None:
            break
        node, steps = child, steps + 1
    return steps, node


def fly_walk(tree: DraftTree, preds: list[int], entropies: list[float],
             config: FlyConfig) -> tuple[list[int], list[int]]:
    """The accepted path under FLy's rule, and which of its nodes were forgiven mismatches.

    Args:
        tree: the verified draft tree.
        preds: [N] the target's argmax at every node (the prediction of that node's child).
        entropies: [N] the entropy of the target's distribution at every node.
        config: θ and W.

    Returns:
        (path, forgiven): accepted node indices from the root (root excluded), and the subset
        accepted although they differ from the argmax at their parent.
    """
    path: list[int] = []
    forgiven: list[int] = []
    node = 0
    need = max(config.window - 1, 0)  # exact matches required after a forgiven mismatch
    while True:
        child = tree.child(node, preds[node])
        if child is not None:
            path.append(child)
            node = child
            continue
        if config.theta > 0.01 and entropies[node] < config.theta:
            break  # the target was confident: a mismatch here is a real error
        best = None
        for c in tree.children(node):
            steps, last = _exact_run(tree, preds, c, need)
            if steps < need or (config.window >= 1 and not tree.children(last)):
                continue  # the window does not hold, or the draft ends inside it (boundary rule)
            run = steps + _exact_run(tree, preds, last, len(tree))[0]
            if best is None or run > best[0]:
                best = (run, c)
        if best is None:
            break
        path.append(best[1])
        forgiven.append(best[1])
        node = best[1]
    return path, forgiven
