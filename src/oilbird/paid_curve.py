"""The cost curve decoding pays, learnt from the run's own forwards: budget 'fit-live'.

The 'fit' budget prices every candidate tree on the verifier's cost curve, measured (or
rechecked) once as a run starts, as the fastest of a few probe forwards. On a shared host that
curve's *shape*, all the fit uses, moves within minutes (six curves back to back read 16 nodes at
1.48x-1.87x the one-token step), and decoding pays more than the probes for its larger trees
(in one make-bench run: 1.80x at 16 nodes against the probes' 1.41x; `scripts/in_run_curve.py`,
docs/RESULTS.md, issue 15, stop 40).

`LiveCurve` keeps the probe curve and corrects it by the verifications the run makes: every
forward of n nodes that took s seconds (the whole `verify` call, as the probes time it) is a
sample of

    paid(n) = a * probe(n) + b * (n - 1)

fitted by least squares with exponential forgetting (`decay` per sample), so the estimate follows
the host. `a` scales the probe curve (the host's speed), `b` adds what each extra node costs
beyond the probes (the compute-bound forwards' share). Until it has `warmup` samples over at least
two sizes it answers with the probe curve. A sample far off the probe's cost (a hiccup of the
host: over `outlier` times it) is clipped to that bound. Answers never fall below half the
probe's cost, so a wild fit cannot make trees look free.

It is shared by every 'fit-live' policy that verifies with the same verifier: the cost of a
forward is the host's, whichever drafter built the tree.
"""

from __future__ import annotations

from dataclasses import dataclass

from oilbird.cost_curve import CostCurve


@dataclass
class LiveCurveConfig:
    """How the live curve learns from the run's forwards."""

    decay: float = 0.99
    """Weight kept by the older samples at each new one (0.99: about the last 100 forwards count)."""
    warmup: int = 20
    """Samples needed, over at least two sizes, before the live estimate replaces the probe curve."""
    outlier: float = 3.0
    """A sample over this many times the probe's cost is clipped to it."""

    def __post_init__(self) -> None:
        if not 0 < self.decay <= 1 or self.warmup < 2 or self.outlier <= 1:
            raise ValueError(f"live curve: need 0 < decay <= 1, warmup >= 2 and outlier > 1, got {self}")


class LiveCurve:
    """The probe curve corrected by the forwards decoding paid (see the module docstring).

    Args:
        probe: the measured curve (oilbird/cost_curve.py).
        config: how it learns.
    """

    def __init__(self, probe: CostCurve, config: LiveCurveConfig | None = None) -> None:
        self.probe, self.config = probe, config or LiveCurveConfig()
        # Weighted sums of the normal equations of (a, b) over x = (probe(n), n - 1), y = seconds.
        self.sxx = self.sxz = self.szz = self.sxy = self.szy = 0.0
        self.samples = 0
        self.sizes: set[int] = set()
        self.key = probe.key + "|live"

    def observe(self, nodes: int, seconds: float) -> None:
        """Learn from one verification of `nodes` nodes that took `seconds`."""
        x, z = self.probe.cost(nodes), float(nodes - 1)
        y = min(seconds, self.config.outlier * x)
        d = self.config.decay
        self.sxx, self.sxz, self.szz = d * self.sxx + x * x, d * self.sxz + x * z, d * self.szz + z * z
        self.sxy, self.szy = d * self.sxy + x * y, d * self.szy + z * y
        self.samples += 1
        if len(self.sizes) < 2:
            self.sizes.add(nodes)

    def coefficients(self) -> tuple[float, float] | None:
        """(a, b) of the fit, or None while it is still warming up or ill-posed."""
        if self.samples < self.config.warmup or len(self.sizes) < 2:
            return None
        det = self.sxx * self.szz - self.sxz * self.sxz
        if det <= 1e-12 * max(self.sxx * self.szz, 1e-30):
            return None
        a = (self.sxy * self.szz - self.szy * self.sxz) / det
        b = (self.sxx * self.szy - self.sxz * self.sxy) / det
        return a, b

    def cost(self, n: int) -> float:
        """Seconds of a forward over `n` tokens, as this run has been paying them."""
        probe = self.probe.cost(n)
        fit = self.coefficients()
        if fit is None:
            return probe
        a, b = fit
        return max(0.5 * probe, a * probe + b * (n - 1))

    def describe(self) -> dict:
        """What it learnt: samples, (a, b) or None, and the live cost against the probe's at a few sizes."""
        fit = self.coefficients()
        sizes = (1, 8, 16, 64)
        return dict(samples=self.samples, a=fit and fit[0], b=fit and fit[1],
                    probe_ms={n: 1e3 * self.probe.cost(n) for n in sizes},
                    live_ms={n: 1e3 * self.cost(n) for n in sizes})
