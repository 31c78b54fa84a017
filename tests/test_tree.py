"""DraftTree: parent array, de-duplication, masks and positions on hand-built trees."""

import numpy as np
import pytest
import torch

from oilbird.tree import DraftTree


def small_tree() -> DraftTree:
    # root(5) -> 7 -> 9
    #         -> 8 -> 9
    #              -> 3
    tree = DraftTree.root(5)
    a = tree.add(0, 7, "x")
    tree.add(a, 9, "x")
    b = tree.add(0, 8, "y")
    tree.add(b, 9, "y")
    tree.add(b, 3, "y")
    return tree


def test_parent_array_and_depths():
    tree = small_tree()
    assert tree.tokens == [5, 7, 9, 8, 9, 3]
    assert tree.parents == [-1, 0, 1, 0, 3, 3]
    assert tree.depths == [0, 1, 2, 1, 2, 2]
    assert tree.path_to(4) == [3, 4]


def test_siblings_are_deduplicated_and_tagged():
    tree = small_tree()
    again = tree.add(0, 8, "z", score=0.9)
    assert again == 3 and len(tree) == 6
    assert tree.sources[3] == {"y", "z"}
    assert tree.scores[3] == 1.0  # max over sources
    # A chain sharing a prefix pays only for the new suffix.
    end = tree.add_chain(0, [8, 3, 4], "w")
    assert len(tree) == 7 and tree.parents[end] == 5 and "w" in tree.sources[5]


def test_chain_is_a_tree():
    tree = DraftTree.chain(1, [2, 3, 4], "pld")
    assert tree.parents == [-1, 0, 1, 2] and tree.depths == [0, 1, 2, 3]


def test_attention_mask_sees_prefix_self_and_ancestors_only():
    tree = small_tree()
    mask = tree.attention_mask(prefix_len=4, dtype=torch.float32)
    assert mask.shape == (1, 1, 6, 10)
    visible = (mask[0, 0] == 0).numpy()
    assert visible[:, :4].all()  # every node sees the whole cache
    expected = np.array([
        [1, 0, 0, 0, 0, 0],
        [1, 1, 0, 0, 0, 0],
        [1, 1, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 0, 0, 1, 1, 0],
        [1, 0, 0, 1, 0, 1],
    ], dtype=bool)
    assert (visible[:, 4:] == expected).all()
    assert mask[0, 0, 2, 8].item() == torch.finfo(torch.float32).min


def test_position_ids_share_positions_among_siblings():
    assert small_tree().position_ids(10).tolist() == [[10, 11, 12, 11, 12, 12]]


def test_truncated_keeps_a_valid_prefix():
    tree = small_tree().truncated(4)
    assert tree.tokens == [5, 7, 9, 8] and tree.parents == [-1, 0, 1, 0]
    assert tree.child(0, 8) == 3 and tree.child(3, 9) is None
    assert small_tree().truncated(0).tokens == [5]  # the root always stays


def test_best_path_follows_the_highest_scored_child_and_the_earliest_on_a_tie():
    tree = DraftTree.root(7)
    a = tree.add(0, 1, "x", 0.5)
    b = tree.add(0, 2, "y", 0.9)
    tree.add(a, 3, "x", 1.0)
    c = tree.add(b, 4, "y", 0.3)
    d = tree.add(b, 5, "z", 0.3)
    tree.add(c, 6, "y", 0.1)
    assert tree.best_path(10) == [b, c, c + 2]
    assert tree.best_path(1) == [b]
    assert tree.best_path(0) == [] and DraftTree.root(7).best_path(5) == []
    chain = tree.subtree(tree.best_path(2))
    assert chain.tokens == [7, 2, 4] and chain.parents == [-1, 0, 1] and chain.depths == [0, 1, 2]
    assert chain.sources[1:] == [{"y"}, {"y"}] and chain.scores[1:] == [0.9, 0.3]
    assert chain.child(1, 4) == 2 and d == c + 1


def test_subtree_renumbers_kept_nodes_and_refuses_an_orphan():
    tree = DraftTree.root(7)
    a = tree.add(0, 1, "x", 0.5)
    b = tree.add(0, 2, "y", 0.9)
    c = tree.add(a, 3, "x", 1.0)
    d = tree.add(b, 4, "y", 0.3)
    tree.draft_probs[d] = torch.ones(5)
    sub = tree.subtree([a, b, d])
    assert sub.tokens == [7, 1, 2, 4] and sub.parents == [-1, 0, 0, 2] and sub.depths == [0, 1, 1, 2]
    assert sub.child(2, 4) == 3 and sub.children(1) == [] and list(sub.draft_probs) == [3]
    with pytest.raises(ValueError, match="parent"):
        tree.subtree([c])


def test_the_greedy_path_follows_the_argmax_child_until_none_matches():
    tree = DraftTree.root(5)
    a = tree.add(0, 7, "pld")  # 1
    tree.add(0, 8, "tr")  # 2
    b = tree.add(a, 9, "pld")  # 3
    tree.add(b, 4, "pld")  # 4
    preds = [7, 9, 0, 6, 0]  # root -> 7 (node 1) -> 9 (node 3) -> 6: no such child
    assert tree.greedy_path(preds) == [a, b]
    assert tree.greedy_path([8, 0, 0, 0, 0]) == [2]
    assert tree.greedy_path([1, 0, 0, 0, 0]) == []
