"""Prefix caching across requests (oilbird/prefix_cache.py): the reused KV gives what a full
prefill gives, the observation too, and decoding with it stays lossless, on the real model."""

import pytest
import torch

from oilbird.decode import DecodeConfig, decode
from oilbird.drafters import make_drafter
from oilbird.prefix_cache import PrefixCache, PrefixCacheConfig, common_prefix
from oilbird.tree import DraftTree
from oilbird.verifier import CachedPrefix, TreeVerifier


@pytest.fixture(scope="module")
def verifier(smol):
    return TreeVerifier(smol.tree_model(), smol.stop_ids)


def next_logits(verifier, state) -> torch.Tensor:
    return verifier.verify(state, DraftTree.root(state.anchor)).topk_logits[0]


def test_a_reused_prefix_gives_the_full_prefills_next_token(verifier, api_bank_prompts):
    first, second = api_bank_prompts[0], api_bank_prompts[1]
    shared = common_prefix(first[:-1], second[:-1])
    assert shared > 500
    old = verifier.prefill(first)
    state = verifier.prefill(second, CachedPrefix(old.cache, shared))
    full = verifier.prefill(second)
    assert state.length == full.length and state.cache.get_seq_length() == full.length
    a, b = next_logits(verifier, state), next_logits(verifier, full)
    assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()


def test_a_short_reused_prefix_gives_the_full_prefills_next_token(verifier, api_bank_prompts):
    """A prompt short enough for the skinny kernel's causal mode (no mask over a cached prefix;
    oilbird.tree_attention.prefix_causal_mask) matches its full prefill too."""
    prompt = api_bank_prompts[0][:400]
    old = verifier.prefill(prompt[:100] + [prompt[0]] * 20)
    state = verifier.prefill(prompt, CachedPrefix(old.cache, 100))  # 299 rows over 100 cached
    full = verifier.prefill(prompt)
    a, b = next_logits(verifier, state), next_logits(verifier, full)
    assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()


def test_an_observed_prefill_reuses_the_earlier_observation(verifier, api_bank_prompts):
    first, second = api_bank_prompts[0], api_bank_prompts[1]
    shared = common_prefix(first[:-1], second[:-1])
    old, old_obs = verifier.prefill_observed(first, hidden_layer=-1)
    state, obs = verifier.prefill_observed(second, hidden_layer=-1, past=CachedPrefix(old.cache, shared, old_obs))
    _, full = verifier.prefill_observed(second, hidden_layer=-1)
    assert obs.tokens == full.tokens == second[:-1]
    assert obs.topk_ids.shape == full.topk_ids.shape and obs.hidden.shape == full.hidden.shape
    assert (obs.topk_ids[:, 0] == full.topk_ids[:, 0]).float().mean() > 0.99
    assert torch.allclose(obs.hidden, full.hidden, atol=1e-3)
    assert (obs.reused, full.reused, old_obs.reused) == (shared, 0, 0)  # pools may skip the reused rows
    with pytest.raises(ValueError, match="observation"):
        verifier.prefill_observed(second, past=CachedPrefix(old.cache, shared))


def test_take_matches_the_longest_common_prefix_and_never_the_anchor(verifier, api_bank_prompts):
    cache = PrefixCache(PrefixCacheConfig(min_match=4))
    prompt = api_bank_prompts[0]
    state = verifier.prefill(prompt)
    cache.store("t", prompt + [1, 2], state)
    assert cache.take("other", prompt) is None  # tenants never share
    past = cache.take("t", prompt)  # the same prompt again: all but its anchor
    assert past.length == len(prompt) - 1 and cache.take("t", prompt) is None  # taken: gone
    cache.store("t", prompt, state)
    assert cache.take("t", prompt[:3] + [0] * 10) is None  # 3 < min_match
    cache.store("t", prompt, state)
    assert cache.take("t", prompt, observed=True) is None  # no observation held for a harvester
    off = PrefixCache(PrefixCacheConfig(enabled=False))
    off.store("t", prompt, state)
    assert off.take("t", prompt) is None
    with pytest.raises(ValueError, match="min_match"):
        PrefixCacheConfig(min_match=0)


@pytest.mark.heavy(40)
@pytest.mark.parametrize("method", ["ar", "goose"])  # goose harvests the prefill
def test_decoding_with_a_prefix_cache_equals_decoding_without(smol, verifier, api_bank_prompts, method):
    outputs = {}
    for reuse in (True, False):
        drafter, cache, outs = make_drafter(method), PrefixCache(PrefixCacheConfig(enabled=reuse)), []
        for i, ids in enumerate(api_bank_prompts[:3]):
            result = decode(verifier, drafter, ids, DecodeConfig(max_new_tokens=24), max_context=smol.max_context,
                            request_id=f"r{i}", prefix_cache=cache)
            outs.append((result.output_ids, result.prefix_reused))
        outputs[reuse] = outs
    assert [o for o, _ in outputs[True]] == [o for o, _ in outputs[False]]
    assert [r for _, r in outputs[False]] == [0, 0, 0]
    assert outputs[True][0][1] == 0 and outputs[True][1][1] > 500 and outputs[True][2][1] > 500


def test_where_prefills_run_apart_only_prefilled_rows_are_reused(verifier, api_bank_prompts):
    # A request's KV rows past its prompt come from decoding's forwards; with a prefill kernel of
    # its own (ForwardConfig.prefill_kernel) a later prompt re-prefills them, so that every method
    # gives a prompt position a prefill's bits whatever its own cache held.
    cache = PrefixCache(PrefixCacheConfig(min_match=4))
    prompt = api_bank_prompts[0]
    state = verifier.prefill(prompt)  # the KV of prompt[:-1]; pretend decoding added none
    grown = prompt + [11, 12, 13]  # the next prompt: the last one, its answer, more
    cache.store("t", prompt, state, prefilled=len(prompt) - 5)  # the prefill computed all but 4 rows
    assert cache.take("t", grown, prefilled_only=True).length == len(prompt) - 5
    cache.store("t", prompt, state, prefilled=len(prompt) - 5)
    assert cache.take("t", grown).length == len(prompt) - 1  # otherwise every held row
    cache.store("t", prompt, state)  # prefilled: None = all of them
    assert cache.take("t", grown, prefilled_only=True).length == len(prompt) - 1
