"""The chain policy for chain-verifying engines (oilbird/integrations/vllm/chain_policy.py) on
hand-built trees, and through the adapter; no vLLM needed."""

from __future__ import annotations

import torch

from oilbird.integrations.vllm.adapter import EngineDrafter, StepRequest
from oilbird.acceptance import node_key, node_shapes
from oilbird.integrations.vllm.chain_policy import ChainCalibrator
from oilbird.integrations.vllm.config import EngineDrafterConfig
from oilbird.tree import DraftTree


def two_branches() -> DraftTree:
    """root 0 -> 1 (tr, alone) and root -> 2 -> 3 -> 4 (pld chain), in that build order."""
    tree = DraftTree.root(0)
    tree.add(0, 10, "tr", 0.9)
    tree.add_chain(0, [20, 21, 22], "pld", [0.9] * 3)
    return tree


def test_an_untried_key_gets_the_prior_and_updates_count_only_tried_nodes():
    cal = ChainCalibrator(prior=0.8, prior_weight=2.0)
    tree = two_branches()
    chain = tree.subtree([2, 3, 4])  # what the engine verified
    keys = [node_key(chain, n) for n in (1, 2, 3)]
    assert keys == [node_key(tree, n) for n in (2, 3, 4)]
    assert cal.p_accept(keys[0]) == 0.8
    cal.update(chain, accepted=1)  # node 2 accepted, node 3 rejected, node 4 never reached
    assert cal.counts[keys[0]] == [1, 1] and cal.counts[keys[1]] == [1, 0]
    assert keys[2] not in cal.counts
    assert cal.p_accept(keys[1]) == (0 + 1.6) / 3


def test_the_longer_promise_wins_until_its_source_proves_bad():
    cal = ChainCalibrator()
    tree = two_branches()
    path = cal.choose(tree, max_len=8, min_reach=0.0)
    assert path == [2, 3, 4]  # equal estimates: the chain promises more than the single node
    for _ in range(20):  # the pld chain is always rejected at its first node
        cal.update(tree.subtree(path), accepted=0)
    path = cal.choose(tree, max_len=8, min_reach=0.0)
    assert path == [1]


def test_the_chain_is_cut_where_its_reach_falls_below_min_reach():
    cal = ChainCalibrator(prior=0.5)
    tree = two_branches()
    assert cal.choose(tree, 8, min_reach=0.2) == [2, 3]  # reach 0.5, 0.25, then 0.125
    assert cal.choose(tree, 1, min_reach=0.0) == [2]  # and never past max_len
    assert cal.choose(tree, 8, min_reach=0.6) == []  # nothing worth verifying: no drafts


def test_after_a_chain_accepted_whole_a_young_key_past_the_cut_is_tried():
    cal = ChainCalibrator(prior=0.5)
    tree = two_branches()  # pld chain 2 -> 3 -> 4: reach 0.5, 0.25, 0.125
    assert cal.choose(tree, 8, 0.2, context="full") == [2, 3]  # the rule off (extend_trials 0)
    assert cal.choose(tree, 8, 0.2, context="full", extend_trials=8) == [2, 3, 4]  # one node more
    assert cal.choose(tree, 8, 0.2, context="part", extend_trials=8) == [2, 3]  # only after 'full'
    assert cal.choose(tree, 2, 0.2, context="full", extend_trials=8) == [2, 3]  # never past max_len
    assert cal.choose(tree, 8, 0.6, context="full", extend_trials=8) == [2]  # one node, then stop


def test_a_key_tried_enough_times_is_left_to_its_estimate():
    cal = ChainCalibrator(prior=0.5)
    tree = two_branches()
    deep = node_key(tree, 4)
    cal.counts[deep] = [8, 0]  # node 4's key: tried 8 times, never accepted
    assert cal.trials(deep) == 8
    assert cal.choose(tree, 8, 0.2, context="full", extend_trials=8) == cal.choose(tree, 8, 0.2, context="full")
    assert cal.choose(tree, 8, 0.2, context="full", extend_trials=9)[-1] == 4  # one trial younger: tried


