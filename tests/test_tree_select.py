"""The 'fit' budget (oilbird/tree_select.py): reaches, the subtree that pays for its forward, and
the online acceptance model behind it, on hand-built trees."""

import pytest

from oilbird.acceptance import HEIGHT_BINS, AcceptanceModel, ExplorationFloor, node_key, node_shapes
from oilbird.cost_curve import CostCurve
from oilbird.tree import DraftTree
from oilbird.tree_select import FittedTree, extend, fit_subtree, reaches, tree_outcome


def two_source_tree() -> DraftTree:
    # root -> 1 (lex) -> 2 (lex) -> 3 (lex)
    #      -> 4 (sem) -> 5 (sem)
    tree = DraftTree.root(0)
    tree.add_chain(0, [1, 2, 3], "lex", [0.9, 0.9, 0.9])
    tree.add_chain(0, [4, 5], "sem", [0.9, 0.9])
    return tree


def test_reach_is_the_product_along_the_path():
    tree = two_source_tree()
    r = reaches(tree, [1.0, 0.5, 0.5, 0.5, 0.2, 0.5])
    assert r == [1.0, 0.5, 0.25, 0.125, 0.2, 0.1]


def test_a_flat_cost_keeps_every_node_a_steep_one_keeps_only_the_likely():
    r = [1.0, 0.9, 0.8, 0.1, 0.05]
    assert fit_subtree(r, lambda n: 1.0) == [1, 2, 3, 4]  # free nodes always pay
    steep = lambda n: 1.0 + 0.2 * (n - 1)  # each node costs a fifth of a step
    assert fit_subtree(r, steep) == [1, 2]  # 2.7 tokens / 1.4 beats 2.8 / 1.6 and 1.9 / 1.2
    assert fit_subtree(r, lambda n: float(n)) == []  # a node costs a whole step: verify none


def test_the_kept_nodes_are_ancestor_closed():
    tree = two_source_tree()
    r = reaches(tree, [1.0, 0.9, 0.9, 0.9, 0.95, 0.1])  # sem's first node beats lex's
    keep = fit_subtree(r, lambda n: 1.0 + 0.05 * n)
    assert keep == [1, 2, 3, 4]
    assert all(tree.parents[n] in {0, *keep} for n in keep)
    tree.subtree(keep)  # raises if a kept node's parent were dropped


def test_the_policy_learns_which_source_to_trust():
    curve = CostCurve({1: 1.0, 2: 1.2, 8: 2.4})  # a draft node costs a fifth of a step
    policy = FittedTree(curve, max_budget=64)
    assert policy.choose() == 64
    tree = two_source_tree()
    assert policy.select(tree) == [1, 2, 3, 4, 5]  # the optimistic prior tries both sources
    for _ in range(30):  # lex always accepted to depth 3, sem never
        policy.verified(64, tree, [1, 2, 3])
    model = policy.model
    assert model.p_accept(node_key(tree, 1)) > 0.9 and model.p_accept(node_key(tree, 4)) < 0.1
    assert policy.select(tree) == [1, 2, 3]


def test_only_nodes_whose_parent_was_accepted_count_as_tried():
    model = AcceptanceModel(prior=0.5, prior_weight=0.0)
    tree = two_source_tree()
    model.update_tree(tree, [4])  # sem's first accepted, its child rejected; lex's first rejected
    assert model.counts[node_key(tree, 4)] == [1, 1]
    assert model.counts[node_key(tree, 5)] == [1, 0]
    assert model.counts[node_key(tree, 1)] == [1, 0]
    assert node_key(tree, 2) not in model.counts  # its parent was never accepted: not tried


def test_tree_outcome_names_how_the_tree_went():
    tree = two_source_tree()
    assert tree_outcome(DraftTree.root(0), []) == "idle"
    assert tree_outcome(tree, []) == "miss"
    assert tree_outcome(tree, [1]) == "part"  # node 1 has a child that was rejected
    assert tree_outcome(tree, [1, 2, 3]) == "full"  # ended at a leaf
    assert tree_outcome(tree, [4, 5]) == "full"


