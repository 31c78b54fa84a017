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


def commit(drafter, request_id, tree, token):
    n = len(tree)
    z = torch.zeros(n, 1, dtype=torch.long)
    drafter.observe(request_id, Verification(tree=tree, prefix_len=0, argmax=z[:, 0], topk_ids=z,
                                 topk_logits=z.float(), path=[], committed=[token],
                                 finished=False))


needs_arctic = pytest.mark.skipif(
    not HAVE_ARCTIC, reason="optional peer: arctic-inference is not installed "
    "(see oilbird/drafters/suffix_reference.py for the build command)")


@needs_arctic
@pytest.mark.parametrize("use_tree,max_cached_tokens", [(False, 1_000_000), (True, 1_000_000),
                                                        (True, 40)])
def test_ours_and_the_reference_draft_the_same_without_ties(use_tree, max_cached_tokens):
    # Traffic whose every continuation is unique (no equal-count siblings), so both
    # implementations must draft exactly the same trees; a 40-token cap evicts on the way.
    cfg = SuffixDecodingConfig(use_tree=use_tree, max_cached_tokens=max_cached_tokens)
    ours, ref = make_drafter("suffix", cfg), make_drafter("suffix-ref", cfg)
    base = list(range(100, 160))
    for r in range(3):
        prompt = [1, 2, 3] + base[r * 5:r * 5 + 10]
        for d in (ours, ref):
            d.start_request(f"r{r}", prompt, "t")
        for token in base[r * 5 + 10:r * 5 + 40]:
            a, b = ours.propose(f"r{r}", 16), ref.propose(f"r{r}", 16)
            assert (a.tokens, a.parents) == (b.tokens, b.parents)
            commit(ours, f"r{r}", a, token)
            commit(ref, f"r{r}", b, token)
        for d in (ours, ref):
            d.stop_request(f"r{r}")


def serve(drafter, request_id, prompt, response, tenant="t"):
    drafter.start_request(request_id, prompt, tenant)
    for token in response:
        commit(drafter, request_id, drafter.propose(request_id, 16), token)
    drafter.stop_request(request_id)


@needs_arctic
def test_token_cap_evicts_the_oldest_responses_first():
    ref = make_drafter("suffix-ref", SuffixDecodingConfig(max_cached_tokens=7))
    serve(ref, "a", [0], [40, 41, 42])
    serve(ref, "b", [0], [50, 51, 52])
    state = ref.caches.get("t")
    ref.start_request("c", [0], "t")
    commit(ref, "c", ref.propose("c", 16), 60)  # 3 + 3 + 1 = 7 tokens: all fit
    assert list(state.lengths) == ["a", "b", "c"] and state.num_tokens == 7
    commit(ref, "c", ref.propose("c", 16), 61)  # the 8th token: the oldest response, a, makes room
    assert list(state.lengths) == ["b", "c"] and set(state.arctic.cached_requests) == {"b", "c"}
    assert state.num_tokens == 5 and ref.memory_bytes() == 5 * 400
    ref.stop_request("c")


@needs_arctic
def test_a_response_alone_over_the_cap_leaves_the_global_tree():
    ref = make_drafter("suffix-ref", SuffixDecodingConfig(max_cached_tokens=4))
    serve(ref, "old", [0], [30, 31])
    ref.start_request("long", [0, 1, 2, 3], "t")
    state = ref.caches.get("t")
    for token in [5, 6, 7, 8, 9, 10, 11, 9]:
        commit(ref, "long", ref.propose("long", 16), token)
        assert state.num_tokens <= 4
    assert not state.arctic.cached_requests and not state.lengths  # evicted, unlike ours
    assert ref.propose("long", 64).tokens[1:] == [10]  # the local tree still holds the whole request
    ref.stop_request("long")


@needs_arctic
def test_the_request_cap_is_mirrored_in_the_token_count():
    ref = make_drafter("suffix-ref", SuffixDecodingConfig(max_cached_requests=2))
    for name in "abc":
        serve(ref, name, [0], [1, 2, 3])
    state = ref.caches.get("t")
    assert list(state.lengths) == ["b", "c"] and state.num_tokens == 6
    serve(ref, "b", [0], [4])  # a re-run replaces its old answer
    assert list(state.lengths) == ["c", "b"] and state.num_tokens == 4
