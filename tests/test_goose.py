"""GOOSE on hand-built token lists: confidence, consensus, extension, adjacency tiers, tree shape."""

import torch

from oilbird.drafters import make_drafter
from oilbird.drafters.goose import (AdjacencyTable, ContextMatcher, GooseConfig, build_goose_tree,
                                    chain_confidence, propose_spine)


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


def test_adjacency_bigram_tier_wins_over_unigram():
    table = AdjacencyTable()
    logits = torch.tensor([[3.0, 1.0], [5.0, 0.0]])
    table.harvest([10, 10], [None, 4], torch.tensor([[11, 12], [13, 14]]), logits, k=2)
    assert [t for t, _ in table.successors(4, 10, use_bigram=True)] == [13, 14]
    assert [t for t, _ in table.successors(9, 10, use_bigram=True)] == [13, 14]  # unigram: last wins
    scores = [s for _, s in table.successors(4, 10, True)]
    assert abs(sum(scores) - 1.0) < 1e-6 and scores[0] > scores[1]  # softmax within top-k


def filled_table(vocab=range(1, 40)):
    table = AdjacencyTable()
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


def test_no_spine_gives_a_pure_adjacency_tree_and_empty_table_gives_ar():
    cfg = GooseConfig()
    tree, spine = build_goose_tree(1, None, [], 0.0, 0.5, filled_table(), cfg, budget=20)
    assert not spine and 1 < len(tree) <= 20
    tree, _ = build_goose_tree(1, None, [], 0.0, 0.5, AdjacencyTable(), cfg, budget=20)
    assert len(tree) == 1


def test_adjacency_tables_are_per_tenant():
    drafter = make_drafter("goose")
    drafter.start_request("a", [1, 2], "A")
    drafter.table.unigram[2] = ([50, 51], [0.9, 0.1])
    drafter.start_request("b", [1, 2], "B")
    assert not {50, 51} & set(drafter.propose(budget=20).tokens)
    drafter.start_request("a2", [1, 2], "A")
    assert 50 in drafter.propose(budget=20).tokens  # same tenant: the table persisted


def test_goose_output_equals_greedy_on_api_bank(serve_api_bank):
    """End to end on the real model: one drafter across 5 API-Bank requests, each output greedy."""
    results, tau = serve_api_bank(make_drafter("goose"), node_budget=64)
    assert all(set(r.accepted_sources) <= {"pld", "tr"} for r in results)
    assert tau > 1.2


def test_prefill_harvest_can_be_turned_off(smol):
    from oilbird.decode import DecodeConfig, decode
    from oilbird.drafters.goose import GooseConfig
    from oilbird.verifier import TreeVerifier

    verifier = TreeVerifier(smol.model, smol.stop_ids)
    prompt = smol.encode_chat([{"role": "user", "content": "Say hello."}])
    tables = {}
    for harvest in (True, False):
        drafter = make_drafter("goose", GooseConfig(harvest_prefill=harvest))
        assert drafter.needs_prefill is harvest
        decode(verifier, drafter, prompt, DecodeConfig(max_new_tokens=1), max_context=smol.max_context)
        tables[harvest] = len(drafter.tables["default"].unigram)
    # One forward harvests at most its one-node tree; the prefill adds every prompt position.
    assert tables[False] <= 1 < len(prompt) // 2 <= tables[True]
