"""Hardware-aware node budget: pick the tree size that maximizes committed tokens per second.

A forward over N tokens costs very different amounts on a CPU (several times one token at
N = 64) and on a GPU at batch 1 (about the same as one token). The best budget therefore depends
on the machine as much as on the drafter: the policies here read the measured `CostCurve`
(oilbird/cost_curve.py).

- `BudgetConfig`: how the budget is chosen ('fixed', 'auto', and the options of 'fit',
  oilbird/tree_select.py) and how the curve is measured and rechecked.
- `AdaptiveBudget` ('auto') estimates, online, the committed tokens E(B) and the forward seconds
  T(B) per forward for each candidate budget B, and picks argmax E(B) / T(B). Its estimator rests
  on one property of our trees: nodes are added in priority order and parents precede children, so
  the tree a drafter builds under budget B is (approximately) the first B nodes of the tree it
  builds under a larger budget. From one verified tree of size N with accepted path c1 < c2 < ...
  we therefore know what every budget B <= N would have committed, 1 + #{leading path nodes with
  index < B}, and paid, cost(min(B, N)): a drafter that often has little to propose is not charged
  for a full budget. Now and then a larger budget is probed, in turn 2x, 4x, 8x, ... the current
  best, so the estimate can climb as far as the acceptance pays for, and old cycles decay so it
  follows the traffic. Probes are paid from a time allowance (`explore_share` of the forwards at
  the best budget): on a GPU's flat curve they cost nothing extra and come every `explore_every`
  forwards; on a CPU, where a 64-node tree costs several one-token forwards, the large ones come
  rarely instead of taking a fixed share of the forwards.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from oilbird.tree import DraftTree

if TYPE_CHECKING:
    from oilbird.cost_curve import CostCurve

FIT_OBJECTIVES = ("step", "rate")  # the 'fit' budget's objectives (oilbird/tree_select.py)


@dataclass
class BudgetConfig:
    """How the decoder chooses the node budget of each forward."""

    mode: str = "fixed"
    """'fixed': every forward gets the decode loop's node budget; 'auto': chosen from the cost curve and observed acceptance."""
    grid: str = "1,2,4,6,8,12,16,24,32,48,64,96,128"
    """Candidate budgets (nodes, root included) for 'auto'; capped by the loop's node budget."""
    explore_every: int = 8
    """In 'auto', at most every N-th forward probes a budget above the best, keeping larger budgets' estimates fresh."""
    explore_share: float = 0.05
    """In 'auto', what probing may add to the forward time, as a share of the forwards at the best budget: a probe waits until the forwards since the last one have earned its extra cost (its curve cost less the best's). On a flat (GPU) curve probes come every `explore_every` forwards; on a steep (CPU) one the large probes come rarely."""
    decay: float = 0.995
    """Per-forward decay of past observations (1.0 = never forget)."""
    cost_prefix: int = 512
    """Cache length at which the cost curve is measured."""
    recheck: bool = True
    """Before using a cached cost curve, time a few forwards (about a second on SmolLM2) and measure
    the curve again if its shape has moved: a shared host's cost curve changes with the hour."""
    recheck_tolerance: float = 0.25
    """How far (as a fraction) a rechecked size's cost relative to the one-node step may move
    before the cached curve counts as stale."""
    recheck_faster: float = 0.10
    """How much faster (as a fraction) than the cached curve's one-node step the recheck's fastest
    one-node forward may run before the cached curve counts as timed in a slow spell and is
    measured again. A slower recheck keeps it (the curve keeps the fastest the host did); a slow
    spell adds to every size alike and flattens the curve's shape."""
    fit_context: bool = False
    """In 'fit', estimate acceptance per outcome of the request's previous tree (oilbird/tree_select.py)."""
    fit_objective: str = "step"
    """In 'fit': 'step' (each forward's tokens per second) or 'rate' (gain over the long-run rate)."""
    fit_explore_every: int = 8
    """In 'fit', after this many forwards in a row that verified nothing of a non-empty proposal, the next verifies its likeliest nodes anyway, so a drafter whose early drafts failed can earn its way back (0: never)."""
    fit_explore_nodes: int = 3
    """In 'fit', how many of the proposal's likeliest nodes such a probe verifies."""
    fit_shape: bool = True
    """In 'fit', refine each node's acceptance estimate by its shape in the drafter's proposal:
    the height of the subtree under it and its number of siblings (oilbird/acceptance.py)."""
    fit_extend_trials: int = 8
    """In 'fit', after a request's tree was accepted whole, also verify the likeliest node that
    deepens it whose key was tried fewer than this many times: a key that missed its first few
    trials is tried again where the request is copying, instead of cut for good (0: never;
    oilbird/tree_select.py, stop 59)."""

    def __post_init__(self) -> None:
        if self.mode not in ("fixed", "auto"):
            raise ValueError(f"budget mode must be 'fixed' or 'auto', got {self.mode!r}")
        if not self.sizes():
            raise ValueError(f"grid must list positive budgets, got {self.grid!r}")
        if self.explore_every < 1 or not 0 < self.decay <= 1:
            raise ValueError("explore_every must be >= 1 and decay in (0, 1]")
        if not self.explore_share > 0:
            raise ValueError(f"explore_share must be > 0 (a share of the forward time, e.g. 0.05; inf "
                             f"probes every explore_every forwards whatever it costs), got {self.explore_share}")
        if self.recheck_tolerance <= 0:
            raise ValueError(f"recheck_tolerance must be > 0, got {self.recheck_tolerance}")
        if not 0 < self.recheck_faster < 1:
            raise ValueError(f"recheck_faster must be in (0, 1), got {self.recheck_faster}")
        if self.fit_explore_every < 0 or self.fit_explore_nodes < 1:
            raise ValueError(f"fit_explore_every must be >= 0 and fit_explore_nodes >= 1, got "
                             f"{self.fit_explore_every} and {self.fit_explore_nodes}")
        if self.fit_extend_trials < 0:
            raise ValueError(f"fit_extend_trials must be >= 0 (0: never), got {self.fit_extend_trials}")
        if self.fit_objective not in FIT_OBJECTIVES:
            raise ValueError(f"fit_objective must be one of {FIT_OBJECTIVES}, got {self.fit_objective!r}")

    def sizes(self) -> list[int]:
        return sorted({int(x) for x in self.grid.split(",") if x.strip() and int(x) > 0})


