"""GOOSE on hand-built token lists: confidence, consensus, extension, successor tiers, tree shape, caps."""

import pytest
import torch

from oilbird.drafters import make_drafter
from oilbird.drafters.goose import (ContextMatcher, GooseConfig, SuccessorTable, build_goose_tree,
                                    chain_confidence, propose_spine)
from oilbird.drafters.goose_table import _row_bytes
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification


def test_confidence_rule():
    assert chain_confidence([], False) == 0.0
    assert chain_confidence([1], True) == 1.0
    assert chain_confidence([1] * 4, False) == 0.6 * 4 / 8
    assert abs(chain_confidence([1] * 14, False) - 0.8) < 1e-9
    assert chain_confidence([1] * 40, False) == 0.9


def test_matcher_earliest_occurrence_and_consensus():
    m = ContextMatcher((3,), consensus_min=2)
    m.extend([1, 2, 3, 7, 0, 1, 2, 3, 7, 5, 1, 2, 3])
    chain, consensus = m.match([1, 2, 3], 4)
    assert chain == [7, 0, 1, 2] and consensus  # two occurrences, both followed by 7
    m.extend([8, 1, 2, 3])
    assert m.match([1, 2, 3], 2) == ([7, 0], False)  # a third occurrence disagrees


def test_confident_chain_is_extended_by_rematching():
    cfg = GooseConfig(ngram_sizes="3", max_chain=4, extended_chain=100, long_match=4)
    m = ContextMatcher((3,))
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3]
    m.extend(text)
    chain, c = propose_spine(m, text, cfg)
    assert c > 0.6
    assert chain[:4] == [4, 5, 6, 7] and len(chain) > 4  # extended past max_chain
    assert chain[4:6] == [8, 9]


def test_bigram_tier_wins_over_unigram():
    table = SuccessorTable()
    logits = torch.tensor([[3.0, 1.0], [5.0, 0.0]])
    table.harvest([10, 10], [None, 4], torch.tensor([[11, 12], [13, 14]]), logits, k=2)
    assert [t for t, _ in table.successors(4, 10, use_bigram=True)] == [13, 14]
    assert [t for t, _ in table.successors(9, 10, use_bigram=True)] == [13, 14]  # unigram: last wins
    scores = [s for _, s in table.successors(4, 10, True)]
    assert abs(sum(scores) - 1.0) < 1e-6 and scores[0] > scores[1]  # softmax within top-k


def filled_table(vocab=range(1, 40)):
    table = SuccessorTable()
    for token in vocab:  # each token's successors: token+1 (likely), token+2, token+3
        table.unigram[token] = ([token + 1, token + 2, token + 3], [0.6, 0.3, 0.1])
    return table


def test_tree_respects_budget_depth_and_tags_shared_nodes():
    cfg = GooseConfig()
    chain = [2, 3, 4, 5]
    tree, spine = build_goose_tree(1, None, chain, c=0.5, ema=0.5, table=filled_table(), cfg=cfg,
                                   budget=30)
    assert len(tree) <= 30
    assert [tree.tokens[n] for n in spine] == chain[: len(spine)] and spine
    # Root's best successor is 2 == the first spine token: it tags the spine node, costs nothing.
    assert tree.sources[spine[0]] == {"pld", "tr"}
    assert max(tree.depths) <= max(len(spine), cfg.max_branch_depth)
    branch_nodes = [n for n in range(1, len(tree)) if n not in spine]
    assert branch_nodes and all(tree.sources[n] == {"tr"} for n in branch_nodes)


def test_spine_probabilities_scale_the_spine_scores_and_nothing_else():
    cfg = GooseConfig()
    chain = [2, 3, 4]
    plain, spine = build_goose_tree(1, None, chain, 0.5, 0.5, SuccessorTable(), cfg, budget=10)
    scored, same = build_goose_tree(1, None, chain, 0.5, 0.5, SuccessorTable(), cfg, budget=10,
                                    spine_probs=[0.8, 0.4, 0.2])
    assert spine == same and scored.tokens == plain.tokens and scored.parents == plain.parents
    assert [plain.scores[n] for n in spine] == [0.5] * 3
    assert [scored.scores[n] for n in spine] == pytest.approx([0.4, 0.2, 0.1])