def test_the_fit_spends_by_the_previous_outcome():
    # A copying request: after a full acceptance the chain is accepted again, after a miss it
    # is rejected. Per context, the fit verifies the chain after 'full' and nothing after 'miss';
    # without contexts both get the same (pooled) choice.
    curve = CostCurve({1: 1.0, 2: 1.3, 4: 1.9})  # a draft node costs 0.3 of a step
    tree = DraftTree.root(0)
    tree.add_chain(0, [1, 2, 3], "lex", [0.9, 0.9, 0.9])
    flat, ctx = FittedTree(curve, 64), FittedTree(curve, 64, use_context=True)
    for policy in (flat, ctx):
        for _ in range(40):
            policy.verified(64, tree, [1, 2, 3], "full")
            policy.verified(64, tree, [], "miss")
    assert ctx.select(tree, "full") == [1, 2, 3]
    assert ctx.select(tree, "miss") == []
    assert flat.select(tree, "full") == flat.select(tree, "miss")


def test_against_a_long_run_rate_a_rich_tree_gets_more_and_a_poor_one_less():
    cost = lambda n: 1.0 + 0.2 * (n - 1)  # each node costs a fifth of a step
    rich = [1.0, 0.9, 0.8, 0.7, 0.5, 0.35]
    poor = [1.0, 0.3, 0.28, 0.26]
    # Each forward on its own: the nodes that raise that forward's tokens per step.
    assert fit_subtree(rich, cost) == [1, 2, 3, 4]  # 0.35 / 0.2 is below 3.9 / 1.8
    assert fit_subtree(poor, cost) == [1, 2, 3]  # a node pays while its reach beats the forward's own rate
    # Against a long-run rate of 1.6 tokens per step, a node pays when reach / 0.2 > 1.6.
    assert fit_subtree(rich, cost, rate=1.6) == [1, 2, 3, 4, 5]
    assert fit_subtree(poor, cost, rate=1.6) == []


def test_the_rate_objective_learns_the_long_run_rate():
    curve = CostCurve({1: 1.0, 2: 1.2, 8: 2.4})
    policy = FittedTree(curve, 64, objective="rate")
    assert policy.tokens / policy.seconds == 1.0  # one autoregressive step's worth to start
    tree = two_source_tree()
    policy.verified(64, tree, [1, 2, 3])  # 4 tokens for a 6-node forward
    assert policy.tokens == 5.0 and abs(policy.seconds - (1.0 + curve.cost(6))) < 1e-12
    with pytest.raises(ValueError, match="objective"):
        FittedTree(curve, 64, objective="sometimes")


def test_a_drafter_pruned_to_nothing_is_probed_and_can_earn_its_way_back():
    # The curve makes a draft node cost a third of a step: after 40 misses in a row the fit
    # verifies nothing of the tree. Every ninth such forward is a probe of the likeliest 3 nodes;
    # once the traffic turns and the probes are accepted, the fit verifies the chain again.
    curve = CostCurve({1: 1.0, 2: 1.33, 4: 2.0})
    tree = DraftTree.root(0)
    tree.add_chain(0, [1, 2, 3, 4], "lex", [0.9] * 4)
    policy = FittedTree(curve, 64, explore_every=8, explore_nodes=3)
    for _ in range(40):
        policy.verified(64, tree.subtree([1]), [])
    chosen = [policy.select(tree) for _ in range(18)]
    assert chosen[:8] == [[]] * 8 and chosen[8] == [1, 2, 3]  # the ninth forward probes
    assert chosen[9:17] == [[]] * 8 and chosen[17] == [1, 2, 3]
    assert policy.calibration()["probes"] == 2
    assert policy.select(DraftTree.root(0)) == []  # nothing offered: no probe, no count
    for _ in range(60):  # the probes now succeed
        policy.verified(64, tree.subtree([1, 2, 3]), [1, 2, 3])
    assert policy.select(tree) == [1, 2, 3, 4]


def test_without_exploration_the_fit_stays_locked_out():
    curve = CostCurve({1: 1.0, 2: 1.33, 4: 2.0})
    tree = DraftTree.root(0)
    tree.add_chain(0, [1, 2], "lex", [0.9] * 2)
    policy = FittedTree(curve, 64, explore_every=0)
    for _ in range(40):
        policy.verified(64, tree.subtree([1]), [])
    assert all(policy.select(tree) == [] for _ in range(50))
    with pytest.raises(ValueError, match="explore_every"):
        FittedTree(curve, 64, explore_every=-1)