PRIOR_WEIGHT = 0.25  # in forwards: how much the "one token per forward" prior counts


def counterfactual_commits(path: list[int], budget: int) -> int:
    """Tokens a verified tree would have committed had it been cut to its first `budget` nodes."""
    accepted = 0
    for node in path:  # node indices increase along a path: parents precede children
        if node >= budget:
            break
        accepted += 1
    return accepted + 1  # plus the bonus token


class AdaptiveBudget:
    """Online choice of the node budget (see the module docstring).

    Args:
        curve: the device's cost curve.
        config: candidate budgets, exploration and decay.
        max_budget: the decode loop's cap.
    """

    def __init__(self, curve: CostCurve, config: BudgetConfig, max_budget: int) -> None:
        self.curve, self.config = curve, config
        self.sizes = [b for b in config.sizes() if b <= max_budget] or [1]
        # Prior: a light AR-like cycle per size, outweighed by the first real observation.
        self.committed = {b: PRIOR_WEIGHT for b in self.sizes}
        # Seconds spent per forward at each budget. A drafter with nothing to say builds a tree
        # smaller than its budget and pays only for that, so the cost is learned, not cost(b).
        self.seconds = {b: PRIOR_WEIGHT * curve.cost(b) for b in self.sizes}
        self.observed = 0
        self.probes = 0
        self.since_probe = 1  # forwards since the last probe (the first, largest tree is one)
        self.credit = {b: 0.0 for b in self.sizes}  # seconds of probing each size has earned
        self.last_probe = 0  # the size probed last: the next probe starts the ladder after it

    def rate(self, budget: int) -> float:
        """Expected committed tokens per second of forward time at `budget`."""
        return self.committed[budget] / self.seconds[budget]

    def best(self) -> int:
        """The budget with the highest expected committed tokens per second now."""
        return max(self.sizes, key=self.rate)

    def choose(self) -> int:
        """The budget for the next forward.

        A probe goes above the current best, taken in turn from the ladder 2x, 4x, 8x, ... best
        (the next candidate at or above each), and informs every budget up to its size. The
        ladder matters on a CPU, whose cost curve has steps (2 tokens cost 1.6x one token, 8
        tokens barely more than 2): probing only the next size up would stall below the step.
        A probe comes at most every `explore_every` forwards; each rung of the ladder earns, per
        forward, its share of `explore_share` of the best budget's cost and is probed once it
        has earned its extra cost (its cost less the best's). So probing adds at most that share
        to the forward time: on a flat (GPU) curve the rungs come in turn every `explore_every`
        forwards, on a CPU a 64-node probe, at several one-token forwards, waits far longer than
        a 16-node one. The rungs are tried in turn from the one after the last probed.
        """
        if self.observed == 0:  # the first tree is the largest: it informs every smaller size
            return self.sizes[-1]
        best = self.best()
        ladder = list(dict.fromkeys(
            next((b for b in self.sizes if b >= best * 2 ** k), self.sizes[-1])
            for k in range(1, 1 + max(1, self.sizes[-1].bit_length()))))
        ladder = [b for b in ladder if b > best]
        if not ladder:
            return best
        self.since_probe += 1
        earned = self.config.explore_share * self.curve.cost(best) / len(ladder)
        extra = {b: self.curve.cost(b) - self.curve.cost(best) for b in ladder}
        for b in ladder:  # no more than one probe's worth each: no burst after a long wait
            self.credit[b] = min(self.credit[b] + earned, max(extra[b], 0.0))
        if self.since_probe < self.config.explore_every:
            return best
        start = next((i for i, b in enumerate(ladder) if b > self.last_probe), 0)
        for probe in ladder[start:] + ladder[:start]:
            if self.credit[probe] >= extra[probe]:
                self.credit[probe] = 0.0
                self.probes += 1
                self.since_probe = 0
                self.last_probe = probe
                return probe
        return best

    def select(self, tree: DraftTree, context: str = "") -> list[int] | None:
        """The decode loop's hook for pruning a proposal: this policy verifies the tree whole."""
        return None

    def verified(self, offered: int, tree: DraftTree, path: list[int], context: str = "") -> None:
        """The decode loop's report of one verified tree (see `observe`; the context is not used)."""
        self.observe(offered, len(tree), path)

    def observe(self, offered: int, tree_size: int, path: list[int]) -> None:
        """Learn from one verified tree that was built under budget `offered`."""
        decay = self.config.decay
        self.observed += 1
        saturated = tree_size < offered  # the drafter had nothing more to give
        for b in self.sizes:
            self.committed[b] *= decay
            self.seconds[b] *= decay
            if b <= offered or saturated:
                self.committed[b] += counterfactual_commits(path, b)
                self.seconds[b] += self.curve.cost(min(b, tree_size))