def test_the_chain_lock_in_mends_with_the_rule():
    """A deep key that missed its first trials is cut for ever without the rule; with it, a
    request copying a long match (every chain accepted whole) tries it again and learns it."""
    for extend, expect_learnt in ((0, False), (8, True)):
        cal = ChainCalibrator(prior=0.9)
        tree = DraftTree.root(0)
        tree.add_chain(0, [1, 2, 3, 4, 5], "pld", [0.9] * 5)
        deep = node_key(tree, 3)
        cal.counts[deep] = [5, 0]  # five early misses at depth 3: its estimate 1.8 / 7 < 0.3
        lengths = []
        for _ in range(20):
            path = cal.choose(tree, 8, 0.3, context="full", extend_trials=extend)
            lengths.append(len(path))
            cal.update(tree.subtree(path), accepted=len(path), context="full")  # all accepted
        assert (lengths[-1] == 5) == expect_learnt, lengths
        assert lengths[0] == (3 if extend else 2)
        if not extend:
            assert set(lengths) == {2}  # locked: nodes 3-5 never verified again


PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6]


def step(rid, committed, drafts=(), tenant="t") -> StepRequest:
    return StepRequest(rid, list(PROMPT), tenant, list(drafts), list(committed),
                       hidden=torch.zeros(len(drafts) + 1, 4))


def test_each_tenant_learns_from_its_own_requests_only():
    engine = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.0))
    for i in range(15):  # tenant t: every draft rejected
        rid = f"a{i}"
        (proposal,) = engine.step([step(rid, [7])], max_drafts=4)
        assert proposal
        engine.step([step(rid, [0], drafts=proposal)], max_drafts=4)
        engine.finish(rid)
    t_keys = engine.calibrators["t"].counts
    assert sum(tried for tried, _ in t_keys.values()) == 15
    assert all(accepted == 0 for _, accepted in t_keys.values())
    (fresh,) = engine.step([step("b", [7], tenant="u")], max_drafts=4)
    assert fresh == [8, 5, 6, 7] and "u" in engine.calibrators and not engine.calibrators["u"].counts


def test_a_source_that_keeps_failing_stops_drafting():
    engine = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.1))
    proposals = []
    for i in range(20):  # the prior 0.8 over 2 observations falls below 0.1 after 15 failures
        rid = f"a{i}"
        (proposal,) = engine.step([step(rid, [7])], max_drafts=4)
        proposals.append(proposal)
        if proposal:
            engine.step([step(rid, [0], drafts=proposal)], max_drafts=4)
        engine.finish(rid)
    assert proposals[0] == [8, 5, 6, 7] and proposals[-1] == []


def test_a_batch_asks_more_of_a_draft_token():
    from oilbird.integrations.vllm.chain_policy import batch_min_reach

    assert batch_min_reach(0.1, 1) == 0.1 and batch_min_reach(0.1, 0) == 0.1
    reaches = [batch_min_reach(0.1, b) for b in (1, 2, 4, 8, 64)]
    assert reaches == sorted(reaches) and reaches[-1] == 0.5
    assert batch_min_reach(0.1, 8, cap=0.3) == 0.3 and batch_min_reach(0.4, 8, cap=0.3) == 0.4  # never below min_reach
    assert abs(batch_min_reach(0.1, 2) - 0.2 / 1.1) < 1e-12
    engine = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.3))
    (alone,) = engine.step([step("a", [7])], max_drafts=4)  # prior 0.8: reach 0.8, 0.64, 0.51, 0.41
    assert alone == [8, 5, 6, 7]
    batch = engine.step([step("b", [7]), step("c", [7])], max_drafts=4)  # needs 0.46 each
    assert batch == [[8, 5, 6], [8, 5, 6]]