def lex_chain(length: int) -> DraftTree:
    tree = DraftTree.root(0)
    tree.add_chain(0, list(range(1, length + 1)), "lex", [0.9] * length)  # one key per depth
    return tree


def test_extend_deepens_the_kept_tree_by_its_likeliest_eligible_node():
    tree = two_source_tree()  # lex 1 -> 2 -> 3, sem 4 -> 5
    reach = [1.0, 0.9, 0.5, 0.4, 0.6, 0.55]
    anything = lambda n: True
    assert extend(tree, [1], reach, anything) == [1, 2]  # under a kept leaf; never a new branch (4)
    assert extend(tree, [1], reach, lambda n: n != 2) == [1]  # nothing eligible
    assert extend(tree, [1, 4], reach, anything) == [1, 4, 5]  # 5 (0.55) beats 2 (0.5)
    assert extend(tree, [1, 2, 3, 4, 5], reach, anything) == [1, 2, 3, 4, 5]  # nothing left


def test_after_a_whole_tree_was_accepted_the_fit_tries_a_locked_key_again():
    # Early on the chain's third node failed three times; the nodes under it were never tried.
    # Then the traffic turns: the whole chain would be accepted. The proposal never comes to
    # nothing, so the exploration floor does not fire: the estimates alone keep verifying the
    # first two nodes for ever. With `extend_trials`, a tree accepted whole is followed by one
    # that also verifies the likeliest node past the cut, if its key has been tried fewer than
    # that many times, and the estimates learn that the chain holds.
    curve = CostCurve({1: 1.0, 2: 1.2, 8: 2.4})  # a draft node costs a fifth of a step
    tree = lex_chain(6)
    chosen = {}
    for trials in (0, 8):
        policy = FittedTree(curve, 64, extend_trials=trials)
        context = ""
        for _ in range(3):
            policy.select(tree, context)
            policy.verified(64, tree, [1, 2], context)
            context = tree_outcome(tree, [1, 2])
        assert context == "part" and policy.select(tree, context) == [1, 2]  # only after 'full'
        for _ in range(20):
            keep = policy.select(tree, context)
            verified, path = tree.subtree(keep), list(range(1, len(keep) + 1))  # all accepted
            policy.verified(64, verified, path, context)
            context = tree_outcome(verified, path)
        chosen[trials] = policy.select(tree)
    assert chosen[0] == [1, 2]
    assert chosen[8] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(ValueError, match="extend_trials"):
        FittedTree(curve, 64, extend_trials=-1)


def test_a_key_tried_often_enough_is_left_to_its_estimate():
    # The third node has failed 8 times: its estimate is earned, and a whole tree does not
    # buy it another trial.
    curve = CostCurve({1: 1.0, 2: 1.2, 8: 2.4})
    tree = lex_chain(6)
    policy = FittedTree(curve, 64, extend_trials=8)
    for _ in range(8):
        policy.verified(64, tree, [1, 2])
    assert policy.model.trials(node_key(tree, 3)) == 8
    assert policy.select(tree, "full") == [1, 2]
    policy = FittedTree(curve, 64, extend_trials=9)
    for _ in range(8):
        policy.verified(64, tree, [1, 2])
    assert policy.select(tree, "full") == [1, 2, 3]


def test_the_exploration_floor_probes_every_ninth_cut_in_a_row():
    floor = ExplorationFloor(every=8)
    assert [floor.probe_due() for _ in range(18)] == ([False] * 8 + [True]) * 2
    for _ in range(5):
        floor.probe_due()
    floor.drafted()  # a proposal kept in part: the count starts again
    assert [floor.probe_due() for _ in range(9)] == [False] * 8 + [True] and floor.probes == 3
    assert not any(ExplorationFloor(every=0).probe_due() for _ in range(50))
    with pytest.raises(ValueError, match="explore_every"):
        ExplorationFloor(every=-1)


def leaf_and_chain(first: int = 1) -> DraftTree:
    """root -> a lone 'lex' node (nothing drafted under it) and root -> a 'lex' chain of four:
    their first nodes share a key (same source, depth and score) but not a shape."""
    tree = DraftTree.root(0)
    tree.add(0, first, "lex", 0.9)
    tree.add_chain(0, [first + 10, 12, 13, 14], "lex", [0.9] * 4)
    return tree


