"""Lossless sampling (docs/SAMPLING.md): the walk's output distribution equals token-by-token
sampling, exactly, on a tiny transformer; a biased walk fails the same test; seeds reproduce;
on SmolLM2 every method's token histograms match `ar` sampling."""

import math
from collections import Counter
from itertools import product

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from oilbird.sampling import Sampler, SamplingConfig, sample_walk, warped_probs
from oilbird.tree import DraftTree

V, HORIZON, SAMPLES = 6, 3, 20_000
PROMPT = [0, 1, 2]
CONFIG = SamplingConfig(temperature=0.7, top_k=4, top_p=0.95)  # two tokens get p = 0 everywhere


@pytest.fixture(scope="module")
def conditional():
    """prefix (tuple of generated ids) -> the tiny model's warped distribution of the next token."""
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, initializer_range=0.5)).eval()
    memo = {}

    def dist(prefix: tuple) -> torch.Tensor:
        if prefix not in memo:
            with torch.inference_mode():
                logits = model(input_ids=torch.tensor([PROMPT + list(prefix)])).logits[0, -1]  # [V]
            memo[prefix] = warped_probs(logits, CONFIG)
        return memo[prefix]
    return dist


def exact_joint(dist) -> dict[tuple, float]:
    """P(x1, x2, x3) under plain token-by-token sampling, enumerated."""
    return {seq: math.prod(float(dist(seq[:i])[seq[i]]) for i in range(HORIZON))
            for seq in product(range(V), repeat=HORIZON)}


def branchy_tree(anchor: int, dist, prefix: tuple) -> DraftTree:
    """Root children: the most likely token, then a p = 0 token, then the second most likely; the
    first child gets its two most likely continuations, so a rejection must renormalize."""
    order = dist(prefix).argsort(descending=True).tolist()  # most likely first; the last has p = 0
    tree = DraftTree.root(anchor)
    best = tree.add(0, order[0], "t")
    tree.add(0, order[-1], "t")
    tree.add(0, order[1], "t")
    below = dist(prefix + (order[0],)).argsort(descending=True).tolist()
    deep = tree.add(best, below[0], "t")
    tree.add(best, below[1], "t")
    tree.add(deep, int(dist(prefix + (order[0], below[0])).argmax()), "t")
    return tree


def draft_q(prefix: tuple) -> torch.Tensor:
    """A made-up draft model's distribution after `prefix`: unlike p, and with mass on the tokens
    that p gives 0, so both the accept and the residual branch of min(1, p/q) are exercised."""
    g = torch.Generator().manual_seed(hash(prefix) % 2**31)
    return (torch.randn(V, generator=g, dtype=torch.float64) * 1.5).softmax(-1)


def sampled_chain(anchor: int, dist, prefix: tuple, sampler: Sampler) -> DraftTree:
    """Two draft tokens sampled from the draft model's q, recorded in `draft_probs`."""
    tree, node, drafted = DraftTree.root(anchor), 0, prefix
    for _ in range(2):
        q = draft_q(drafted)
        token = sampler.draw(q)
        node = tree.add(node, token, "draft")
        tree.draft_probs[node] = q
        drafted += (token,)
    return tree


def speculative_samples(dist, walk, seed: int, make_tree=None) -> Counter:
    """The first HORIZON tokens of SAMPLES speculative runs (tree steps until HORIZON tokens)."""
    sampler, counts = Sampler(CONFIG, seed=seed), Counter()
    drafter = Sampler(CONFIG, seed=seed + 1)
    make_tree = make_tree or (lambda anchor, dist, prefix, _drafter: branchy_tree(anchor, dist, prefix))
    for _ in range(SAMPLES):
        out: list[int] = []
        while len(out) < HORIZON:
            anchor = (PROMPT + out)[-1]
            tree = make_tree(anchor, dist, tuple(out), drafter)
            path, bonus = walk(tree, lambda n: dist(tuple(out) + tuple(tree.tokens[c] for c in tree.path_to(n))),
                               sampler)
            out += [tree.tokens[c] for c in path] + [bonus]
        counts[tuple(out[:HORIZON])] += 1
    return counts


def tv_bound(cells: int, n: int, delta: float = 1e-6) -> float:
    """E[TV] <= 0.5 sqrt(K / n) (Cauchy-Schwarz), plus McDiarmid's deviation at confidence 1 - delta."""
    return 0.5 * math.sqrt(cells / n) + math.sqrt(math.log(1 / delta) / (2 * n))


