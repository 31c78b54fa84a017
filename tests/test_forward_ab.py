"""scripts/forward_ab.py's configuration spec: ForwardConfig and VerifierConfig fields by name,
typed, and refusals."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from forward_ab import forward_config, side_config, side_rows  # noqa: E402

from oilbird.kernels import ForwardConfig  # noqa: E402
from oilbird.verifier import VerifierConfig  # noqa: E402


def test_a_spec_names_forward_config_fields_with_their_types():
    assert forward_config("") == ForwardConfig()
    config = forward_config("q4_rows=0, fused=false,gemm=skinny")
    assert config == ForwardConfig(q4_rows=0, fused=False, gemm="skinny")
    assert forward_config("fused=true").fused is True


def test_a_spec_sends_each_field_to_the_config_that_has_it():
    forward, verifier = side_config("fused=false,head=int8,top_k=8")
    assert forward == ForwardConfig(fused=False)
    assert verifier == VerifierConfig(head="int8", top_k=8)
    assert side_config("") == (ForwardConfig(), VerifierConfig())
    with pytest.raises(ValueError, match="head must be"):
        side_config("head=fp4")


def test_a_bad_spec_is_refused_with_the_reason():
    with pytest.raises(argparse.ArgumentTypeError, match="unknown ForwardConfig or VerifierConfig field 'fuse'"):
        forward_config("fuse=false")
    with pytest.raises(argparse.ArgumentTypeError, match="true/false"):
        forward_config("fused=maybe")
    with pytest.raises(ValueError):
        forward_config("q4_rows=many")
    with pytest.raises(ValueError, match="q4_rows must be >= 0"):
        forward_config("q4_rows=-1")


def test_side_rows_pool_each_sides_requests_and_count_differing_outputs():
    def rec(rid, method, tokens, seconds, out, forwards=2, nodes=(1, 3)):
        return dict(request_id=rid, method=method, new_tokens=tokens, wall_s=seconds, output_ids=out,
                    forwards=forwards, nodes_per_forward=list(nodes))

    records = {"slow": [rec("r1", "x", 10, 1.0, [1]), rec("r2", "x", 10, 1.0, [2])],
               "fast": [rec("r1", "x", 10, 0.5, [1]), rec("r2", "x", 10, 0.5, [3], nodes=(1, 1))]}
    row = side_rows(records, ["x"])["x"]
    assert (row["a_tps"], row["b_tps"], row["ratio"]) == (10.0, 20.0, 2.0)  # a is the first side
    assert row["interval"] == (2.0, 2.0)  # every request twice as fast
    assert row["forwards"] == {"slow": 4, "fast": 4} and row["nodes"] == {"slow": 2.0, "fast": 1.5}
    assert row["differ"] == 1 and row["requests"] == 2
