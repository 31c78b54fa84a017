"""scripts/curve_ab.py's --cached-points: a curve as JSON, typed, and refusals with the reason."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from curve_ab import curve_points  # noqa: E402


def test_cached_points_read_node_counts_and_seconds():
    assert curve_points('{"1": 0.018, "8": 0.0262}') == {1: 0.018, 8: 0.0262}


@pytest.mark.parametrize("text, reason", [("[1, 2]", "not a JSON object"), ("{bad", "not a JSON object"),
                                          ('{"one": 0.1}', "not a JSON object"), ("{}", "node counts >= 1"),
                                          ('{"0": 0.1}', "node counts >= 1"), ('{"1": 0}', "positive seconds")])
def test_bad_cached_points_are_refused(text, reason):
    with pytest.raises(argparse.ArgumentTypeError, match=reason):
        curve_points(text)
