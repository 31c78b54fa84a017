"""The official SuffixDecoding as a peer drafter: its error when absent, agreement when present."""

import importlib.util
import sys

import pytest
import torch

from oilbird.drafters import make_drafter
from oilbird.drafters.suffix_decoding import SuffixDecodingConfig
from oilbird.errors import ConfigError
from oilbird.verifier import Verification

HAVE_ARCTIC = importlib.util.find_spec("arctic_inference") is not None


def test_missing_package_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding", None)  # import fails
    with pytest.raises(ConfigError, match="arctic-inference"):
        make_drafter("suffix-ref")


def commit(drafter, tree, token):
    n = len(tree)
    z = torch.zeros(n, 1, dtype=torch.long)
    drafter.observe(Verification(tree=tree, prefix_len=0, argmax=z[:, 0], topk_ids=z,
                                 topk_logits=z.float(), path=[], committed=[token],
                                 finished=False))


@pytest.mark.skipif(not HAVE_ARCTIC, reason="optional peer: arctic-inference is not installed "
                    "(see oilbird/drafters/suffix_reference.py for the build command)")
@pytest.mark.parametrize("use_tree", [False, True])
def test_ours_and_the_reference_draft_the_same_without_ties(use_tree):
    # Traffic whose every continuation is unique (no equal-count siblings), so both
    # implementations must draft exactly the same trees.
    cfg = SuffixDecodingConfig(use_tree=use_tree)
    ours, ref = make_drafter("suffix", cfg), make_drafter("suffix-ref", cfg)
    base = list(range(100, 160))
    for r in range(3):
        prompt = [1, 2, 3] + base[r * 5:r * 5 + 10]
        for d in (ours, ref):
            d.start_request(f"r{r}", prompt, "t")
        for token in base[r * 5 + 10:r * 5 + 40]:
            a, b = ours.propose(16), ref.propose(16)
            assert (a.tokens, a.parents) == (b.tokens, b.parents)
            commit(ours, a, token)
            commit(ref, b, token)
        for d in (ours, ref):
            d.stop_request(f"r{r}")
