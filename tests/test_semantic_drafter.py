"""Oilbird and the transplants (oilbird.drafters.semantic): online, per tenant, lossless."""

import pytest
import torch

from oilbird.drafters import make_drafter
from oilbird.drafters.semantic import OilbirdConfig, OilbirdPLDConfig
from oilbird.errors import ConfigError
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification

DIM = 8
STATE = torch.ones(DIM)  # every position has the same state: every record is a perfect neighbour


def verification(tree: DraftTree, committed: list[int]) -> Verification:
    n = len(tree)
    states = STATE.repeat(n, 1)  # [n, DIM]
    return Verification(tree=tree, prefix_len=0, argmax=torch.zeros(n, dtype=torch.long),
                        topk_ids=torch.zeros(n, 10, dtype=torch.long), topk_logits=torch.zeros(n, 10),
                        hidden_states=(states,), path=[], committed=committed,
                        finished=False)


def serve(drafter, request_id, prompt, output, tenant):
    """Commit `output` one token per cycle; return every tree proposed."""
    drafter.start_request(request_id, prompt, tenant)
    states = STATE.repeat(len(prompt) - 1, 1)
    drafter.observe_prefill(PrefillObservation(prompt[:-1], torch.zeros(len(prompt) - 1, 0),
                                               torch.zeros(len(prompt) - 1, 0), (states,)))
    trees = []
    for token in output:
        trees.append(drafter.propose(budget=40))
        drafter.observe(verification(trees[-1], [token]))
    drafter.stop_request(request_id)
    return trees


def semantic_tokens(trees):
    return {t.tokens[n] for t in trees for n in range(1, len(t)) if "sem" in t.sources[n]}


def new_drafter(**overrides):
    # PLD host: a repetitive prompt gives it a lexical match every cycle, so the key may extend it.
    config = OilbirdPLDConfig(sem_self_calibrate=False, sem_rejected_pool=False, sem_index_prompt=False,
                              **overrides)
    return make_drafter("oilbird-pld", config)


PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def output(base: int, n: int = 4) -> list[int]:
    """[3, 1, 2, base, 3, 1, 2, base + 1, ...]: the prompt's pattern keeps PLD matching."""
    return [t for i in range(n) for t in (3, 1, 2, base + i)]


def test_semantic_source_drafts_only_committed_records_of_its_own_tenant():
    drafter = new_drafter()
    serve(drafter, "a1", PROMPT, output(100), "A")
    trees_b = serve(drafter, "b1", PROMPT, output(200), "B")
    drafted_b = semantic_tokens(trees_b)
    assert {t for t in drafted_b if t >= 200}, "the key never fired for tenant B: the test would prove nothing"
    assert not {t for t in drafted_b if 100 <= t < 110}, "tenant A's tokens reached tenant B"
    future = output(300)
    trees_a = serve(drafter, "a2", PROMPT, future, "A")
    assert {t for t in semantic_tokens(trees_a) if 100 <= t < 110}, "same tenant: A's past should be found"
    for i, tree in enumerate(trees_a):  # nothing of this request's future, ever
        unseen = {t for t in future[i:] if t >= 300}
        assert not set(tree.tokens[1:]) & unseen, f"cycle {i} drafted an uncommitted token"


def test_the_cycle_just_committed_is_not_searchable():
    drafter = new_drafter()
    drafter.start_request("r", PROMPT, "t")
    states = STATE.repeat(len(PROMPT) - 1, 1)
    drafter.observe_prefill(PrefillObservation(PROMPT[:-1], torch.zeros(7, 0), torch.zeros(7, 0),
                                               (states,)))
    tree = drafter.propose(budget=40)
    drafter.observe(verification(tree, [50]))
    assert drafter.visible == len(drafter.store) - 1  # the record of 50 waits one cycle
    assert not semantic_tokens([drafter.propose(budget=40)])  # its only record has no value yet


def test_entry_budget_zero_gives_exactly_the_host_tree():
    plain, host = new_drafter(sem_entry_budget=0), make_drafter("pld")
    for drafter in (plain, host):
        serve(drafter, "a", PROMPT, output(100), "A")
    trees = serve(plain, "b", PROMPT, output(100), "A")
    host.start_request("b", PROMPT, "A")
    for tree, token in zip(trees, output(100)):
        expected = host.propose(budget=40)
        assert tree.tokens == expected.tokens and tree.parents == expected.parents
        host.observe(verification(expected, [token]))


def test_node_budget_is_never_exceeded_and_the_key_never_opens_a_chain():
    drafter = new_drafter(sem_entry_budget=30, sem_entry_share=1.0)
    serve(drafter, "a", PROMPT, output(100), "A")
    drafter.start_request("b", [7, 8, 9], "A")  # no repetition: PLD finds nothing
    states = STATE.repeat(2, 1)
    drafter.observe_prefill(PrefillObservation([7, 8], torch.zeros(2, 0), torch.zeros(2, 0),
                                               (states,)))
    assert len(drafter.propose(budget=40)) == 1
    trees = serve(drafter, "c", PROMPT, output(100), "A")
    assert all(len(t) <= 40 for t in trees) and semantic_tokens(trees)


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="sem_granularity"):
        OilbirdConfig(sem_granularity="sentence")
    drafter = make_drafter("oilbird", OilbirdConfig(sem_layer=40))
    drafter.start_request("r", PROMPT, "t")
    states = STATE.repeat(7, 1)
    with pytest.raises(ConfigError, match="sem_layer=40"):
        drafter.observe_prefill(PrefillObservation(PROMPT[:-1], torch.zeros(7, 10, dtype=torch.long),
                                                   torch.zeros(7, 10), (states,)))


# --- end to end on the real model ----------------------------------------------------------

@pytest.mark.parametrize("method", ["oilbird", "oilbird-pld", "oilbird-tr"])
def test_output_equals_greedy_on_api_bank(serve_api_bank, method):
    """One drafter across 5 API-Bank requests on SmolLM2: every output is the greedy one."""
    results, tau = serve_api_bank(make_drafter(method), node_budget=60)
    assert tau > 1.2
    assert sum(r.accepted_sources.get("sem", 0) for r in results) > 0, "the key never landed"
    stats = results[-1].drafter_stats
    assert stats["store_records"] > 0 and stats["bytes_per_record"] > 0 and stats["cycles"] > 0


@pytest.mark.parametrize("overrides", [dict(sem_layer=0), dict(sem_granularity="request"),
                                       dict(sem_key_dtype="int8", sem_index="faiss")])
def test_ablations_stay_lossless(serve_api_bank, overrides):
    serve_api_bank(make_drafter("oilbird", OilbirdConfig(**overrides)), node_budget=32)