def test_node_shapes_read_how_far_the_drafter_went_and_its_alternatives():
    tree = leaf_and_chain()
    # heights 0, 3, 2, 1, 0 -> bins 0, 2 (2-3), 2, 1, 0; the root's two children are siblings
    assert node_shapes(tree) == [(0, 1), (0, 2), (2, 2), (2, 1), (1, 1), (0, 1)]
    tree.add_chain(5, [15, 16, 17, 18], "lex")  # node 2's subtree now 8 deep: the last height bin
    tree.add(0, 30, "sem")
    tree.add(0, 31, "sem")
    shapes = node_shapes(tree)
    assert shapes[2] == (len(HEIGHT_BINS), 3)  # siblings capped at 3
    assert shapes[1] == (0, 3)


def test_shapes_refine_a_key_that_mixes_sure_and_unsure_nodes():
    # The drafter's lone guesses are always rejected, its long continuations always accepted:
    # one key for both. Without shapes the estimate is their mix; with them each gets its own.
    curve = CostCurve({1: 1.0, 2: 1.2, 8: 2.4})  # a node costs a fifth of a step
    lone = DraftTree.root(0)
    lone.add(0, 1, "lex", 0.9)
    chain = DraftTree.root(0)
    chain.add_chain(0, [11, 12, 13, 14], "lex", [0.9] * 4)
    key = node_key(chain, 1)
    assert node_key(lone, 1) == key
    shaped = FittedTree(curve, 64, explore_every=0)
    blind = FittedTree(curve, 64, explore_every=0, use_shape=False)
    for policy in (shaped, blind):
        for _ in range(30):
            for tree, accepted in ((lone, False), (chain, True)):
                keep = policy.select(tree)  # verified as the decode loop does: the kept subtree
                policy.verified(64, tree.subtree(keep), list(range(1, len(keep) + 1)) if accepted else [])
    assert shaped.model.p_accept(key, shape=node_shapes(chain)[1]) > 0.8
    assert shaped.model.p_accept(key, shape=node_shapes(lone)[1]) < 0.2
    assert 0.3 < blind.model.p_accept(key) < 0.7  # the key alone: the mix
    assert shaped.select(lone) == [] and shaped.select(chain) == [1, 2, 3, 4]
    assert blind.select(lone) == [1]  # the mix pays for the lone node, forward after forward
    # Both keep the estimates' honesty per shape; the blind one's shows what it mixes.
    # ('h0 s1': the lone nodes and the chains' last nodes; 'h2 s1': the chains' first two)
    leaves, heads = (blind.calibration()["by_shape"][k] for k in ("h0 s1", "h2 s1"))
    assert heads["tried"] == 60 and heads["accepted"] == 1 and heads["estimate"] < 0.8
    assert leaves["accepted"] < 0.55 and leaves["estimate"] > leaves["accepted"] + 0.1
    assert shaped.calibration()["by_shape"]["h0 s1"]["tried"] < leaves["tried"] - 10  # lone nodes cut once learnt


def test_an_unseen_shape_starts_from_its_key_estimate():
    model = AcceptanceModel(prior=0.5, prior_weight=2.0, shape_weight=4.0)
    tree = leaf_and_chain()
    shapes = node_shapes(tree)
    for _ in range(6):
        model.update_tree(tree, [2, 3, 4, 5], shapes=shapes)  # node 1 (a leaf) rejected, node 2 accepted
    key = node_key(tree, 1)
    assert model.counts[key] == [12, 6]
    assert model.shape_counts[(key, shapes[1])] == [6, 0] and model.shape_counts[(key, shapes[2])] == [6, 6]
    base = (6 + 0.5 * 2) / (12 + 2)
    assert model.p_accept(key, shape=(1, 1)) == pytest.approx(base)  # never seen: the key's estimate
    assert model.p_accept(key, shape=shapes[2]) == pytest.approx((6 + 4 * base) / (6 + 4))
    model.update_tree(tree, [2])  # without shapes: the key's counts only
    assert model.counts[key] == [14, 7] and model.shape_counts[(key, shapes[2])] == [6, 6]