def test_pool_spine_with_count_scores_scores_by_the_pools_counts():
    drafter = make_drafter("goose", GooseConfig(spine="pool", spine_count_scores=True, harvest_prefill=False))
    for rid, output in (("r1", [4, 5, 6]), ("r2", [4, 7, 8])):
        drafter.start_request(rid, [1, 2, 3], "t")
        drafter.observe(rid, Verification(
            tree=DraftTree.root(3), prefix_len=3, argmax=torch.zeros(1, dtype=torch.long),
            topk_ids=torch.zeros(1, 1, dtype=torch.long), topk_logits=torch.zeros(1, 1),
            path=[], committed=output, finished=False))
        drafter.stop_request(rid)
    drafter.start_request("r3", [9, 3, 4], "t")
    tree = drafter.propose("r3", budget=10)
    spine = drafter.state("r3").spine_nodes
    c = chain_confidence([0] * 2, False)  # a match of two tokens, "3 4", followed by 5 and by 7
    assert [tree.tokens[n] for n in spine] == [5, 6]
    assert [tree.scores[n] for n in spine] == pytest.approx([c / 2, c / 2])


def test_no_spine_gives_a_pure_table_tree_and_empty_table_gives_ar():
    cfg = GooseConfig()
    tree, spine = build_goose_tree(1, None, [], 0.0, 0.5, filled_table(), cfg, budget=20)
    assert not spine and 1 < len(tree) <= 20
    tree, _ = build_goose_tree(1, None, [], 0.0, 0.5, SuccessorTable(), cfg, budget=20)
    assert len(tree) == 1


def test_successor_tables_are_per_tenant():
    drafter = make_drafter("goose")
    drafter.start_request("a", [1, 2], "A")
    drafter.state("a").table.unigram[2] = ([50, 51], [0.9, 0.1])
    drafter.start_request("b", [1, 2], "B")
    assert not {50, 51} & set(drafter.propose("b", budget=20).tokens)
    drafter.start_request("a2", [1, 2], "A")
    assert 50 in drafter.propose("a2", budget=20).tokens  # same tenant: the table persisted


# --- the row cap and the tenants (hand-built harvests) ---------------------------------------

def harvest(table, tokens, prevs, first_id=100):
    """Harvest one made-up top-2 row per position: ids first_id + position, first_id + position + 1."""
    n = len(tokens)
    ids = torch.tensor([[first_id + i, first_id + i + 1] for i in range(n)])
    table.harvest(tokens, prevs, ids, torch.tensor([[1.0, 0.0]] * n), k=2)


def test_each_tier_evicts_its_least_recently_written_row_first():
    table = SuccessorTable(max_rows=3, top_k=2)
    harvest(table, [1, 2, 3], [None, 1, 2])  # unigram 1, 2, 3; bigram (1, 2), (2, 3)
    harvest(table, [1], [3], first_id=200)   # overwrites unigram 1: now the newest row
    assert list(table.unigram) == [2, 3, 1] and list(table.bigram) == [(1, 2), (2, 3), (3, 1)]
    harvest(table, [4], [1], first_id=300)   # both tiers full: each evicts its oldest row
    assert list(table.unigram) == [3, 1, 4]  # 2 went, not the older-but-rewritten 1
    assert list(table.bigram) == [(2, 3), (3, 1), (1, 4)]
    assert table.evicted_rows == 2
    assert [t for t, _ in table.successors(None, 1, True)] == [200, 201]  # the rewritten row
    assert table.successors(None, 2, True) == []  # an evicted row proposes nothing
    table.successors(3, 1, True)  # reading a row does not refresh it
    harvest(table, [5], [None], first_id=400)
    assert list(table.unigram) == [1, 4, 5]


def test_a_long_run_stays_within_the_cap_and_its_memory_bound():
    drafter = make_drafter("goose", GooseConfig(max_rows=50, top_k=2))
    for r in range(20):  # 20 prompts of 12 fresh tokens: 220 unigram, 200 bigram rows offered
        prompt = [1000 * r + i for i in range(12)]
        drafter.start_request(f"r{r}", prompt, "t")
        p = len(prompt) - 1
        ids = torch.tensor([[t + 1, t + 2] for t in prompt[:-1]])
        drafter.observe_prefill(f"r{r}", PrefillObservation(prompt[:-1], ids, torch.tensor([[1.0, 0.0]] * p)))
        drafter.stop_request(f"r{r}")
    table = drafter.tables.get("t")
    assert len(table.unigram) == 50 and len(table.bigram) == 50  # filled, never passed
    assert table.evicted_rows == (220 - 50) + (200 - 50)
    assert min(table.unigram) == 15005  # the last 50 written keys survive: 4 x 11, then 6 of r15
    assert drafter.memory_bytes() == table.memory_bytes() <= 2 * 50 * _row_bytes(2)


def test_max_rows_must_be_positive():
    with pytest.raises(ValueError, match="max_rows"):
        GooseConfig(max_rows=0)
    with pytest.raises(ValueError, match="max_rows"):
        SuccessorTable(max_rows=0)


