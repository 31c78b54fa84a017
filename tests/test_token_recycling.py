"""Token Recycling: the template, the adjacency table, drafting, tenants; and one end-to-end run."""

import pytest
import torch

import oilbird.drafters.token_recycling  # noqa: F401  (import registers "tr")
from oilbird.drafters import make_drafter
from oilbird.drafters.token_recycling import (AdjacencyTable, TokenRecyclingConfig,
                                              draft_from_table, template_paths, template_plan)
from oilbird.tree import DraftTree
from oilbird.verifier import Verification

PLAN = template_plan(template_paths("2.2.2"))


def fake_verification(tree: DraftTree, topk: list[list[int]], committed: list[int]) -> Verification:
    """A Verification as the verifier would build it, from hand-written top-k rows."""
    ids = torch.tensor(topk, dtype=torch.long)  # [N, k]
    return Verification(tree=tree, prefix_len=10, argmax=ids[:, 0], topk_ids=ids,
                        topk_logits=torch.zeros(ids.shape), path=[],
                        committed=committed, finished=False)


def full_table(k: int = 8) -> AdjacencyTable:
    """Row t = [10t, 10t+1, ...] for every token reachable from root 1: digits spell the rank-path."""
    table = AdjacencyTable(k)
    for path in [()] + template_paths("2.2.2"):  # the tokens a draft from root 1 can reach
        t = 1
        for r in path:
            t = 10 * t + r
        table.rows[t] = [10 * t + r for r in range(k)]
    return table


# --- template -------------------------------------------------------------------------------

def test_template_2_2_2_shape():
    paths = template_paths("2.2.2")
    assert len(paths) == 80 and len(set(paths)) == 80
    per_depth = [sum(len(p) == d for p in paths) for d in range(1, 7)]
    assert per_depth == [8, 21, 25, 15, 8, 3]
    assert [len(p) for p in paths] == sorted(len(p) for p in paths)  # breadth-first
    seen = {()}
    for path in paths:
        assert path[:-1] in seen  # parent listed (earlier)
        assert all(0 <= r < 8 for r in path)
        seen.add(path)
    assert paths[:8] == [(r,) for r in range(8)]
    assert paths[-3:] == [(0, 0, 0, 0, 0, 0), (0, 0, 0, 0, 0, 1), (0, 0, 0, 1, 0, 0)]


def test_unknown_template_is_refused_with_known_names():
    with pytest.raises(ValueError, match=r"known templates: 2\.2\.2"):
        TokenRecyclingConfig(template="3.3")
    with pytest.raises(ValueError, match="2.2.2"):
        template_paths("nope")
    with pytest.raises(ValueError):
        TokenRecyclingConfig(top_k=0)


# --- adjacency table ------------------------------------------------------------------------

def test_update_overwrites_rows_and_last_duplicate_wins():
    table = AdjacencyTable(k=2)
    table.update([5, 6], [[1, 2], [3, 4]])
    table.update([5, 7, 5], torch.tensor([[11, 12, 13], [21, 22, 23], [31, 32, 33]]))
    assert table.row(5) == [31, 32]  # overwritten, last of the two 5s, cut to k
    assert table.row(6) == [3, 4]    # untouched rows persist
    assert table.row(7) == [21, 22]
    assert not table.observed(0) and table.row(0) is None
    assert len(table) == 3
    with pytest.raises(ValueError):
        table.update([1, 2], [[1]])


# --- drafting -------------------------------------------------------------------------------

def test_drafting_fills_every_template_slot_from_its_parents_row():
    tree = draft_from_table(1, full_table(), PLAN, budget=81)
    assert len(tree) == 81  # all rows observed and siblings distinct: nothing merged or skipped
    paths = template_paths("2.2.2")
    for i, path in enumerate(paths):
        node = i + 1  # no skips, so slots and tree nodes coincide
        parent_token = tree.tokens[tree.parents[node]]
        assert tree.tokens[node] == 10 * parent_token + path[-1]
        assert tree.depths[node] == len(path)
        assert tree.sources[node] == {"tr"}
        expected = 1.0
        for r in path:
            expected /= 1 + r
        assert tree.scores[node] == pytest.approx(expected)


