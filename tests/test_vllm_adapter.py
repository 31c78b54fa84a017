"""The engine adapter (oilbird/integrations/vllm/adapter.py) with hand-built steps; no vLLM needed."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

import oilbird.methods  # noqa: F401 - fills the drafter registry
from oilbird.drafters.registry import DRAFTERS
from oilbird.errors import ConfigError
from oilbird.integrations.vllm.adapter import EngineDrafter, StepRequest
from oilbird.integrations.vllm.config import EngineDrafterConfig
from oilbird.integrations.vllm.proposer import OilbirdProposer

PROMPT = [5, 6, 7, 8, 5, 6, 7, 9, 5, 6]  # PLD finds "5 6" -> "7 8 5 6 7 9 ..." after the anchor 6


def pld(**kw) -> EngineDrafter:
    """PLD at full length (its best path), unless `length_policy` says otherwise."""
    return EngineDrafter.build(EngineDrafterConfig(method="pld", **{"length_policy": "fixed", **kw}))


def step(rid, committed, drafts=(), tenant="t", prompt=PROMPT, rows=None) -> StepRequest:
    n = len(drafts) + 1
    return StepRequest(rid, list(prompt), tenant, list(drafts), list(committed),
                       hidden=torch.zeros(rows or n, 4))


def test_the_first_committed_token_starts_the_request_and_a_proposal_follows():
    engine = pld()
    (proposal,) = engine.step([step("a", [7])], max_drafts=3)
    state = engine.drafter.requests["a"]
    assert state.sequence == PROMPT + [7] and state.tenant == "t"
    assert proposal == [8, 5, 6]  # the earliest "6 7" continues with 8 5 6 (PLD), cut at 3 drafts


def test_a_step_with_nothing_committed_neither_starts_nor_proposes():
    engine = pld()
    assert engine.step([step("a", [])], max_drafts=4) == [[]]
    assert "a" not in engine.drafter.requests


def test_accepted_drafts_extend_the_sequence_and_count_per_tenant():
    engine = pld()
    (proposal,) = engine.step([step("a", [7])], max_drafts=3)
    engine.step([step("a", proposal[:2] + [1], drafts=proposal)], max_drafts=3)  # 2 accepted, bonus 1
    assert engine.drafter.requests["a"].sequence == PROMPT + [7, 8, 5, 1]
    stats = engine.stats["t"]
    assert (stats.forwards, stats.committed, stats.drafted, stats.accepted) == (2, 4, 3, 2)
    assert stats.tau == 2.0


def test_the_verified_chain_keeps_the_sources_of_our_proposal():
    engine = pld()
    (proposal,) = engine.step([step("a", [7])], max_drafts=3)
    seen = []
    original = engine.drafter.observe
    engine.drafter.observe = lambda rid, ver: (seen.append(ver), original(rid, ver))[1]
    engine.step([step("a", [8, 0], drafts=proposal)], max_drafts=3)
    ver = seen[0]
    assert ver.tree.tokens == [7] + proposal and ver.tree.sources[1] == {"pld"}
    assert ver.path == [1] and ver.committed == [8, 0] and ver.hidden.shape == (4, 4)


def test_an_engine_step_that_contradicts_its_drafts_is_an_error():
    engine = pld()
    (proposal,) = engine.step([step("a", [7])], max_drafts=3)
    with pytest.raises(ConfigError, match="does not extend"):
        engine.step([step("a", [proposal[0] + 1, 3], drafts=proposal)], max_drafts=3)


def test_requests_interleave_and_finish_with_their_prompt_and_output():
    engine = pld()
    engine.step([step("a", [7]), step("b", [1], tenant="u", prompt=[1, 2, 3])], max_drafts=2)
    engine.step([step("b", [2], tenant="u", prompt=[1, 2, 3]), step("a", [8])], max_drafts=2)
    done = engine.finish("b")
    assert (done.tenant, done.prompt_ids, done.output_ids) == ("u", [1, 2, 3], [1, 2])
    assert engine.finish("b") is None and engine.finish("never") is None
    assert engine.drafter.requests["a"].sequence == PROMPT + [7, 8]
    assert engine.stats["u"].requests == 1 and engine.stats["t"].requests == 0


def test_zero_drafts_allowed_proposes_nothing():
    engine = pld()
    assert engine.step([step("a", [7])], max_drafts=0) == [[]]


def test_build_rejects_unknown_methods_fly_budgets_and_draft_models():
    with pytest.raises(ConfigError, match="unknown method"):
        EngineDrafter.build(EngineDrafterConfig(method="nope"))
    with pytest.raises(ConfigError, match="no config field"):
        EngineDrafter.build(EngineDrafterConfig(method="pld[bogus=1]"))
    with pytest.raises(ConfigError, match="strict"):
        EngineDrafterConfig(method="pld+fly")
    with pytest.raises(ConfigError, match="model of its own"):
        EngineDrafter.build(EngineDrafterConfig(method="draft"))
    assert EngineDrafter.build(EngineDrafterConfig(method="pld[num_pred_tokens=4]")).drafter.config.num_pred_tokens == 4


def test_additional_config_names_unknown_options():
    assert EngineDrafterConfig.from_additional_config(None).method == "oilbird"
    assert EngineDrafterConfig.from_additional_config({"oilbird": {"method": "sam"}}).method == "sam"
    with pytest.raises(ConfigError, match="unknown oilbird option"):
        EngineDrafterConfig.from_additional_config({"oilbird": {"methd": "sam"}})
    for field in ("min_reach", "max_batch_reach"):
        with pytest.raises(ConfigError, match=field):
            EngineDrafterConfig.from_additional_config({"oilbird": {field: 1.5}})
    assert EngineDrafterConfig.from_additional_config({"oilbird": {"max_batch_reach": 0.3}}).max_batch_reach == 0.3
    with pytest.raises(ConfigError, match="calibration_shape must be true or false"):
        EngineDrafterConfig.from_additional_config({"oilbird": {"calibration_shape": "false"}})
    assert EngineDrafterConfig.from_additional_config({"oilbird": {"calibration_shape": True}}).calibration_shape
    for bad in (-1, 2.5, True):
        with pytest.raises(ConfigError, match="extend_trials must be an integer >= 0"):
            EngineDrafterConfig(extend_trials=bad)


def test_the_draft_length_adapts_to_acceptance():
    engine = pld(length_policy="adaptive")
    engine.step([step("a", [7])], max_drafts=8)
    assert engine.lengths["a"] == 8  # a new request may use vLLM's whole draft length
    engine.lengths["a"] = 3
    (proposal,) = engine.step([step("a", [8, 5, 6, 1], drafts=[8, 5, 6])], max_drafts=8)
    assert engine.lengths["a"] == 5 and len(proposal) <= 5  # all accepted: +2
    engine.step([step("a", [4, 2], drafts=[4, 4, 4])], max_drafts=8)
    assert engine.lengths["a"] == 2  # one accepted: accepted + 1
    engine.step([step("a", [9], drafts=[5, 5])], max_drafts=8)
    assert engine.lengths["a"] == 1  # never below one
    fixed = pld()
    fixed.step([step("a", [7])], max_drafts=8)
    fixed.step([step("a", [0], drafts=[3])], max_drafts=8)
    assert "a" not in fixed.lengths


def test_a_seeded_sampled_request_gets_no_drafts_but_is_observed():
    engine = pld()
    request = step("a", [7])
    request.seeded = True
    assert engine.step([request], max_drafts=8) == [[]]
    assert engine.drafter.requests["a"].sequence == PROMPT + [7]


def test_tokens_past_max_tokens_or_a_stop_token_are_not_kept():
    engine = pld()
    first = step("a", [7])
    first.max_output = 3
    engine.step([first], max_drafts=4)
    late = step("a", [8, 5, 6, 1], drafts=[8, 5, 6])
    late.max_output = 3  # one produced, two more allowed: 8 and 5; vLLM drops 6 and 1
    engine.step([late], max_drafts=4)
    assert engine.finish("a").output_ids == [7, 8, 5]
    assert engine.stats["t"].committed == 3
    engine.step([step("b", [7])], max_drafts=4)
    stop = step("b", [8, 2, 6], drafts=[8, 2, 6, 7])
    stop.stop_ids = frozenset({2})
    engine.step([stop], max_drafts=4)
    assert engine.finish("b").output_ids == [7, 8, 2]


def test_a_drafter_learns_which_of_its_nodes_the_engine_will_verify():
    engine = EngineDrafter.build(EngineDrafterConfig(method="goose"))
    told = []
    original = engine.drafter.restrict_proposal
    engine.drafter.restrict_proposal = lambda rid, nodes: (told.append(list(nodes)), original(rid, nodes))
    (proposal,) = engine.step([step("a", [7])], max_drafts=3)
    assert len(told) == 1 and len(told[0]) == len(proposal)
    spine = engine.drafter.requests["a"].spine_nodes
    assert all(1 <= node <= len(proposal) for node in spine)  # renumbered into the chain


def _steps_with(topk: bool, method: str) -> list[list[int]]:
    """Two requests of one tenant through `method`, the engine handing top-k rows or none. Each
    step verifies the previous proposal and accepts none of it (the bonus token only)."""
    engine = EngineDrafter.build(EngineDrafterConfig(method=method, length_policy="fixed"))
    proposals = []
    for rid in ("a", "b"):
        drafts: list[int] = []
        for token in (7, 8, 5, 6):
            request = step(rid, [token], drafts)
            if topk:  # the target's top-3 at each verified position: the bonus token, then 40, 41
                rows = len(drafts) + 1
                request.topk_ids = torch.tensor([[token, 40, 41]] * rows)
                request.topk_logits = torch.tensor([[3.0, 2.0, 1.0]] * rows)
            (drafts,) = engine.step([request], max_drafts=4)
            proposals.append(drafts)
        engine.finish(rid)
    return proposals


# Every drafter the adapter hosts (no draft model; the official SuffixDecoding where installed).
HOSTED = sorted(name for name, cls in DRAFTERS.items() if not cls.needs_target
                and (name != "suffix-ref" or importlib.util.find_spec("arctic_inference")))


@pytest.mark.parametrize("method", HOSTED)
def test_a_drafter_reads_the_top_k_exactly_when_it_says_so(method):
    """The vLLM runner computes the top-k only for drafters with `uses_topk`: the others must
    draft the same without it, and those that read it draft otherwise (they fall back to the
    argmax alone)."""
    uses = EngineDrafter.build(EngineDrafterConfig(method=method)).drafter.uses_topk
    assert uses == (method in ("tr", "goose", "oilbird", "oilbird-tr"))
    assert (_steps_with(True, method) != _steps_with(False, method)) == uses


def _serve_rejecting(engine: EngineDrafter, first: int, count: int, accept: bool = False) -> list[list[int]]:
    """`count` one-step requests of tenant t, each proposing after its first token (7); each
    proposal is then verified: all rejected (the engine commits 0), or with `accept` all accepted."""
    proposals = []
    for i in range(first, first + count):
        (proposal,) = engine.step([step(f"r{i}", [7])], max_drafts=3)
        if proposal:
            engine.step([step(f"r{i}", proposal + [1] if accept else [0], drafts=proposal)], max_drafts=3)
        engine.finish(f"r{i}")
        proposals.append(proposal)
    return proposals


def test_a_calibrated_tenant_cut_to_nothing_is_probed_and_can_earn_its_way_back():
    engine = pld(length_policy="calibrated", calibration_context="none", explore_every=8, explore_drafts=2)
    warm = _serve_rejecting(engine, 0, 20)
    assert warm[0] == [8, 5, 6] and warm[-1] == []  # rejections cut the chain below min_reach
    probes_before = engine.floors["t"].probes
    later = _serve_rejecting(engine, 20, 27)
    drafted = [i for i, p in enumerate(later) if p]
    assert len(drafted) == 3 and all(later[i] == [8, 5] for i in drafted)  # probes of 2 drafts
    assert drafted[1] - drafted[0] == 9 and drafted[2] - drafted[1] == 9  # one in 9 steps
    assert engine.floors["t"].probes - probes_before == 3
    # The traffic turns: the probes are accepted, and the estimates come back above min_reach.
    turned = _serve_rejecting(engine, 50, 60, accept=True)
    assert turned[-1] == [8, 5, 6]
    never = pld(length_policy="calibrated", calibration_context="none", explore_every=0)
    assert not any(_serve_rejecting(never, 0, 60)[20:])
    # The server's metrics (`oilbird_probes_total`) read the floor's count, per tenant.
    spec = SimpleNamespace(num_speculative_tokens=3)
    proposer = OilbirdProposer(SimpleNamespace(additional_config={}, speculative_config=spec,
                                               model_config=SimpleNamespace(max_model_len=64)))
    proposer.engine = engine
    assert proposer.stats()["t"]["probes"] == engine.floors["t"].probes >= 3
    proposer.engine = never
    assert proposer.stats()["t"]["probes"] == 0
    with pytest.raises(ConfigError, match="explore_every"):
        pld(explore_every=-1)
