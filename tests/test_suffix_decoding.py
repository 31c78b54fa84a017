"""SuffixDecoding drafter on hand-built token lists, plus one end-to-end run on the real model."""

import pytest
import torch

import oilbird.drafters.suffix_decoding  # noqa: F401  (import registers "suffix")
from oilbird.drafters.registry import make_drafter
from oilbird.drafters.suffix_decoding import ResponseCache, SuffixDecoding, SuffixDecodingConfig
from oilbird.tree import DraftTree
from oilbird.verifier import Verification


def commit(drafter, request_id, tokens):
    """Tell the drafter that `tokens` of `request_id` were committed (what the verifier would report)."""
    state = drafter.state(request_id)
    tree = DraftTree.root(state.anchor)
    drafter.observe(request_id, Verification(
        tree=tree, prefix_len=len(state.sequence) - 1, argmax=torch.zeros(1, dtype=torch.long),
        topk_ids=torch.zeros((1, 1), dtype=torch.long), topk_logits=torch.zeros((1, 1)), path=[], committed=list(tokens), finished=False))


def serve(drafter, request_id, prompt, response, tenant="default"):
    """A whole request: start, commit the response token by token, stop."""
    drafter.start_request(request_id, prompt, tenant)
    for token in response:
        commit(drafter, request_id, [token])
    drafter.stop_request(request_id)


def drafted(tree):
    return tree.tokens[1:]


def test_registered_with_arctic_defaults():
    drafter = make_drafter("suffix")
    assert isinstance(drafter, SuffixDecoding)
    assert drafter.describe() == {"name": "suffix", "config": {
        "max_depth": 64, "max_spec_factor": 1.0, "max_spec_offset": 0.0, "min_token_prob": 0.1,
        "max_cached_requests": 100000, "max_cached_tokens": 1_000_000, "use_tree": True,
        "max_spec_tokens": 0}}


def test_bad_config_is_refused():
    with pytest.raises(ValueError):
        SuffixDecodingConfig(max_depth=0)
    with pytest.raises(ValueError):
        SuffixDecodingConfig(max_cached_requests=-1)


def test_drafts_from_the_request_itself():
    drafter = make_drafter("suffix")
    drafter.start_request("r", [10, 11, 12, 13, 14, 10, 11])
    tree = drafter.propose("r", budget=64)
    assert tree.tokens[0] == 11  # rooted at the anchor
    # "10 11" (m = 2) occurs twice, once with no continuation yet: 12 13 at p = 1/2 each.
    assert drafted(tree) == [12, 13]
    assert tree.parents == [-1, 0, 1]
    assert tree.scores[1:] == [0.5, 0.5]
    assert tree.sources[1:] == [{"suffix"}, {"suffix"}]


def test_cross_request_reuse_within_a_tenant():
    drafter = make_drafter("suffix")
    serve(drafter, "r1", [100, 101], [5, 6, 7, 8, 9], tenant="t")
    drafter.start_request("r2", [200, 201, 5, 6], tenant="t")
    tree = drafter.propose("r2", budget=64)
    assert drafted(tree) == [7, 8]  # "5 6" (m = 2) seen only in r1's response
    assert tree.parents == [-1, 0, 1]
    assert tree.scores[1:] == [1.0, 1.0]


def test_tenants_are_isolated():
    drafter = make_drafter("suffix")
    serve(drafter, "r1", [100, 101], [5, 6, 7, 8, 9], tenant="A")
    drafter.start_request("r2", [200, 201, 5, 6], tenant="B")
    assert drafted(drafter.propose("r2", budget=64)) == []
    for token in [7, 8, 9]:  # B's own text is fine; A's never shows up
        commit(drafter, "r2", [token])
        assert not set(drafted(drafter.propose("r2", budget=64))) - {200, 201, 5, 6, 7, 8, 9}
    drafter.stop_request("r2")
    drafter.start_request("r3", [300, 5, 6], tenant="A")
    assert drafted(drafter.propose("r3", budget=64)) == [7, 8]  # A still has its own history


def test_never_proposes_the_current_requests_future():
    prompt, future = [1, 2, 3], [4, 1, 2, 3, 9, 1, 2, 3, 9]
    drafter = make_drafter("suffix")
    drafter.start_request("r", prompt)
    for i, token in enumerate(future):
        proposal = drafted(drafter.propose("r", budget=64))
        # Before 9 is committed no committed text contains it, so no draft may contain it.
        assert set(proposal) <= set(prompt + future[:i])
        commit(drafter, "r", [token])
    assert drafted(drafter.propose("r", budget=64))[:1] == [1]  # "9" was followed by "1" once
    drafter.stop_request("r")