def test_unobserved_rows_are_skipped_with_their_subtrees():
    table = AdjacencyTable(8)
    table.update([1, 10], [list(range(10, 18)), list(range(20, 28))])  # rows of 1 and 10 only
    tree = draft_from_table(1, table, PLAN, budget=81)
    # Depth 1: row(1) gives 10..17. Depth 2: only 10 (rank 0) has a row, with 8 children
    # 20..27 in the template. Nothing at depth 3: no token 20..27 is observed.
    assert tree.tokens[1:9] == list(range(10, 18))
    assert tree.tokens[9:] == list(range(20, 28))
    assert all(tree.parents[n] == 1 for n in range(9, 17))
    assert 0 not in tree.tokens


def test_empty_table_drafts_the_root_only():
    tree = draft_from_table(3, AdjacencyTable(8), PLAN, budget=81)
    assert tree.tokens == [3]


@pytest.mark.parametrize("budget", [1, 2, 9, 30, 64, 81, 200])
def test_budget_is_respected_and_keeps_shallow_nodes(budget):
    tree = draft_from_table(1, full_table(), PLAN, budget)
    assert len(tree) == min(budget, 81)
    if budget == 1:
        assert tree.tokens == [1]
    assert tree.depths == sorted(tree.depths)  # a prefix of the breadth-first template


def test_short_rows_skip_ranks_beyond_their_width():
    tree = draft_from_table(1, full_table(k=2), PLAN, budget=81)
    assert all(tree.tokens[n] % 10 < 2 for n in range(1, len(tree)))
    assert len(tree) == 1 + sum(all(r < 2 for r in p) for p in template_paths("2.2.2"))


# --- the drafter ----------------------------------------------------------------------------

def test_drafter_learns_from_observe_and_persists_across_requests_of_a_tenant():
    drafter = make_drafter("tr")
    drafter.start_request("r0", [4, 5, 1], tenant="a")
    assert drafter.propose("r0", 81).tokens == [1]  # prefill not harvested: nothing to draft from
    verified = DraftTree.root(1)
    verified.add(0, 2, "tr")
    topk = [list(range(2, 12)), [7] + list(range(20, 29))]  # [N=2, 10] as the verifier gives
    drafter.observe("r0", fake_verification(verified, topk, [2, 7]))
    assert drafter.state("r0").sequence == [4, 5, 1, 2, 7]
    assert drafter.state("r0").table.row(1) == list(range(2, 10))  # cut to k = 8
    assert drafter.state("r0").table.row(2) == [7] + list(range(20, 27))
    drafter.stop_request("r0")

    drafter.start_request("r1", [9, 1], tenant="a")  # same tenant: the table carried over
    tree = drafter.propose("r1", 81)
    # Depth 1 from row(1); depth 2 only under 2 (rank 0, 8 template children); nothing deeper.
    assert tree.tokens == [1] + list(range(2, 10)) + [7] + list(range(20, 27))
    assert tree.parents == [-1] + [0] * 8 + [1] * 8


def test_tenants_are_isolated():
    drafter = make_drafter("tr")
    drafter.start_request("a0", [1], tenant="a")
    drafter.observe("a0", fake_verification(DraftTree.root(1), [[2] * 10], [2]))
    drafter.stop_request("a0")
    drafter.start_request("b0", [1], tenant="b")
    assert drafter.propose("b0", 81).tokens == [1]  # tenant a's row for 1 never reaches tenant b
    drafter.observe("b0", fake_verification(DraftTree.root(1), [[5] * 10], [5]))
    drafter.stop_request("b0")
    drafter.start_request("a1", [1], tenant="a")
    assert drafter.propose("a1", 81).tokens[:2] == [1, 2]  # and b's row did not overwrite a's
    assert set(drafter.tables.tenants()) >= {"a", "b"}


def test_drop_tenant_forgets_only_that_tenants_table():
    drafter = make_drafter("tr")
    for tenant, token in (("a", 2), ("b", 5)):
        drafter.start_request(tenant, [1], tenant=tenant)
        drafter.observe(tenant, fake_verification(DraftTree.root(1), [[token] * 10], [token]))
        drafter.stop_request(tenant)
    both = drafter.memory_bytes()
    drafter.drop_tenant("a")
    assert drafter.tables.tenants() == ["b"] and 0 < drafter.memory_bytes() < both
    drafter.start_request("a1", [1], tenant="a")
    assert drafter.propose("a1", 81).tokens == [1]  # a starts empty
    drafter.start_request("b1", [1], tenant="b")
    assert drafter.propose("b1", 81).tokens[:2] == [1, 5]  # b kept its table


# --- the row cap ------------------------------------------------------------------------------

