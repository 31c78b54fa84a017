"""Draft-model decoding (oilbird.drafters.draft_model) on the real model; FLy end to end."""

import pytest
import torch

from oilbird.decode import DecodeConfig, decode
from oilbird.drafters import make_drafter
from oilbird.drafters.draft_model import REUSE_MIN_MATCH, DraftModelConfig, check_same_vocabulary
from oilbird.errors import ConfigError, ModelError
from oilbird.fly import FlyConfig
from oilbird.verifier import TreeVerifier


def attached(smol, **fields):
    drafter = make_drafter("draft", DraftModelConfig(model="self:4", **fields))
    drafter.attach(smol)
    return drafter


@pytest.mark.heavy(60)
def test_strict_draft_model_decoding_equals_greedy(serve_api_bank, smol):
    results, tau = serve_api_bank(attached(smol, k=6), node_budget=16)
    assert tau > 1.0  # the target's own first layers do predict some of its tokens
    assert all(r.drafter_stats["drafter_forwards"] > 0 and not r.lossy for r in results)
    # The API-Bank prompts share their beginnings: later requests take over the drafter's KV of them.
    assert results[0].drafter_stats["prefix_reused"] == 0
    assert all(r.drafter_stats["prefix_reused"] >= REUSE_MIN_MATCH for r in results[1:])


@pytest.mark.heavy(75)
def test_mla_draft_model_decoding_equals_greedy(serve_api_bank, smol):
    results, _ = serve_api_bank(attached(smol, k=6, mla=True), node_budget=16)
    assert sum(r.drafter_stats["mla_accepted"] for r in results) > 0


def test_mla_drafts_are_the_drafters_own_token_by_token_drafts(smol, api_bank_prompts):
    # Prompt lookup only proposes; the drafter verifies exactly, so the chain is unchanged, in
    # fewer drafter forwards.
    chains, forwards = [], []
    for mla in (False, True):
        drafter = attached(smol, k=12, mla=mla)
        drafter.start_request("r", api_bank_prompts[1])
        chains.append(drafter.propose("r", 64).tokens)
        forwards.append(drafter.request_stats("r")["drafter_forwards"])
    assert chains[0] == chains[1] and len(chains[0]) == 13
    assert forwards[0] == 12 and forwards[1] <= 12


def test_fly_is_lossy_and_differs_from_greedy_only_where_the_rule_forgave(smol, api_bank_prompts):
    # θ = 0 and W = 0: every draft token is accepted, so the drafter's errors are all forgiven.
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids, fly=FlyConfig(theta=0.0, window=0))
    ids = api_bank_prompts[0]
    result = decode(verifier, attached(smol, k=6), ids, DecodeConfig(max_new_tokens=24, node_budget=16),
                    max_context=smol.max_context)
    assert result.lossy and result.forgiven_positions
    # K accepted drafts plus one token from the target every round (the last one cut at the limit).
    assert result.committed_per_forward[:-1] == [7] * (result.forwards - 1)
    with torch.inference_mode():
        full = torch.tensor([ids + result.output_ids])
        argmax = smol.model(input_ids=full).logits[0, len(ids) - 1:-1].argmax(-1).tolist()  # [new]
    differ = [i for i, (a, b) in enumerate(zip(argmax, result.output_ids)) if a != b]
    assert differ and set(differ) <= set(result.forgiven_positions)


def test_fly_with_theta_one_is_strict(serve_api_bank, smol, api_bank_prompts, api_bank_references):
    from oilbird.audit import compare

    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids, fly=FlyConfig(theta=1.0, entropy="normalized"))
    result = decode(verifier, attached(smol, k=8), api_bank_prompts[0],
                    DecodeConfig(max_new_tokens=48, node_budget=16), max_context=smol.max_context)
    assert result.lossy and not result.forgiven_positions
    assert compare(result.output_ids, api_bank_references[0]).lossless


def test_a_drafter_with_another_vocabulary_is_refused():
    class Tok:
        def __init__(self, vocab):
            self.vocab = vocab

        def get_vocab(self):
            return self.vocab

    check_same_vocabulary(Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1}), "t", "d")
    with pytest.raises(ModelError, match=r"another vocabulary \(3 tokens\).*\(2 tokens\)"):
        check_same_vocabulary(Tok({"a": 0, "b": 1}), Tok({"a": 0, "b": 1, "c": 2}), "t", "d")
    with pytest.raises(ModelError, match="another vocabulary"):
        check_same_vocabulary(Tok({"a": 0, "b": 1}), Tok({"a": 1, "b": 0}), "t", "d")


def test_bad_draft_configs_are_clear_errors(smol):
    with pytest.raises(ModelError, match="1 <= N < 30"):
        make_drafter("draft", DraftModelConfig(model="self:30")).attach(smol)
    with pytest.raises(ValueError, match="layer count"):
        DraftModelConfig(model="self:x")
    with pytest.raises(ValueError, match="k must be"):
        DraftModelConfig(k=0)
    with pytest.raises(ConfigError, match="attach"):
        make_drafter("draft", DraftModelConfig(model="self:2")).start_request("r", [1, 2])


@pytest.mark.parametrize("reuse", [False, True])
def test_a_request_drafts_the_same_whatever_was_served_before(smol, api_bank_prompts, reuse):
    fresh = attached(smol, k=8)
    fresh.start_request("b", api_bank_prompts[2])
    expected = fresh.propose("b", 16).tokens
    used = attached(smol, k=8, reuse_prefix=reuse)
    used.start_request("a", api_bank_prompts[0])
    used.propose("a", 16)
    used.stop_request("a")
    assert (used.tenant_bytes("default") > 0) == reuse  # a's cache is kept only to be reused
    used.start_request("b", api_bank_prompts[2])
    state = used.state("b")
    if reuse:  # b took over a's reading of the prompt prefix they share, and reads only the rest
        assert state.stats["prefix_reused"] >= REUSE_MIN_MATCH
        assert state.cached == api_bank_prompts[2][:state.stats["prefix_reused"]]
    else:
        assert state.cached == [] and state.stats["prefix_reused"] == 0
    assert used.propose("b", 16).tokens == expected
    used.start_request("c", api_bank_prompts[2])  # b still holds the cache: c reads its prompt whole
    assert used.state("c").cached == []


def test_another_tenants_finished_request_is_never_reused(smol, api_bank_prompts):
    drafter = attached(smol, k=8)
    drafter.start_request("a", api_bank_prompts[0], tenant="alice")
    drafter.propose("a", 16)
    drafter.stop_request("a")
    drafter.start_request("b", api_bank_prompts[0], tenant="bob")
    assert drafter.state("b").cached == [] and drafter.state("b").stats["prefix_reused"] == 0
    drafter.drop_tenant("alice")
    assert drafter.tenant_bytes("alice") == 0


def test_concurrent_requests_keep_their_own_caches(smol, api_bank_prompts):
    # One drafter, two requests in flight, proposals interleaved: each drafts as if it were alone.
    alone = []
    for i in (0, 2):
        fresh = attached(smol, k=8)
        fresh.start_request("x", api_bank_prompts[i])
        alone.append(fresh.propose("x", 16).tokens)
    both = attached(smol, k=8)
    both.start_request("a", api_bank_prompts[0])
    both.start_request("b", api_bank_prompts[2])
    assert [both.propose("a", 16).tokens, both.propose("b", 16).tokens] == alone
    assert both.state("a").cached != both.state("b").cached
