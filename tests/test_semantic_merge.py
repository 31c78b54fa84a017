"""The semantic chains on hand-built trees (oilbird.semantic_merge): depth, merge, calibration."""

import pytest

from oilbird.semantic_merge import (Calibrator, chain_depth, endorsed_continuation, merge_chains, merge_cost,
                                    rank_depth)
from oilbird.tree import DraftTree


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