def chi_square_p(counts: Counter, exact: dict, n: int) -> float:
    """p-value of Pearson's chi-square test; cells expecting < 5 are pooled into one."""
    stat, pooled_obs, pooled_exp, cells = 0.0, 0, 0.0, 0
    for seq, p in exact.items():
        if p == 0:
            continue
        if n * p < 5:
            pooled_obs, pooled_exp = pooled_obs + counts[seq], pooled_exp + n * p
            continue
        stat, cells = stat + (counts[seq] - n * p) ** 2 / (n * p), cells + 1
    if pooled_exp > 0:
        stat, cells = stat + (pooled_obs - pooled_exp) ** 2 / pooled_exp, cells + 1
    return chi2_sf(stat, cells - 1)


def chi2_sf(stat: float, df: int) -> float:
    """P(chi-square with `df` degrees of freedom > stat)."""
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(stat / 2, dtype=torch.float64)))


def biased_walk(tree, dist, sampler):
    """Negative control: tries the children like `sample_walk` but never removes a rejected token,
    so a later sibling is accepted with its unconditional probability."""
    path, node = [], 0
    while True:
        p = dist(node)
        for child in tree.children(node):
            if sampler.uniform() < float(p[tree.tokens[child]]):
                path.append(child)
                node = child
                break
        else:
            return path, sampler.draw(p)


def test_the_walk_samples_the_targets_exact_joint_distribution(conditional):
    exact = exact_joint(conditional)
    assert abs(sum(exact.values()) - 1) < 1e-9
    assert min(exact.values()) == 0 and max(float(conditional(()).max()), 0) > 0.5  # p = 0 and big children
    counts = speculative_samples(conditional, sample_walk, seed=1)
    assert sum(counts.values()) == SAMPLES
    assert all(exact[seq] > 0 for seq in counts), "an impossible sequence was sampled"
    support = sum(p > 0 for p in exact.values())
    tv = 0.5 * sum(abs(counts[seq] / SAMPLES - p) for seq, p in exact.items())
    assert tv < tv_bound(support, SAMPLES), tv
    assert chi_square_p(counts, exact, SAMPLES) > 1e-3


def test_a_walk_that_skips_the_renormalization_fails_the_same_test(conditional):
    exact = exact_joint(conditional)
    counts = speculative_samples(conditional, biased_walk, seed=1)
    support = sum(p > 0 for p in exact.values())
    tv = 0.5 * sum(abs(counts[seq] / SAMPLES - p) for seq, p in exact.items())
    assert tv > tv_bound(support, SAMPLES), tv
    assert chi_square_p(counts, exact, SAMPLES) < 1e-6


def q_ignoring_walk(tree, dist, sampler):
    """Negative control for sampled drafts: accepts by min(1, p/q) but draws the bonus from p
    instead of max(0, p - q), over-weighting the token that was just rejected."""
    path, node = [], 0
    while True:
        p, children = dist(node), tree.children(node)
        if not children:
            return path, sampler.draw(p)
        child = children[0]
        token = tree.tokens[child]
        if sampler.uniform() * float(tree.draft_probs[child][token]) >= float(p[token]):
            return path, sampler.draw(p)
        path.append(child)
        node = child


def test_drafts_sampled_from_q_are_verified_exactly_by_min_1_p_over_q(conditional):
    exact = exact_joint(conditional)
    counts = speculative_samples(conditional, sample_walk, seed=2, make_tree=sampled_chain)
    assert all(exact[seq] > 0 for seq in counts), "an impossible sequence was sampled"
    support = sum(p > 0 for p in exact.values())
    tv = 0.5 * sum(abs(counts[seq] / SAMPLES - p) for seq, p in exact.items())
    assert tv < tv_bound(support, SAMPLES), tv
    assert chi_square_p(counts, exact, SAMPLES) > 1e-3
    biased = speculative_samples(conditional, q_ignoring_walk, seed=2, make_tree=sampled_chain)
    assert chi_square_p(biased, exact, SAMPLES) < 1e-6


def test_a_sampled_draft_with_siblings_is_refused():
    tree = DraftTree.root(0)
    a = tree.add(0, 1, "draft")
    tree.add(0, 2, "other")
    tree.draft_probs[a] = torch.full((V,), 1 / V, dtype=torch.float64)
    with pytest.raises(ValueError, match="only child"):
        sample_walk(tree, lambda n: torch.full((V,), 1 / V, dtype=torch.float64), Sampler(CONFIG))


