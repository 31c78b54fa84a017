"""The live cost curve of budget 'fit-live' (oilbird.paid_curve): the probe curve corrected by
the forwards a run pays."""

import pytest

from oilbird.cost_curve import CostCurve
from oilbird.paid_curve import LiveCurve, LiveCurveConfig

PROBE = CostCurve(points={1: 0.027, 8: 0.031, 16: 0.038, 64: 0.112}, key="probe")


def _paid(n: int) -> float:
    """A host that pays 0.94x the probes plus 0.66 ms a node beyond the first."""
    return 0.94 * PROBE.cost(n) + 0.00066 * (n - 1)


def test_it_answers_with_the_probe_curve_until_warmed_up_over_two_sizes():
    live = LiveCurve(PROBE, LiveCurveConfig(warmup=5))
    for _ in range(10):
        live.observe(8, _paid(8))  # one size only: the slope is unknown
    assert live.coefficients() is None and live.cost(16) == PROBE.cost(16)
    live.observe(1, _paid(1))
    assert live.coefficients() is not None


def test_it_recovers_the_paid_curve_and_its_shape():
    live = LiveCurve(PROBE)
    for n in [1, 4, 8, 12, 16] * 10:
        live.observe(n, _paid(n))
    a, b = live.coefficients()
    assert a == pytest.approx(0.94, rel=1e-6) and b == pytest.approx(0.00066, rel=1e-4)
    for n in (1, 8, 16, 64):  # extrapolated beyond the sizes seen, as the model has it
        assert live.cost(n) == pytest.approx(_paid(n), rel=1e-6)
    # The shape the fit budget reads: 16 nodes cost more against the step than the probes said.
    assert live.cost(16) / live.cost(1) > PROBE.cost(16) / PROBE.cost(1) + 0.2


def test_it_follows_the_host_and_clips_hiccups():
    live = LiveCurve(PROBE, LiveCurveConfig(decay=0.9))
    for n in [1, 16] * 50:
        live.observe(n, PROBE.cost(n))  # an hour when the probes were right
    for n in [1, 16] * 50:
        live.observe(n, 2 * PROBE.cost(n))  # then the host halves its speed
    assert live.cost(16) == pytest.approx(2 * PROBE.cost(16), rel=0.01)
    live.observe(16, 100.0)  # a 100-second stall counts as 3x the probe's cost, no more
    assert live.cost(16) < 2.5 * PROBE.cost(16)


def test_a_wild_fit_never_makes_a_forward_cheaper_than_half_the_probes():
    live = LiveCurve(PROBE, LiveCurveConfig(warmup=2))
    live.observe(1, 0.1)
    live.observe(16, 1e-9)
    assert live.cost(16) >= 0.5 * PROBE.cost(16)


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="decay"):
        LiveCurveConfig(decay=0.0)


def test_fit_live_policies_share_one_curve_and_teach_it_every_verification():
    from oilbird.tree import DraftTree
    from oilbird.tree_select import FittedTree

    live = LiveCurve(PROBE, LiveCurveConfig(warmup=2))
    a, b = FittedTree(live, 16), FittedTree(live, 16)
    a.verified(16, DraftTree.chain(5, [6, 7], "t"), [1], seconds=0.03)
    b.verified(16, DraftTree.chain(5, [], "t"), [], seconds=0.02)
    assert live.samples == 2 and live.coefficients() is not None
    FittedTree(PROBE, 16).verified(16, DraftTree.chain(5, [6], "t"), [], seconds=0.5)  # a fixed curve: ignored