def test_drop_tenant_forgets_only_that_tenants_table():
    drafter = make_drafter("goose")
    for tenant, token in (("A", 50), ("B", 60)):
        drafter.start_request(tenant, [1, 2], tenant)
        harvest(drafter.state(tenant).table, [2], [1], first_id=token)
        drafter.stop_request(tenant)
    both = drafter.memory_bytes()
    drafter.drop_tenant("A")
    assert drafter.tables.tenants() == ["B"] and 0 < drafter.memory_bytes() < both
    drafter.start_request("a2", [1, 2], "A")
    assert not {50, 51} & set(drafter.propose("a2", budget=20).tokens)  # A starts empty
    drafter.start_request("b2", [1, 2], "B")
    assert 60 in drafter.propose("b2", budget=20).tokens  # B kept its table


@pytest.mark.heavy(35)
def test_goose_output_equals_greedy_on_api_bank(serve_api_bank):
    """End to end on the real model: one drafter across 5 API-Bank requests, each output greedy."""
    results, tau = serve_api_bank(make_drafter("goose"), node_budget=64)
    assert all(set(r.accepted_sources) <= {"pld", "tr"} for r in results)
    assert tau > 1.2


def test_prefill_harvest_can_be_turned_off(smol):
    from oilbird.decode import DecodeConfig, decode
    from oilbird.drafters.goose import GooseConfig
    from oilbird.verifier import TreeVerifier

    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    prompt = smol.encode_chat([{"role": "user", "content": "Say hello."}])
    tables = {}
    for harvest in (True, False):
        drafter = make_drafter("goose", GooseConfig(harvest_prefill=harvest))
        assert drafter.needs_prefill is harvest
        decode(verifier, drafter, prompt, DecodeConfig(max_new_tokens=1), max_context=smol.max_context)
        tables[harvest] = len(drafter.tables.get("default").unigram)
    # One forward harvests at most its one-node tree; the prefill adds every prompt position.
    assert tables[False] <= 1 < len(prompt) // 2 <= tables[True]


# --- requests without top-k, and concurrent requests ----------------------------------------

def test_without_topk_a_forward_harvests_its_known_argmax_as_top1_rows():
    """vLLM may give no top-k: the argmax is known up to the committed tokens and -1 past them."""
    drafter = make_drafter("goose")
    drafter.start_request("r", [7, 1], "A")
    drafter.observe_prefill("r", PrefillObservation([7], None, None))  # no top-k: nothing harvested
    assert len(drafter.state("r").table) == 0
    tree = DraftTree.chain(1, [2, 3], "tr")  # 1 -> 2 -> 3: 2 accepted, 3 rejected
    drafter.observe("r", Verification(tree=tree, prefix_len=1, argmax=torch.tensor([2, 9, -1]),
                                      topk_ids=None, topk_logits=None, path=[1], committed=[2, 9],
                                      finished=False))
    table = drafter.state("r").table
    assert table.successors(None, 1, True) == [(2, 1.0)]
    assert table.successors(1, 2, True) == [(9, 1.0)]
    assert table.successors(2, 3, True) == []  # the rejected node's argmax is unknown: no row
    assert drafter.state("r").sequence == [7, 1, 2, 9]
    drafter.start_request("s", [5, 1], "A")
    assert drafter.propose("s", budget=20).tokens == [1, 2, 9]


def test_a_partial_prefill_harvests_its_rows_at_the_last_positions():
    drafter = make_drafter("goose")
    drafter.start_request("r", [7, 8, 1, 5], "A")
    # One row, as an external engine gives: the state at the last prefilled token (1).
    drafter.observe_prefill("r", PrefillObservation([7, 8, 1], torch.tensor([[5, 6]]),
                                                    torch.tensor([[1.0, 0.0]])))
    table = drafter.state("r").table
    assert [t for t, _ in table.successors(8, 1, True)] == [5, 6]
    assert table.successors(None, 7, True) == [] and len(table) == 2


def _serve_steps(drafter, request_id, steps):
    """One scripted cycle per call: propose, then a made-up verification accepting the first node."""
    for _ in range(steps):
        tree = drafter.propose(request_id, budget=30)
        topk = torch.tensor([[t % 7 + 1, (t + 3) % 7 + 1] for t in tree.tokens])
        path = [1] if len(tree) > 1 else []
        committed = [tree.tokens[n] for n in path] + [(tree.tokens[path[-1] if path else 0] % 7) + 1]
        drafter.observe(request_id, Verification(
            tree=tree, prefix_len=0, argmax=topk[:, 0], topk_ids=topk,
            topk_logits=torch.tensor([[1.0, 0.0]] * len(tree)), path=path, committed=committed,
            finished=False))
        yield tree


