"""End-to-end on the real model: every method's output equals transformers' greedy output."""

import pytest
import torch

from oilbird.audit import compare
from oilbird.cost_curve import CostCurve
from oilbird.decode import DecodeConfig, decode
from oilbird.drafters import make_drafter
from oilbird.errors import PromptError
from oilbird.skinny_gemm import bf16_dot_ready
from oilbird.tree_attention import SKINNY_ATTENTION
from oilbird.tree_select import FittedTree
from oilbird.verifier import TreeVerifier

MAX_NEW = 48  # the length of the session's greedy references (E2E_MAX_NEW, tests/conftest.py)


@pytest.fixture
def references(api_bank_references):
    """transformers' greedy outputs for the 5 prompts, computed once per session."""
    assert all(len(r.output_ids) <= MAX_NEW for r in api_bank_references)
    return api_bank_references


@pytest.mark.parametrize("method", ["ar", "pld"])
def test_output_equals_greedy_on_api_bank(smol, api_bank_prompts, references, method):
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    drafter = make_drafter(method)  # one instance across requests, as the benchmark serves them
    forwards = tokens = 0
    for i, (ids, ref) in enumerate(zip(api_bank_prompts, references)):
        result = decode(verifier, drafter, ids, DecodeConfig(max_new_tokens=MAX_NEW),
                        max_context=smol.max_context, request_id=f"r{i}")
        audit = compare(result.output_ids, ref)
        assert audit.lossless, f"request {i}: {audit}"
        assert sum(result.committed_per_forward) == len(result.output_ids)
        forwards += result.forwards
        tokens += len(result.output_ids)
    if method == "ar":
        assert forwards == tokens  # one token per forward
    else:
        assert tokens / forwards > 1.2  # API-Bank prompts repeat: PLD must accept drafts


def test_max_new_tokens_truncates_and_records_excess(smol, api_bank_prompts, references):
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    ids = api_bank_prompts[4]  # PLD accepts long drafts on this one
    result = decode(verifier, make_drafter("pld"), ids, DecodeConfig(max_new_tokens=5),
                    max_context=smol.max_context)
    assert result.output_ids == references[4].output_ids[:5]
    assert result.finish_reason == "length"


def test_the_fit_policy_learns_the_tail_that_max_new_tokens_cuts(smol, api_bank_prompts, references):
    # The verifier accepted the cut tail: counted as rejected, it would teach the policy that
    # deep nodes fail. The output still ends at max_new_tokens.
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    policy = FittedTree(CostCurve({1: 1.0, 64: 1.0}), 64)  # free nodes: verify every draft
    result = decode(verifier, make_drafter("pld"), api_bank_prompts[4], DecodeConfig(max_new_tokens=5),
                    max_context=smol.max_context, budget_policy=policy)
    assert result.output_ids == references[4].output_ids[:5]
    assert result.excess_tokens > 0
    assert policy.calibration()["committed"] == len(result.output_ids) + result.excess_tokens


def test_context_limit_stops_generation(smol, api_bank_prompts, references):
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    ids = api_bank_prompts[4]
    result = decode(verifier, make_drafter("pld"), ids, DecodeConfig(max_new_tokens=40),
                    max_context=len(ids) + 6)
    assert result.finish_reason == "context"
    assert len(ids) + len(result.output_ids) <= len(ids) + 6
    assert result.output_ids == references[4].output_ids[: len(result.output_ids)]


def test_bad_prompts_are_refused_with_lengths(smol):
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    with pytest.raises(PromptError, match="empty"):
        decode(verifier, make_drafter("ar"), [], max_context=smol.max_context)
    with pytest.raises(PromptError, match=r"20 tokens .* context is 10 tokens"):
        decode(verifier, make_drafter("ar"), list(range(1, 21)), max_context=10)


def test_the_drafters_observe_is_drafter_time_not_bookkeeping(smol, api_bank_prompts):
    """Harvesting into pools is the drafter's cost: it must not inflate the verifier's bookkeeping."""
    import time

    from oilbird.drafters.pld import PromptLookup

    class SlowHarvest(PromptLookup):
        def observe(self, request_id, verification):
            time.sleep(0.02)  # stands in for an expensive harvest (pools, stores)
            return super().observe(request_id, verification)

    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
    result = decode(verifier, SlowHarvest(), api_bank_prompts[0], DecodeConfig(max_new_tokens=8),
                    max_context=smol.max_context)
    assert result.observe_s >= 0.02 * result.forwards
    assert result.drafter_s == result.propose_s + result.observe_s
    assert result.bookkeeping_s < 0.02 * result.forwards  # mask, walk, compaction and accounting only
    # Every forward's own seconds are kept beside its node count (scripts/in_run_curve.py).
    assert len(result.forward_s_per_forward) == len(result.nodes_per_forward) == result.forwards
    assert abs(sum(result.forward_s_per_forward) - result.forward_s) < 1e-9


@pytest.mark.skipif(not bf16_dot_ready()[0], reason=f"no AVX512_BF16 GEMM here: {bf16_dot_ready()[1]}")
def test_bfloat16_speculation_equals_our_own_greedy_decoding(api_bank_prompts):
    # bfloat16 logits tie often, and transformers' own kernels break ties their own way (the
    # audit's generate() reference differs from any other kernel's greedy output at ties); what
    # speculation must keep is our own greedy output on the same kernels, token for token.
    from oilbird.kernels import describe_kernels
    from oilbird.models import load_model

    smol16 = load_model("smollm2-135m", dtype=torch.bfloat16, log=lambda message: None)
    model = smol16.tree_model()
    assert describe_kernels(model) == f"skinny-bf16/{SKINNY_ATTENTION}"
    verifier = TreeVerifier(model, smol16.stop_ids)
    drafters = {method: make_drafter(method) for method in ("ar", "oilbird")}
    tokens = forwards = 0
    for i, ids in enumerate(api_bank_prompts[:4]):
        outputs = {}
        for method, drafter in drafters.items():
            result = decode(verifier, drafter, ids, DecodeConfig(max_new_tokens=MAX_NEW),
                            max_context=smol16.max_context, request_id=f"r{i}")
            outputs[method] = result.output_ids
            if method == "oilbird":
                tokens, forwards = tokens + len(result.output_ids), forwards + result.forwards
        assert outputs["oilbird"] == outputs["ar"], f"request {i}"
    assert tokens / forwards > 1.5  # trees were verified, not one-token steps