def test_warped_probs_match_transformers_warpers():
    from transformers.generation.logits_process import (TemperatureLogitsWarper, TopKLogitsWarper,
                                                        TopPLogitsWarper)

    logits = torch.randn(5, 40, generator=torch.Generator().manual_seed(3))
    config = SamplingConfig(temperature=0.8, top_k=12, top_p=0.7)
    ref = TopPLogitsWarper(0.7)(None, TopKLogitsWarper(12)(None, TemperatureLogitsWarper(0.8)(None, logits.clone())))
    ours = warped_probs(logits, config)
    assert torch.allclose(ours.float(), ref.softmax(-1), atol=1e-6)
    assert torch.equal(ours > 0, ref.softmax(-1) > 0)


def test_bad_settings_are_refused():
    for bad, match in ((dict(temperature=-1), "temperature"), (dict(top_k=-2), "top_k"),
                       (dict(top_p=0), "top_p"), (dict(top_p=1.5), "top_p")):
        with pytest.raises(ValueError, match=match):
            SamplingConfig(**bad)


# --- on the real model ---------------------------------------------------------------------

REAL = SamplingConfig(temperature=0.8, top_p=0.9)
REAL_PROMPT = [{"role": "user", "content": "Repeat after me: red green blue red green blue red green blue"}]


def sample_outputs(smol, method: str, runs: int, max_new: int = 3) -> list[tuple]:
    from oilbird.decode import DecodeConfig, decode
    from oilbird.methods import build_drafter
    from oilbird.prefix_cache import PrefixCache
    from oilbird.verifier import TreeVerifier

    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    drafter, ids = build_drafter(method, {}, target=smol), smol.encode_chat(REAL_PROMPT)
    # Every run has the same prompt: the prefix cache prefills it once (half of each run's time on
    # a 2-core CPU), and reused KV is itself what the bench serves with.
    cache = PrefixCache()
    outs = []
    for i in range(runs):
        config = DecodeConfig(max_new_tokens=max_new, node_budget=16,
                              sampling=SamplingConfig(temperature=REAL.temperature, top_p=REAL.top_p, seed=i))
        outs.append(tuple(decode(verifier, drafter, ids, config, max_context=smol.max_context,
                                 request_id=f"r{i}", prefix_cache=cache).output_ids))
    return outs


def test_a_seed_reproduces_its_tokens_and_greedy_is_unchanged(smol):
    first, again = sample_outputs(smol, "pld", 3, 12), sample_outputs(smol, "pld", 3, 12)
    assert first == again
    assert len(set(first)) > 1  # different seeds sample differently


RUNS = 150


@pytest.fixture(scope="module")
def ar_samples(smol):
    return sample_outputs(smol, "ar", RUNS)


# The draft model samples its chain (min(1, p/q)); with MLA that chain comes from the drafter's own
# rejection-sampling walk over prompt lookup's proposals.
@pytest.mark.parametrize("method", [
    *(pytest.param(m, marks=pytest.mark.heavy(45)) for m in ("pld", "sam", "suffix", "tr", "goose", "oilbird",
                                                             "oilbird-pld", "oilbird-tr", "oilbird-suffix")),
    pytest.param("draft[model=self:8;k=3]", marks=pytest.mark.heavy(115)),
    pytest.param("draft[model=self:8;k=4;mla=true]", marks=pytest.mark.heavy(175))])
def test_each_methods_token_histograms_match_ar_sampling(smol, ar_samples, method):
    ar, ours = ar_samples, sample_outputs(smol, method, RUNS)
    assert len(set(ours)) > 3  # the prompt leaves room to sample: the test can see a bias
    for position in range(3):
        a, b = Counter(o[position] for o in ar if len(o) > position), Counter(o[position] for o in ours if len(o) > position)
        tokens = sorted(set(a) | set(b))
        na, nb = sum(a.values()), sum(b.values())
        stat = sum((a[t] / na - b[t] / nb) ** 2 / ((a[t] + b[t]) / (na + nb)) for t in tokens) * na * nb / (na + nb)
        p = chi2_sf(stat, max(len(tokens) - 1, 1))
        assert p > 1e-4, f"{method} position {position}: histograms differ (p = {p:.2g})"