def test_budget_is_respected():
    drafter = make_drafter("suffix")
    prompt = [1, 2, 3, 4, 5, 6, 7, 8] * 6 + [1, 2, 3, 4]
    drafter.start_request("r", prompt)
    for budget in [1, 2, 3, 5, 9, 64]:
        tree = drafter.propose("r", budget)
        assert len(tree) <= budget and tree.tokens[0] == 4
    assert drafted(drafter.propose("r", 5)) == [5, 6, 7, 8]
    capped = make_drafter("suffix", SuffixDecodingConfig(max_spec_tokens=2))
    capped.start_request("r", prompt)
    assert drafted(capped.propose("r", 64)) == [5, 6]


def test_tree_mode_branches_and_path_mode_does_not():
    # "1 2" is followed by 5 twice, 6 twice and nothing yet (the anchor): p = 2/5 each; after
    # "1 2 5" come 9 or 7 (p = 1/5 each), so best-first takes the sibling 6 before going deeper.
    prompt = [1, 2, 5, 9, 1, 2, 6, 8, 1, 2, 5, 7, 1, 2, 6, 3, 1, 2]
    drafter = make_drafter("suffix")
    drafter.start_request("r", prompt)
    tree = drafter.propose("r", 64)
    assert tree.tokens == [2, 5, 6] and tree.parents == [-1, 0, 0]
    assert tree.scores[1:] == pytest.approx([0.4, 0.4])
    path = make_drafter("suffix", SuffixDecodingConfig(use_tree=False))
    path.start_request("r", prompt)
    chain = path.propose("r", 64)
    assert chain.tokens == [2, 5, 7] and chain.parents == [-1, 0, 1]  # ties go to the smaller id
    assert chain.scores[1:] == pytest.approx([0.4, 0.2])


def test_fifo_eviction_past_max_cached_requests():
    drafter = make_drafter("suffix", SuffixDecodingConfig(max_cached_requests=2))
    for name, first in [("a", 40), ("b", 50), ("c", 60)]:
        serve(drafter, name, [0], [first, first + 1, first + 2])
    cache = drafter.caches.get("default")
    assert list(cache.seq_ids) == ["b", "c"]  # "a" went when "c" started (the active one counts)
    drafter.start_request("d", [9, 60])  # starting "d" evicts "b" too
    assert list(cache.seq_ids) == ["c", "d"]
    assert drafted(drafter.propose("d", 64)) == [61]  # c's response is still there
    assert cache.tree.speculate([9, 40], 5).token_ids == []
    assert cache.tree.speculate([9, 50], 5).token_ids == []
    assert cache.tree.speculate([9, 60], 5).token_ids == [61]
    cache.tree.check()


def test_reused_request_id_drops_its_old_response():
    drafter = make_drafter("suffix")
    serve(drafter, "same", [0], [7, 8, 9])
    drafter.start_request("same", [1, 7])
    assert drafted(drafter.propose("same", 64)) == []  # a re-run never drafts its own earlier answer


def test_zero_cached_requests_uses_only_the_local_tree():
    drafter = make_drafter("suffix", SuffixDecodingConfig(max_cached_requests=0))
    serve(drafter, "r1", [0], [7, 8, 9])
    drafter.start_request("r2", [1, 7])
    assert drafted(drafter.propose("r2", 64)) == []


def test_global_wins_when_better_and_local_wins_ties():
    drafter = make_drafter("suffix", SuffixDecodingConfig(use_tree=False))
    serve(drafter, "r1", [0], [5, 6, 8, 9])
    drafter.start_request("r2", [5, 6, 7, 3, 5, 6])
    # Local "5 6" -> 7 3 at p = 1/2 (score 1); global "5 6" -> 8 9 at p = 1 (score 2).
    assert drafted(drafter.propose("r2", 64)) == [8, 9]
    drafter.stop_request("r2")

    drafter = make_drafter("suffix", SuffixDecodingConfig(use_tree=False))
    serve(drafter, "r1", [0], [5, 6, 1])
    drafter.start_request("r2", [5, 6, 7, 8, 5, 6])
    # Local 7 8 at p = 1/2 and global 1 at p = 1 both score 1: the local draft is kept.
    assert drafted(drafter.propose("r2", 64)) == [7, 8]


# --- the token cap and the tenants --------------------------------------------------------------

