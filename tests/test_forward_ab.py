"""scripts/forward_ab.py's configuration spec: ForwardConfig fields by name, typed, and refusals."""

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

from forward_ab import forward_config  # noqa: E402

from oilbird.kernels import ForwardConfig  # noqa: E402


def test_a_spec_names_forward_config_fields_with_their_types():
    assert forward_config("") == ForwardConfig()
    config = forward_config("q4_rows=0, fused=false,gemm=skinny")
    assert config == ForwardConfig(q4_rows=0, fused=False, gemm="skinny")
    assert forward_config("fused=true").fused is True


def test_a_bad_spec_is_refused_with_the_reason():
    with pytest.raises(argparse.ArgumentTypeError, match="unknown ForwardConfig field 'fuse'"):
        forward_config("fuse=false")
    with pytest.raises(argparse.ArgumentTypeError, match="true/false"):
        forward_config("fused=maybe")
    with pytest.raises(ValueError):
        forward_config("q4_rows=many")
    with pytest.raises(ValueError, match="q4_rows must be >= 0"):
        forward_config("q4_rows=-1")