def test_a_full_table_evicts_the_least_recently_written_row():
    table = AdjacencyTable(k=2, max_rows=3)
    table.update([1, 2, 3], [[10, 11], [20, 21], [30, 31]])
    table.update([1], [[12, 13]])  # overwriting 1 makes it the newest row
    assert list(table.rows) == [2, 3, 1]
    table.row(2)  # reading does not refresh
    table.update([4], [[40, 41]])
    assert list(table.rows) == [3, 1, 4] and not table.observed(2)  # 2 went, not 1
    assert table.row(1) == [12, 13] and table.evicted_rows == 1
    table.update([5, 6, 5], [[50, 51], [60, 61], [52, 53]])  # one forward past the cap
    assert list(table.rows) == [4, 6, 5] and table.row(5) == [52, 53]
    assert table.evicted_rows == 3


def test_the_cap_bounds_a_long_run_and_its_memory():
    drafter = make_drafter("tr", TokenRecyclingConfig(max_rows=40))
    for r in range(10):  # 10 requests x 8 forwards x 2 fresh input tokens: 160 rows written
        drafter.start_request(f"r{r}", [1000 * r], tenant="t")
        for i in range(8):
            anchor = drafter.state(f"r{r}").anchor
            tree = DraftTree.root(anchor)
            tree.add(0, anchor + 1, "tr")
            drafter.observe(f"r{r}", fake_verification(tree, [[anchor + 2] * 10, [anchor + 2] * 10],
                                              [anchor + 2]))
        drafter.stop_request(f"r{r}")
    table = drafter.tables.get("t")
    assert len(table) == 40 and table.evicted_rows == 160 - 40
    assert min(table.rows) == 7008  # the newest 40 rows: all 16 of r9 and r8, the last 8 of r7
    assert drafter.memory_bytes() == table.memory_bytes() == 40 * (100 + 32 + 56 + 40 * 8)


def test_max_rows_must_be_positive():
    with pytest.raises(ValueError, match="max_rows"):
        TokenRecyclingConfig(max_rows=0)
    with pytest.raises(ValueError, match="max_rows"):
        AdjacencyTable(8, max_rows=0)


# --- end to end on the real model (loads SmolLM2; slow) --------------------------------------

@pytest.mark.heavy(40)
def test_tr_output_equals_greedy_on_api_bank(serve_api_bank):
    # One instance (one table) across requests, as the benchmark serves them.
    _, tau = serve_api_bank(make_drafter("tr"), node_budget=81)
    assert tau > 1.0  # recycled top-k predictions must get accepted


# --- requests without top-k (an external engine) ----------------------------------------------

def test_without_topk_the_known_argmax_becomes_a_one_id_row():
    """vLLM may give no top-k: the argmax is known up to the committed tokens and -1 past them."""
    drafter = make_drafter("tr")
    drafter.start_request("r", [4, 1], tenant="a")
    verified = DraftTree.chain(1, [2, 3], "tr")  # 1 -> 2 -> 3: 2 accepted, 3 rejected
    drafter.observe("r", Verification(tree=verified, prefix_len=1, argmax=torch.tensor([2, 9, -1]),
                                      topk_ids=None, topk_logits=None, path=[1], committed=[2, 9],
                                      finished=False))
    table = drafter.state("r").table
    assert table.row(1) == [2] and table.row(2) == [9] and not table.observed(3)
    assert drafter.state("r").sequence == [4, 1, 2, 9]
    drafter.start_request("s", [1], tenant="a")
    tree = drafter.propose("s", 81)
    assert tree.tokens == [1, 2, 9] and tree.parents == [-1, 0, 1]  # rank-0 children only: a chain


def test_concurrent_requests_keep_their_own_sequences():
    drafter = make_drafter("tr")
    drafter.start_request("x", [1], tenant="a")
    drafter.start_request("y", [3], tenant="a")
    drafter.observe("x", fake_verification(DraftTree.root(1), [[2] * 10], [2]))
    drafter.observe("y", fake_verification(DraftTree.root(3), [[1] * 10], [1]))
    assert drafter.state("x").sequence == [1, 2] and drafter.state("y").sequence == [3, 1]
    assert drafter.propose("y", 81).tokens[:2] == [1, 2]  # one tenant: x's row for 1 serves y
    assert drafter.stop_request("x").sequence == [1, 2] and drafter.stop_request("x") is None
    assert list(drafter.requests) == ["y"]
