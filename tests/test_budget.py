"""The 'auto' budget (oilbird/budget.py): counterfactual commits and the online choice over a cost curve."""

from oilbird.budget import AdaptiveBudget, BudgetConfig, counterfactual_commits
from oilbird.cost_curve import CostCurve


def test_counterfactual_commits_cut_the_path_at_the_budget():
    path = [1, 3, 9]  # accepted nodes, indices increasing along the path
    assert counterfactual_commits(path, 1) == 1  # root only: the bonus
    assert counterfactual_commits(path, 4) == 3
    assert counterfactual_commits(path, 10) == 4
    assert counterfactual_commits([], 64) == 1


def test_cpu_like_curve_prefers_small_trees_when_acceptance_is_shallow():
    cpu = CostCurve({1: 0.06, 2: 0.065, 4: 0.07, 8: 0.10, 16: 0.11, 32: 0.14, 64: 0.19})
    policy = AdaptiveBudget(cpu, BudgetConfig(mode="auto", grid="1,2,4,8,16,32,64",
                                              explore_every=1000), max_budget=64)
    for _ in range(50):  # drafts accepted only at the first two nodes
        policy.observe(offered=64, tree_size=64, path=[1, 2])
    assert policy.choose() == 4  # 3 tokens for 0.07 s beats 3 tokens for 0.19 s


def test_gpu_like_flat_curve_prefers_the_largest_useful_tree():
    gpu = CostCurve({1: 0.02, 64: 0.021})
    policy = AdaptiveBudget(gpu, BudgetConfig(mode="auto", grid="1,8,32,64", explore_every=1000),
                            max_budget=64)
    for _ in range(50):
        policy.observe(offered=64, tree_size=64, path=[1, 5, 20, 40])
    assert policy.choose() == 64


def test_exploration_probes_twice_the_best_budget_periodically():
    policy = AdaptiveBudget(CostCurve({1: 1.0, 64: 10.0}),
                            BudgetConfig(mode="auto", grid="1,2,4,8,64", explore_every=3,
                                         explore_share=float("inf")), max_budget=64)
    assert policy.choose() == 64  # the first tree is the largest: it informs every size
    policy.observe(offered=64, tree_size=64, path=[])  # nothing accepted: best is the cheapest
    choices = [policy.choose() for _ in range(17)]
    probes = choices[1::3]  # every third forward probes up the ladder 2x, 4x, 8x, 16x... best
    assert probes == [2, 4, 8, 64, 2, 4] and set(choices) - set(probes) == {1}


def test_probes_add_at_most_their_share_of_the_forward_time_on_a_steep_curve():
    # A CPU-like curve: 64 nodes cost 9x one. Probes come only as the forwards at the best budget
    # earn them, so what they add stays within explore_share of those forwards' time, and the
    # large rungs come far more rarely than the small ones.
    cpu = CostCurve({1: 1.0, 2: 1.2, 4: 1.5, 8: 2.0, 16: 3.0, 32: 5.0, 64: 9.0})
    policy = AdaptiveBudget(cpu, BudgetConfig(mode="auto", grid="1,2,4,8,16,32,64", explore_every=4,
                                              explore_share=0.1), max_budget=64)
    policy.observe(offered=64, tree_size=64, path=[])  # nothing accepted: the best stays 1
    choices = [policy.choose() for _ in range(2000)]
    extra = sum(cpu.cost(b) - cpu.cost(1) for b in choices)
    assert 0 < extra <= 0.1 * len(choices) * cpu.cost(1)  # within the share of the best's time
    assert choices.count(2) > 5 * choices.count(64) > 0  # every rung is probed, the cheap ones more
    # Without the allowance (the old cadence), every fourth forward probes whatever it costs.
    free = AdaptiveBudget(cpu, BudgetConfig(mode="auto", grid="1,2,4,8,16,32,64", explore_every=4,
                                            explore_share=float("inf")), max_budget=64)
    free.observe(offered=64, tree_size=64, path=[])
    assert sum(b > 1 for b in (free.choose() for _ in range(400))) == 100


def test_the_ladder_gets_past_a_cost_step_that_stalls_a_one_step_climb():
    # CPU-like: 2 tokens cost 1.6x one, 12 barely more. Drafts are accepted 4 deep but the
    # first draft token only half the time: budget 2 never pays, budget 12 does.
    cpu = CostCurve({1: 0.065, 2: 0.105, 4: 0.10, 8: 0.106, 12: 0.122, 16: 0.15, 64: 0.33})
    policy = AdaptiveBudget(cpu, BudgetConfig(mode="auto", grid="1,2,4,8,12,16,64", explore_every=4),
                            max_budget=64)
    for i in range(400):
        budget = policy.choose()
        path = list(range(1, min(budget, 5))) if i % 2 else []  # 4 accepted, every other forward
        policy.observe(offered=budget, tree_size=budget, path=path)
    assert policy.best() in (8, 12)


def test_probes_let_the_choice_climb_when_deep_drafts_are_accepted():
    cpu = CostCurve({1: 0.06, 2: 0.1, 4: 0.1, 8: 0.1, 16: 0.14, 32: 0.19, 64: 0.33})
    policy = AdaptiveBudget(cpu, BudgetConfig(mode="auto", grid="1,2,4,8,16,32,64", explore_every=2),
                            max_budget=64)
    chosen = []
    for _ in range(200):  # a drafter whose trees are accepted 12 nodes deep, along nodes 1..12
        budget = policy.choose()
        chosen.append(budget)
        policy.observe(offered=budget, tree_size=budget, path=list(range(1, min(budget, 13))))
    assert policy.best() == 16  # 13 tokens for 0.14 s beats everything smaller or larger
    assert chosen[0] == 64  # the first tree is the largest
    assert chosen.count(16) >= len(chosen) // 2 - 1  # every forward that is not a probe


def test_forwards_with_nothing_to_propose_are_not_charged_a_full_budget():
    # A prompt-lookup-like drafter: 3 forwards in 4 it has no match (a root-only tree); the 4th it
    # proposes a 10-token chain of which 3 are accepted. Charging cost(B) for the empty forwards
    # would make every budget look worse than 1; charging what was built finds B = 4.
    cpu = CostCurve({1: 0.065, 2: 0.105, 4: 0.10, 8: 0.106, 12: 0.122, 16: 0.15})
    policy = AdaptiveBudget(cpu, BudgetConfig(mode="auto", grid="1,2,4,8,12,16", explore_every=1000,
                                              decay=1.0), max_budget=16)
    for _ in range(40):
        for _ in range(3):
            policy.observe(offered=16, tree_size=1, path=[])
        policy.observe(offered=16, tree_size=11, path=[1, 2, 3])
    assert policy.best() == 4
    assert policy.rate(4) > policy.rate(1) * 1.4