def test_a_context_keeps_its_own_record_shrunk_towards_the_common_one():
    cal = ChainCalibrator(prior=0.5, prior_weight=2.0, context_weight=8.0)
    tree = two_branches()
    key = node_key(tree, 2)
    assert cal.p_accept(key, "miss") == cal.p_accept(key) == 0.5  # nothing seen: the prior
    for _ in range(6):
        cal.update(tree.subtree([2, 3, 4]), accepted=3, context="full")
        cal.update(tree.subtree([2, 3, 4]), accepted=0, context="miss")
    common = cal.p_accept(key)
    assert common == (6 + 1.0) / (12 + 2.0)  # every trial counts in the common record
    assert cal.p_accept(key, "full") == (6 + common * 8) / (6 + 8)
    assert cal.p_accept(key, "miss") == (0 + common * 8) / (6 + 8)
    assert cal.p_accept(key, "idle") == common  # an unseen context borrows the common record
    assert cal.choose(tree, 8, 0.3, "full") == [2, 3, 4] and cal.choose(tree, 8, 0.3, "miss") == []


def test_chain_outcomes():
    from oilbird.integrations.vllm.chain_policy import chain_outcome

    assert [chain_outcome(0, 0), chain_outcome(3, 0), chain_outcome(3, 2), chain_outcome(3, 3)] == \
        ["idle", "miss", "part", "full"]


def test_the_adapter_calibrates_each_chain_in_the_context_it_was_proposed_in():
    engine = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.0))
    (first,) = engine.step([step("a", [7])], max_drafts=4)
    assert first == [8, 5, 6, 7] and engine.contexts["a"] == "start"
    (second,) = engine.step([step("a", [8, 5, 0], drafts=first)], max_drafts=4)
    cal = engine.calibrators["t"]
    assert {c for c, _ in cal.context_counts} == {"start"}  # the context the chain was proposed in
    assert engine.contexts["a"] == "part"
    engine.finish("a")
    assert "a" not in engine.contexts
    plain = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.0, calibration_context="none"))
    (first,) = plain.step([step("b", [7])], max_drafts=4)
    plain.step([step("b", [8, 5, 0], drafts=first)], max_drafts=4)
    assert not plain.calibrators["t"].context_counts and not plain.contexts


def test_the_adapter_extends_a_chain_after_one_accepted_whole_when_configured():
    chains = {}
    for extend in (0, 8):
        engine = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.5, extend_trials=extend))
        (first,) = engine.step([step("a", [7])], max_drafts=6)  # prior 0.8: reach 0.8, 0.64, 0.51, 0.41
        (second,) = engine.step([step("a", first + [9], drafts=first)], max_drafts=6)  # all accepted
        assert first == [8, 5, 6] and engine.contexts["a"] == "full"
        chains[extend] = second
    assert chains[8] == chains[0] + [5]  # one young key past the cut


def test_the_chain_keeps_its_nodes_shapes_in_the_tree_for_the_update():
    cal = ChainCalibrator()
    tree = two_branches()
    shapes = node_shapes(tree)  # the lone 'tr' node: a leaf beside the chain; the chain's head: 2 deep under it
    assert shapes[1] == (0, 2) and shapes[2] == (2, 2)
    path = cal.choose(tree, max_len=8, min_reach=0.0, shapes=shapes)
    assert path == [2, 3, 4]
    chain = tree.subtree(path)
    cal.update(chain, accepted=3, shapes=[shapes[0]] + [shapes[n] for n in path])
    key = node_key(chain, 1)
    assert cal.shape_counts[(key, shapes[2])] == [1, 1]  # its shape in the tree, not in the chain
    assert (key, node_shapes(chain)[1]) not in cal.shape_counts


def test_the_adapter_learns_per_shape_unless_told_not_to():
    for shaped in (True, False):
        engine = EngineDrafter.build(EngineDrafterConfig(method="pld", min_reach=0.0, calibration_shape=shaped))
        (proposal,) = engine.step([step("a", [7])], max_drafts=4)
        assert proposal == [8, 5, 6, 7]
        assert len(engine.chain_shapes.get("a", [])) == (5 if shaped else 0)  # the root and 4 drafts
        engine.step([step("a", [8, 0], drafts=proposal)], max_drafts=4)  # the first accepted
        counts = engine.calibrators["t"].shape_counts
        assert sum(tried for tried, _ in counts.values()) == (2 if shaped else 0)
        assert sum(hit for _, hit in counts.values()) == (1 if shaped else 0)
        engine.finish("a")
        assert "a" not in engine.chain_shapes