def test_interleaved_requests_propose_what_they_would_alone():
    prompts = {"a": ([1, 2, 3, 4, 5, 6, 7, 1, 2, 3], "A"), "b": ([3, 1, 4, 1, 5, 2, 6], "B")}
    alone, together = make_drafter("goose"), make_drafter("goose")
    expected = {}
    for rid, (prompt, tenant) in prompts.items():
        alone.start_request(rid, prompt, tenant)
        expected[rid] = [(t.tokens, t.parents, t.sources, t.scores) for t in _serve_steps(alone, rid, 6)]
        alone.stop_request(rid)
    runs = {}
    for rid, (prompt, tenant) in prompts.items():
        together.start_request(rid, prompt, tenant)
        runs[rid] = _serve_steps(together, rid, 6)
    got = {rid: [] for rid in prompts}
    for _ in range(6):
        for rid, run in runs.items():
            tree = next(run)
            got[rid].append((tree.tokens, tree.parents, tree.sources, tree.scores))
    assert got == expected
    assert any(len(tokens) > 1 for tokens, *_ in expected["a"])  # the trees are not trivial


def test_pool_spine_drafts_from_the_tenants_past_requests():
    earlier, prompt = [1, 2, 3, 4, 5, 6, 7, 8], [9, 9, 2, 3]
    spines = {}
    for spine in ("context", "pool"):
        goose = make_drafter("goose", GooseConfig(spine=spine, harvest_prefill=False))
        goose.start_request("old", earlier, "t")
        goose.stop_request("old")  # joins the tenant's pool
        goose.start_request("new", prompt, "t")
        tree = goose.propose("new", 20)
        spines[spine] = [tree.tokens[n] for n in goose.state("new").spine_nodes]
        goose.start_request("other", prompt, "u")  # another tenant sees none of it
        assert goose.propose("other", 20).tokens == [3]
    assert spines["context"] == []  # the request's own text has no earlier "2 3"
    assert spines["pool"] == [4, 5, 6, 7, 8]  # what followed "2 3" in the earlier request


def test_pool_spine_drafts_from_requests_in_flight_unless_told_not_to():
    spines = {}
    for live in (False, True):
        goose = make_drafter("goose", GooseConfig(spine="pool", spine_live=live, harvest_prefill=False))
        goose.start_request("running", [1, 2, 3, 4, 5, 6, 7, 8], "t")  # has not ended
        goose.start_request("new", [9, 9, 2, 3], "t")
        tree = goose.propose("new", 20)
        spines[live] = [tree.tokens[n] for n in goose.state("new").spine_nodes]
    assert spines == {False: [], True: [4, 5, 6, 7, 8]}


def test_pool_spine_one_request_at_a_time_is_the_same_live_or_not():
    requests = [([1, 2, 3, 4, 5, 1, 2], [3, 4, 6]), ([7, 1, 2, 3], [4, 5, 1]), ([2, 3, 4], [5, 1, 2])]
    trees = {}
    for live in (False, True):
        goose = make_drafter("goose", GooseConfig(spine="pool", spine_live=live, harvest_prefill=False))
        trees[live] = []
        for n, (prompt, output) in enumerate(requests):
            goose.start_request(f"r{n}", prompt, "t")
            for token in output:
                tree = goose.propose(f"r{n}", 12)
                trees[live].append((tree.tokens, tree.parents, tree.sources, tree.scores))
                topk = torch.tensor([[token, 9]] * len(tree))  # the target's top-2 at every node
                goose.observe(f"r{n}", Verification(
                    tree=tree, prefix_len=0, argmax=topk[:, 0], topk_ids=topk,
                    topk_logits=torch.tensor([[1.0, 0.0]] * len(tree)), path=[], committed=[token],
                    finished=False))
            goose.stop_request(f"r{n}")
    assert trees[True] == trees[False]
    assert any(len(tokens) > 1 for tokens, *_ in trees[True])  # the pool drafted something


def test_pool_spine_rejects_unknown_spines():
    with pytest.raises(ValueError, match="spine"):
        GooseConfig(spine="trie")


def test_pool_spine_copies_the_latest_occurrence_when_asked():
    spines = {}
    for occurrence in ("first", "recent"):
        goose = make_drafter("goose", GooseConfig(spine="pool", spine_occurrence=occurrence,
                                                  harvest_prefill=False))
        for rid, earlier in (("old", [1, 2, 3, 4, 5, 6]), ("older", [1, 2, 3, 7, 8, 9])):
            goose.start_request(rid, earlier, "t")
            goose.stop_request(rid)
        goose.start_request("new", [9, 2, 3], "t")
        tree = goose.propose("new", 20)
        spines[occurrence] = [tree.tokens[n] for n in goose.state("new").spine_nodes]
    assert spines["first"][:3] == [4, 5, 6] and spines["recent"][:3] == [7, 8, 9]
    with pytest.raises(ValueError, match="occurrence"):
        make_drafter("goose", GooseConfig(spine="pool", spine_occurrence="middle"))