def test_token_cap_evicts_the_oldest_responses_first():
    drafter = make_drafter("suffix", SuffixDecodingConfig(max_cached_tokens=7))
    serve(drafter, "a", [0], [40, 41, 42])
    serve(drafter, "b", [0], [50, 51, 52])
    cache = drafter.caches.get("default")
    drafter.start_request("c", [0])
    commit(drafter, "c", [60])  # 3 + 3 + 1 = 7 tokens: all fit
    assert list(cache.seq_ids) == ["a", "b", "c"] and cache.num_tokens == 7
    commit(drafter, "c", [61])  # the 8th token: the oldest response, a, makes room
    assert list(cache.seq_ids) == ["b", "c"] and cache.num_tokens == 5
    commit(drafter, "c", [62])
    drafter.stop_request("c")
    assert cache.tree.speculate([9, 40], 5).token_ids == []  # a is gone from the tree
    assert cache.tree.speculate([9, 50], 5).token_ids == [51]
    assert cache.tree.speculate([9, 60], 5).token_ids == [61]
    cache.tree.check()
    serve(drafter, "d", [0], [70, 71])  # 6 + 2 > 7: b goes
    assert list(cache.seq_ids) == ["c", "d"] and cache.num_tokens == 5


def test_a_response_alone_over_the_cap_stops_growing_in_the_global_tree():
    drafter = make_drafter("suffix", SuffixDecodingConfig(max_cached_tokens=4))
    serve(drafter, "old", [0], [30, 31])
    drafter.start_request("long", [0, 1, 2, 3])
    cache = drafter.caches.get("default")
    for token in [5, 6, 7, 8, 9, 10, 11, 9]:
        commit(drafter, "long", [token])
        assert cache.num_tokens <= 4
    assert list(cache.seq_ids) == ["long"]  # its own growth evicted only the older response
    assert cache.tree.sequence(cache.seq_ids["long"]) == [5, 6, 7, 8]  # its first 4 tokens
    assert cache.tree.speculate([9], 5).token_ids == []
    assert drafted(drafter.propose("long", 64)) == [10]  # "9 10" is only in the local tree: still drafted
    drafter.stop_request("long")


def test_memory_stays_bounded_over_a_long_run():
    cap = 40
    drafter = make_drafter("suffix", SuffixDecodingConfig(max_cached_tokens=cap))
    for r in range(30):
        serve(drafter, f"r{r}", [0], [1000 * r + i for i in range(9)])
        cache = drafter.caches.get("default")
        assert cache.num_tokens <= cap and cache.num_tokens == sum(cache.lengths.values())
        cache.tree.check()
    assert list(cache.seq_ids) == [f"r{r}" for r in range(26, 30)]  # 4 x 9 = 36 <= 40 < 45
    # At most two nodes per stored suffix, plus the root.
    assert drafter.memory_bytes() == cache.memory_bytes() <= 650 * (1 + 2 * cap)


def test_a_response_evicted_by_another_request_is_not_brought_back():
    cache = ResponseCache(max_depth=8, max_requests=1, max_tokens=100)
    first = cache.open("r1")
    assert cache.append(first, 5)
    cache.open("r2")  # the request cap evicts r1 while it may still be decoding
    assert not cache.append(first, 6) and first not in cache.tree
    assert cache.num_tokens == 0


def test_zero_cached_tokens_uses_only_the_local_tree():
    drafter = make_drafter("suffix", SuffixDecodingConfig(max_cached_tokens=0))
    serve(drafter, "r1", [0], [7, 8, 9])
    drafter.start_request("r2", [1, 7])
    assert drafted(drafter.propose("r2", 64)) == [] and drafter.caches.get("default").num_tokens == 0
    with pytest.raises(ValueError, match="max_cached_tokens"):
        SuffixDecodingConfig(max_cached_tokens=-1)


def test_drop_tenant_forgets_only_that_tenants_responses():
    drafter = make_drafter("suffix")
    serve(drafter, "a", [0], [5, 6, 7, 8], tenant="A")
    serve(drafter, "b", [0], [5, 6, 1, 2], tenant="B")
    both = drafter.memory_bytes()
    drafter.drop_tenant("A")
    assert drafter.caches.tenants() == ["B"] and 0 < drafter.memory_bytes() < both
    drafter.start_request("a2", [9, 5, 6], tenant="A")
    assert drafted(drafter.propose("a2", 64)) == []  # A starts empty
    drafter.stop_request("a2")
    drafter.start_request("b2", [9, 5, 6], tenant="B")
    assert drafted(drafter.propose("b2", 64)) == [1, 2]  # B kept its responses


# --- end to end on the real model (loads SmolLM2; slow) -----------------------------------------

def test_suffix_output_equals_greedy_on_api_bank(serve_api_bank):
    # One instance across requests, so the global tree fills up.
    results, tau = serve_api_bank(make_drafter("suffix"), node_budget=64)
    assert all(set(r.accepted_sources) <= {"suffix"} for r in results)
    assert tau > 1.2  # API-Bank prompts and responses repeat: drafts must be accepted
