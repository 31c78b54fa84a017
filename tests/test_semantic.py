"""The semantic key's pure parts on hand-built keys and trees (oilbird.semantic)."""

import pytest
import torch

from oilbird.semantic import (Calibrator, KeyMatrix, RejectedPool, TraceStore, chain_depth,
                              endorsed_continuation, merge_chains, merge_cost, normalise, rank_depth)
from oilbird.tree import DraftTree


def basis(i: int, dim: int = 8) -> torch.Tensor:
    v = torch.zeros(dim)
    v[i] = 1.0
    return v


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_key_matrix_scores_are_cosines_and_survive_growth(dtype):
    keys = KeyMatrix(16, "cpu", dtype)
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(3000, 16, generator=gen)  # more than the initial capacity: forces a regrowth
    keys.append(normalise(raw))
    query = normalise(torch.randn(1, 16, generator=gen))[0]
    expected = normalise(raw) @ query
    assert torch.allclose(keys.scores(query, 3000), expected, atol=0.02)
    assert keys.bytes_per_row() == (32 if dtype == "float16" else 20)


def test_store_search_respects_visibility_and_values_stop_at_the_request_end():
    store = TraceStore(8, index="exact")
    store.begin_request()
    store.add([10, 11, 12], torch.stack([basis(0), basis(1), basis(2)]))
    store.begin_request()
    store.add([20, 21], torch.stack([basis(2), basis(3)]))
    sims, ids = store.search(basis(2), k=2, visible=5)
    assert set(ids) == {2, 3} and sims[0] == pytest.approx(1.0, abs=1e-3)
    _, ids = store.search(basis(2), k=1, visible=3)  # record 3 not visible yet
    assert ids == [2]
    assert store.value(0, 5, len(store)) == [11, 12]  # never runs into the next request
    assert store.value(3, 5, len(store)) == [21]
    assert store.value(3, 5, visible_end=4) == []  # nor past what is committed


def test_store_evicts_oldest_requests_first():
    store = TraceStore(8, max_records=10, index="exact")
    for r in range(4):
        store.begin_request()
        store.add([100 * r + i for i in range(4)], torch.stack([basis(i) for i in range(4)]))
    assert len(store) <= 10 and store.evicted_records >= 6
    assert store.tokens[0] % 100 == 0  # a whole request went
    assert store.value(0, 10, len(store)) == store.tokens[1:4]


def test_faiss_index_agrees_with_exact_search():
    gen = torch.Generator().manual_seed(1)
    keys = torch.randn(500, 16, generator=gen)
    exact, ann = TraceStore(16, index="exact"), TraceStore(16, index="faiss")
    for store in (exact, ann):
        store.add(list(range(500)), keys)
    for q in range(5):
        query = normalise(torch.randn(1, 16, generator=gen))[0]
        assert exact.search(query, 1, 500)[1] == ann.search(query, 1, 500)[1]
    _, ids = ann.search(normalise(keys[499:500])[0], 3, visible=499)
    assert 499 not in ids and len(ids) == 3  # invisible records are filtered out of FAISS answers


def test_rejected_pool_matches_the_anchor_token_and_skips_the_current_cycle():
    pool = RejectedPool(capacity=4, dim=8)
    pool.add(torch.stack([basis(0), basis(0)]), [5, 6], [[7, 8], [9]], cycle=0)
    assert pool.search(basis(0), anchor=6, k=4, before_cycle=1)[1] == [1]
    assert pool.search(basis(0), anchor=6, k=4, before_cycle=0) == ([], [])
    assert pool.search(basis(0), anchor=99, k=4, before_cycle=1) == ([], [])
    pool.add(torch.stack([basis(1)] * 3), [1, 2, 3], [[1], [2], [3]], cycle=1)  # wraps around
    assert pool.size == 4 and pool.search(basis(0), anchor=5, k=4, before_cycle=5) == ([], [])


def test_endorsed_continuation_follows_the_models_own_argmax():
    tree = DraftTree.root(1)
    a = tree.add(0, 2, "x")      # rejected: the model wanted 3 at the root
    b = tree.add(a, 4, "x")      # the model's argmax at a is 4: followed
    tree.add(b, 9, "x")          # argmax at b is 5: not drafted, the walk stops after 5
    preds = [3, 4, 5, 0]
    assert endorsed_continuation(tree, preds, a, depth=6) == [4, 5]
    assert endorsed_continuation(tree, preds, a, depth=1) == [4]


def test_chain_depth_grows_with_similarity_and_rank_depth_with_rank():
    assert chain_depth(1.0, 0.5, 16) == 16
    assert chain_depth(0.75, 0.5, 16) == 8
    assert chain_depth(0.2, 0.5, 16) == 1  # below the floor: still at least one token
    assert [rank_depth(r, 16) for r in range(4)] == [16, 8, 5, 4]


def test_merge_pays_only_for_divergent_tokens_and_tags_shared_ones():
    tree = DraftTree.chain(1, [2, 3, 4], "pld")
    assert merge_cost(tree, [2, 3, 9, 9]) == 2 and merge_cost(tree, [2, 3]) == 0
    paid = merge_chains(tree, [(0.9, [2, 3, 9, 10]), (0.8, [2, 3, 4])], entry_budget=5, node_budget=10)
    assert [tree.tokens[n] for n in paid] == [9, 10]
    assert tree.sources[2] == {"pld", "sem"} and tree.sources[3] == {"pld", "sem"}
    assert tree.sources[paid[0]] == {"sem"} and tree.parents[paid[0]] == 2


def test_merge_respects_the_entry_and_node_budgets():
    tree = DraftTree.chain(1, [2], "pld")
    paid = merge_chains(tree, [(0.9, [5, 6, 7]), (0.8, [8, 9])], entry_budget=4, node_budget=100)
    assert len(paid) == 4 and [tree.tokens[n] for n in paid] == [5, 6, 7, 8]  # truncated
    tree = DraftTree.chain(1, [2], "pld")
    paid = merge_chains(tree, [(0.9, [5, 6, 7])], entry_budget=10, node_budget=3)
    assert len(tree) == 3 and len(paid) == 1


def test_calibrator_raises_the_floor_when_semantic_nodes_fail():
    cal = Calibrator(theta=0.5, target=0.3, alpha=0.5, gain=0.1)
    assert cal.theta() == pytest.approx(0.5)
    for _ in range(10):
        cal.update(paid=10, accepted=0)
    assert 0.5 < cal.theta() <= 0.7 and cal.depth_scale() == 0.5
    for _ in range(20):
        cal.update(paid=10, accepted=10)
    assert 0.3 <= cal.theta() < 0.5 and cal.depth_scale() == 1.5
