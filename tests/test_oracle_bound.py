"""scripts/oracle_bound.py and the replay it shares with scripts/lexical_oracle.py: the pool oracle's
drafts, our engine's step counting, the fitted cost per node and the priced rows."""

import random
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"
sys.path.insert(0, str(SCRIPTS))

import lexical_oracle  # noqa: E402
import oracle_bound  # noqa: E402


def _occurs(tokens: list[int], gram: list[int]) -> bool:
    n = len(gram)
    return any(tokens[i:i + n] == gram for i in range(len(tokens) - n + 1))


def test_the_oracle_drafts_the_longest_truth_the_pool_holds_after_the_last_token():
    rng = random.Random(7)
    for _ in range(200):
        corpus = [rng.choice([1, 2, 3, -1]) for _ in range(rng.randint(2, 40))]
        index = lexical_oracle.NgramIndex()
        index.extend(corpus)
        text = corpus[-rng.randint(1, len(corpus)):]
        if text[-1] == -1:
            continue
        truth = [rng.choice([1, 2, 3]) for _ in range(rng.randint(1, 8))]
        k = rng.randint(1, 8)
        got = lexical_oracle.oracle_draft(index, text, len(corpus), truth, k)
        # By definition: the longest j <= k with [last] + truth[:j] somewhere in the corpus.
        want = max(j for j in range(min(k, len(truth)) + 1) if j == 0 or _occurs(corpus, [text[-1]] + truth[:j]))
        assert got == truth[:want]


def test_our_engine_counts_a_step_for_every_output_token():
    prompt, out = [5, 6, 7], [8, 9, 10, 11]
    # The second request repeats the first: the oracle copies its whole output in one step.
    ours = lexical_oracle.replay("oracle", [prompt, prompt], [out, out], k=8, prefill_commits=False)
    assert ours["accepted"] == len(out)  # the second output drafted whole, accepted in one forward
    assert ours["steps"] == 4 + 1  # the first request token by token (nothing to copy), then one step
    assert ours["tau"] == pytest.approx(8 / 5)
    vllm = lexical_oracle.replay("oracle", [prompt, prompt], [out, out], k=8)
    assert vllm["steps"] == 3 + 1 and vllm["tau"] == pytest.approx(8 / (4 + 2))  # prefills commit one each


def _record(method, nodes, seconds, other=0.0, tokens=None):
    return dict(method=method, request_id="r", nodes_per_forward=nodes, forward_s_per_forward=seconds,
                forward_s=sum(seconds), forwards=len(nodes), propose_s=other, observe_s=0.0, bookkeeping_s=0.0,
                prefill_s=1.0, output_ids=[0] * (tokens or len(nodes)))


def test_the_cost_per_node_is_fitted_over_every_forward_and_rows_priced_by_it():
    a, b = 0.02, 0.003
    records = [_record("ar", [1, 1, 1], [a + b] * 3),
               _record("suffix", [4, 6], [a + 4 * b, a + 6 * b], other=0.01, tokens=3)]
    fit_a, fit_b = oracle_bound.fit_cost(records)
    assert fit_a == pytest.approx(a) and fit_b == pytest.approx(b)
    rows = oracle_bound.method_rows(records, fit_a, fit_b)
    assert rows["suffix"]["priced"] == pytest.approx(2 * a + 10 * b + 0.01)
    assert rows["suffix"]["nodes"] == 10 and rows["ar"]["tokens"] == 3
    replays = [dict(choice="oracle", steps=1, draft_tokens=2, accepted=2, tau=3.0)]
    text = oracle_bound.table(rows, replays, fit_a, fit_b, "suffix")
    # The oracle: prefill 1 s (ar's) + one forward of 3 nodes; ar: 1 s + 3 one-node forwards.
    oracle_line = next(line for line in text.splitlines() if line.startswith("| oracle"))
    assert f"{(1 + 3 * (a + b)) / (1 + a + 3 * b):.2f}x" in oracle_line


def test_a_run_of_one_forward_size_has_no_slope_to_fit():
    with pytest.raises(ValueError, match="one size"):
        oracle_bound.fit_cost([_record("ar", [1, 1], [0.02, 0.021])])
