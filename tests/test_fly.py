"""FLy's gate, window and boundary rule on hand-built drafts, predictions and logits (oilbird.fly)."""

import math

import pytest
import torch

from oilbird.fly import FlyConfig, entropy, fly_walk
from oilbird.tree import DraftTree

UNSURE, SURE = 0.9, 0.05  # entropies at a node: above / below θ = 0.3


def chain(drafts, target, entropies=None):
    """A chain tree of `drafts` (d_0..d_{K-1}) whose target argmax at draft index j is target[j].

    preds[node] is the argmax predicting the node's child: node 0 (the anchor) predicts d_0.
    """
    tree = DraftTree.chain(1, drafts, "test")
    preds = list(target) + [99]  # the last draft node predicts the bonus
    ents = list(entropies) if entropies is not None else [UNSURE] * len(preds)
    return tree, preds, ents


def accepted(drafts, target, config, entropies=None):
    tree, preds, ents = chain(drafts, target, entropies)
    path, forgiven = fly_walk(tree, preds, ents, config)
    return len(path), [n - 1 for n in forgiven]  # n accepted drafts, forgiven draft indices


def test_exact_drafts_are_accepted_as_in_strict_verification():
    assert accepted([5, 6, 7], [5, 6, 7], FlyConfig()) == (3, [])
    assert accepted([5, 6, 7], [5, 0, 7], FlyConfig(window=6)) == (1, [])  # K = 3 < W: strict


def test_window_forgives_a_mismatch_followed_by_w_minus_1_matches_and_more_draft():
    k = 15
    target = list(range(100, 100 + k))
    drafts = list(target)
    drafts[2] = 7  # one mismatch at j = 2
    assert accepted(drafts, target, FlyConfig(window=6)) == (15, [2])
    drafts[5] = 8  # a second mismatch inside the first one's window (j + 1 .. j + 5): no forgiveness
    assert accepted(drafts, target, FlyConfig(window=6)) == (2, [])
    assert accepted(drafts, target, FlyConfig(window=3)) == (15, [2, 5])  # windows of 3 both hold


def test_boundary_rule_forgives_only_up_to_k_minus_w_minus_1():
    k, w = 15, 6
    target = list(range(100, 100 + k))
    for j in range(k):
        drafts = list(target)
        drafts[j] = 7
        n, forgiven = accepted(drafts, target, FlyConfig(window=w))
        if j <= k - w - 1:  # j <= 8 with K = 15
            assert (n, forgiven) == (k, [j])
        else:
            assert (n, forgiven) == (j, [])


def test_window_zero_leaves_only_the_gate():
    drafts, target = [5, 6, 7], [0, 0, 0]
    assert accepted(drafts, target, FlyConfig(window=0)) == (3, [0, 1, 2])
    assert accepted(drafts, target, FlyConfig(window=0), [UNSURE, SURE, UNSURE, UNSURE]) == (1, [0])


def test_window_as_long_as_the_draft_is_strict():
    target = list(range(100, 106))
    drafts = [7] + target[1:]
    assert accepted(drafts, target, FlyConfig(window=6)) == (0, [])  # W = K
    assert accepted(drafts, target, FlyConfig(window=5)) == (6, [0])  # W = K - 1: j = 0 <= K - W - 1


def test_gate_rejects_confident_mismatches_and_theta_near_zero_disables_it():
    target = list(range(100, 112))
    drafts = [7] + target[1:]
    sure_at_0 = [SURE] + [UNSURE] * 12
    assert accepted(drafts, target, FlyConfig(theta=0.3), sure_at_0) == (0, [])
    assert accepted(drafts, target, FlyConfig(theta=0.0), sure_at_0) == (12, [0])
    assert accepted(drafts, target, FlyConfig(theta=0.01), sure_at_0) == (12, [0])


def test_theta_one_behaves_as_strict_verification_on_real_entropies():
    # Logits of a model that is unsure (two tokens tie) and of one that is sure.
    logits = torch.full((2, 50), -10.0)
    logits[0, :2] = 5.0  # ~0.5 / 0.5
    logits[1, 0] = 8.0
    for kind in ("top3", "normalized"):
        h = entropy(logits, kind).tolist()
        assert h[0] > h[1] and all(x < 1 for x in h)
        target = list(range(100, 112))
        drafts = [7] + target[1:]
        ents = [h[0]] * 13
        assert accepted(drafts, target, FlyConfig(theta=1.0, entropy=kind), ents) == (0, [])
        assert accepted(drafts, target, FlyConfig(theta=0.3, entropy=kind), ents)[1] == ([0] if h[0] >= 0.3 else [])


def test_entropy_definitions_match_their_formulas():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.125, 0.125]]))
    p = [0.5, 0.25, 0.125, 0.125]
    top3 = -sum(x * math.log(x) for x in p[:3])
    full = -sum(x * math.log(x) for x in p) / math.log(4)
    assert entropy(logits, "top3").item() == pytest.approx(top3, abs=1e-6)
    assert entropy(logits, "normalized").item() == pytest.approx(full, abs=1e-6)
    uniform = torch.zeros(1, 8)
    assert entropy(uniform, "normalized").item() == pytest.approx(1.0, abs=1e-6)
    assert entropy(uniform, "top3").item() == pytest.approx(-3 * (1 / 8) * math.log(1 / 8), abs=1e-6)
    one_hot = torch.tensor([[0.0, -float("inf"), -float("inf")]])
    assert entropy(one_hot, "normalized").item() == 0.0


def test_on_a_tree_the_walk_forgives_the_child_whose_window_holds():
    # Root predicts 50; children 60 (then a 3-token exact run) and 70 (then a 4-token run).
    tree = DraftTree.root(1)
    tree.add_chain(0, [60, 61, 62, 63], "x")
    tree.add_chain(0, [70, 71, 72, 73, 74], "y")
    a, b = [1, 2, 3, 4], [5, 6, 7, 8, 9]
    preds = [0] * len(tree)
    preds[0] = 50
    for i, node in enumerate(a[:-1]):
        preds[node] = tree.tokens[a[i + 1]]
    for i, node in enumerate(b[:-1]):
        preds[node] = tree.tokens[b[i + 1]]
    ents = [UNSURE] * len(tree)
    path, forgiven = fly_walk(tree, preds, ents, FlyConfig(window=3))
    assert forgiven == [b[0]] and path == b  # both windows hold; the longer exact run wins
    path, forgiven = fly_walk(tree, preds, ents, FlyConfig(window=4))
    assert forgiven == [b[0]]  # 60's window reaches the end of its branch: only 70 qualifies
    path, forgiven = fly_walk(tree, preds, ents, FlyConfig(window=5))
    assert (path, forgiven) == ([], [])  # 70's run of 4 ends the draft: the boundary rule refuses it
    ents[0] = SURE
    assert fly_walk(tree, preds, ents, FlyConfig(window=3)) == ([], [])  # the gate sits at the parent


def test_config_is_validated():
    with pytest.raises(ValueError, match="entropy"):
        FlyConfig(entropy="renyi")
    with pytest.raises(ValueError, match="window"):
        FlyConfig(window=-1)
