"""Lossless sampling over draft trees (docs/SAMPLING.md): the target's warped distribution and
the recursive rejection-sampling walk.

Contract:
- `SamplingConfig(temperature=0)` is greedy decoding; the verifier then takes its greedy path,
  untouched. With `temperature > 0` the committed tokens are distributed exactly as sampling the
  target token by token from softmax(top_p(top_k(logits / T))), the warpers in transformers'
  order.
- `Sampler` holds one request's settings and random generator (seeded with `seed`), so the same
  seed, prompt and method give the same tokens run to run.
- `sample_walk(tree, dist, sampler)` is the walk that replaces the greedy one: at each node the
  children are tried in tree order, child c accepted with probability r(token[c]) where r is the
  residual (the node's distribution with the rejected siblings' tokens removed, renormalized);
  the bonus token is drawn from the residual where no child was accepted. Deterministic drafts
  need no probabilities. A draft *sampled* from q (the draft model at temperature > 0; the
  tree's `draft_probs`) is its parent's only child and is tested by min(1, p/q) instead, the
  bonus then drawn from max(0, p - q).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from oilbird.tree import DraftTree


@dataclass
class SamplingConfig:
    """How tokens are chosen: greedily (temperature 0) or sampled, losslessly."""

    temperature: float = 0.0
    """Softmax temperature; 0 means greedy decoding (the strict, token-for-token audited path)."""
    top_k: int = 0
    """Keep only the k most likely tokens before sampling (0: all), as transformers' top_k."""
    top_p: float = 1.0
    """Keep the smallest set of most likely tokens whose probability reaches top_p (1: all), as transformers' top_p."""
    seed: int = 0
    """Seed of each request's random generator: the same seed, prompt and method give the same tokens."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0 (0: no top-k), got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def warped_probs(logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """The target's sampling distribution: softmax(top_p(top_k(logits / T))).

    Args:
        logits: [..., V] raw logits.
        config: temperature (> 0), top-k and top-p.

    Returns:
        [..., V] float64 probabilities; tokens removed by top-k or top-p have probability 0.
    """
    scores = logits.double() / config.temperature  # [..., V]
    if 0 < config.top_k < scores.shape[-1]:
        kth = scores.topk(config.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))  # ties at the k-th are kept, as in transformers
    if config.top_p < 1:
        ordered, order = scores.sort(dim=-1)  # ascending, as transformers' TopPLogitsWarper
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - config.top_p
        drop[..., -1] = False  # always keep the most likely token
        scores = scores.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scores.softmax(dim=-1)


class Sampler:
    """One request's sampling settings and random generator.

    Args:
        config: the settings (temperature > 0 for sampling).
        seed: the generator's seed (default: `config.seed`).
    """

    def __init__(self, config: SamplingConfig, seed: int | None = None) -> None:
        self.config = config
        self.generator = torch.Generator().manual_seed(config.seed if seed is None else seed)

    def uniform(self) -> float:
        return float(torch.rand((), generator=self.generator, dtype=torch.float64))

    def draw(self, probs: torch.Tensor) -> int:
        """A token drawn from `probs` [V] (need not be normalized)."""
        return int(torch.multinomial(probs, 1, generator=self.generator))


def sample_walk(tree: DraftTree, dist: Callable[[int], torch.Tensor],
                sampler: Sampler) -> tuple[list[int], int]:
    """Recursive rejection sampling without replacement over `tree` (docs/SAMPLING.md).

    Args:
        tree: the verified draft tree.
        dist: node -> [V] the target's warped distribution after that node's path (CPU).
        sampler: the request's generator.

    Returns:
        (accepted node indices in root-to-leaf order, the bonus token).
    """
    path, node = [], 0
    while True:
        residual = dist(node).clone()  # [V]
        accepted = None
        children = tree.children(node)
        if any(c in tree.draft_probs for c in children):
            accepted, residual = _sampled_child(tree, children, residual, sampler)
            children = []
        for child in children:
            token = tree.tokens[child]
            mass = float(residual.sum())
            if mass > 0 and sampler.uniform() * mass < float(residual[token]):
                accepted = child
                break
            residual[token] = 0.0  # rejected: remove it; the next test renormalizes by `mass`
        if accepted is None:
            if float(residual.sum()) <= 0:  # unreachable in exact arithmetic (see SAMPLING.md)
                residual = dist(node)
            return path, sampler.draw(residual)
        path.append(accepted)
        node = accepted


def _sampled_child(tree: DraftTree, children: list[int], p: torch.Tensor,
                   sampler: Sampler) -> tuple[int | None, torch.Tensor]:
    """The standard speculative-sampling test of a draft sampled from q (Leviathan et al.;
    docs/SAMPLING.md): accept x with probability min(1, p(x) / q(x)); on rejection the bonus
    comes from max(0, p - q), renormalized.

    Returns:
        (the child if accepted else None, the distribution to draw the bonus from).

    Raises:
        ValueError: the sampled child has siblings (the rule holds for one draft per position).
    """
    if len(children) != 1:
        raise ValueError(f"a sampled draft must be its parent's only child; node {tree.parents[children[0]]} "
                         f"has {len(children)} children")
    child = children[0]
    q = tree.draft_probs[child]  # [V]
    token = tree.tokens[child]
    if sampler.uniform() * float(q[token]) < float(p[token]):
        return child, p
    return None, (p - q.to(p.dtype)).clamp(min=0)  # [V]; sums to 0 only if p == q, where x is always accepted


def calibration_terms(probs: torch.Tensor, token: int) -> tuple[float, float]:
    """One sampled position's terms of the distribution check (bench at temperature > 0).

    If `token` was drawn from `probs`, then p(token) has mean sum p^2 and variance
    sum p^3 - (sum p^2)^2. Summed over positions (each term has mean 0 given the past), the
    deviations divided by the square root of the summed variances is a z-score near N(0, 1);
    a sampler biased toward likely tokens (or away from them) drives it far from 0.

    Returns:
        (p(token) - sum p^2, its variance).
    """
    s2 = float((probs * probs).sum())
    s3 = float((probs * probs * probs).sum())
    return float(probs[token]) - s2, max(s3 - s2 * s2, 0.0)


def check_z(deviation: float, variance: float) -> float | None:
    """The z-score of pooled `calibration_terms` (None when nothing was sampled)."""
    return deviation / variance ** 0.5 if variance > 0 else None


Z_FAIL = 4.0
"""|z| above this fails a bench row's distribution check (about 6e-5 of correct rows would)."""
