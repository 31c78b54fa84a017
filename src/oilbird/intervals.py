"""How far a run's speed ratios could move with the requests it happened to serve: paired
bootstrap intervals over requests.

Contract:
- Every method of an `oilbird bench` run served the same requests, back to back, in one process,
  so the ratio of two methods' pooled tokens/s (Σ tokens / Σ seconds, as `summary.py` pools them)
  has a natural unit to resample: the request. `ratio_interval` draws the requests both methods
  served with replacement, `draws` times, pools each draw the same way and returns the central
  `level` share of the ratios it got (the percentile bootstrap). A deterministic `seed` makes a
  re-made table (`oilbird report`) print the same interval as the run did.
- What it covers: how much the ratio owes to *which* requests were served (a few long copies can
  carry a short run). What it does not: the host's drift between runs, which is why speed is
  only ever compared within one run; nor the online pools' dependence of a request on the ones
  before it (each draw keeps the times measured in the original order). Read an interval that
  excludes 1.0 as "this run's requests, not just a few of them, favour the method"; it is not a
  promise about another run.
- Fewer than two requests in common: no interval (None).
"""

from __future__ import annotations

import numpy as np

LEVEL = 0.9
"""The interval's central share of the bootstrap distribution."""
DRAWS = 2000
"""Bootstrap draws: enough for the 5th and 95th percentiles to settle to about 0.01x on 20 requests."""
SEED = 0
"""The draws' seed: a fixed one, so that re-made tables repeat the run's intervals."""


def per_request(records: list[dict], method: str, seconds: str = "wall_s") -> dict[str, tuple[int, float]]:
    """request id -> (new tokens, seconds) of `method`'s records (`seconds`: the record field)."""
    return {r["request_id"]: (r["new_tokens"], r.get(seconds) or 0.0) for r in records if r["method"] == method}


def ratio_interval(num: dict[str, tuple[int, float]], den: dict[str, tuple[int, float]],
                   level: float = LEVEL, draws: int = DRAWS, seed: int = SEED) -> tuple[float, float] | None:
    """The `level` percentile-bootstrap interval of (num's pooled tokens/s) / (den's), resampling
    the requests both served.

    Args:
        num, den: `per_request` maps of the two methods.
        level: the central share of the bootstrap distribution, in (0, 1).
        draws: how many resamples.
        seed: the generator's seed.

    Returns:
        (low, high), or None when fewer than two requests are in common or a draw has no time.

    Raises:
        ValueError: if `level` is not in (0, 1) or `draws` < 1.
    """
    if not 0 < level < 1 or draws < 1:
        raise ValueError(f"need 0 < level < 1 and draws >= 1, got level {level}, draws {draws}")
    common = sorted(set(num) & set(den))
    if len(common) < 2:
        return None
    parts = np.array([[*num[i], *den[i]] for i in common], dtype=np.float64)  # [R, 4]
    picks = np.random.default_rng(seed).integers(0, len(common), size=(draws, len(common)))  # [draws, R]
    sums = parts[picks].sum(axis=1)  # [draws, 4]: Σ tokens and Σ seconds of each method
    if (sums[:, 1] <= 0).any() or (sums[:, 3] <= 0).any() or (sums[:, 2] <= 0).any():
        return None
    ratios = (sums[:, 0] / sums[:, 1]) / (sums[:, 2] / sums[:, 3])  # [draws]
    tail = (1 - level) / 2
    low, high = np.quantile(ratios, [tail, 1 - tail])
    return float(low), float(high)
