"""DraftTree: parent array, de-duplication, masks and positions on hand-built trees."""

import numpy as np
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
