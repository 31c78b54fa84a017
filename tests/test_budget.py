"""Hardware-aware budget: cost interpolation, counterfactual commits, and the online choice."""

from oilbird.budget import AdaptiveBudget, BudgetConfig, CostCurve, counterfactual_commits


def test_cost_curve_interpolates_and_extrapolates():
    curve = CostCurve({1: 0.06, 8: 0.10, 16: 0.11})
    assert curve.cost(1) == 0.06 and curve.cost(8) == 0.10
    assert abs(curve.cost(12) - 0.105) < 1e-12
    assert curve.cost(24) > curve.cost(16)
    assert CostCurve.from_json(curve.to_json()).points == curve.points


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


def test_exploration_uses_the_largest_budget_periodically():
    policy = AdaptiveBudget(CostCurve({1: 1.0, 64: 10.0}),
                            BudgetConfig(mode="auto", grid="1,64", explore_every=3), max_budget=64)
    choices = [policy.choose() for _ in range(6)]
    assert choices.count(64) == 2 and choices[2] == 64
