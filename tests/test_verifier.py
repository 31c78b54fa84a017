"""Tree verifier on the real model: masks and positions against sequential forwards, the greedy
walk, the bonus token, stop tokens and cache compaction; on the model as loaded and on its copy
with the fast kernels (oneDNN GEMM, tree attention; oilbird/kernels.py)."""

import pytest
import torch

from oilbird.audit import greedy_reference
from oilbird.tree import DraftTree
from oilbird.errors import ModelError
from oilbird.skinny_gemm import isa, skinny_available
from oilbird.verifier import TreeVerifier, VerifierConfig

AVX512 = skinny_available()[0] and isa() in ("AVX512", "AMX")

PROMPT = [{"role": "user", "content": "List three colors of the rainbow."}]


@pytest.fixture(params=["plain", "fast"])
def model(request, smol):
    """The model as loaded (PyTorch's kernels) and the verifier's fast copy."""
    return smol.model if request.param == "plain" else smol.tree_model()


@pytest.fixture(scope="module")
def setup(smol):
    prompt = smol.encode_chat(PROMPT)
    greedy = greedy_reference(smol.model, prompt, 6, smol.stop_ids).output_ids
    return prompt, greedy


def sequential_last_hidden(model, ids):
    """Final-layer hidden state at the last position of a plain causal forward over `ids`."""
    with torch.inference_mode():
        out = model(input_ids=torch.tensor([ids]), output_hidden_states=True)
    return out.hidden_states[-1][0, -1], out.logits[0, -1]


def branchy_tree(anchor, greedy, wrong):
    """Greedy path g1->g2->g3 placed after wrong siblings, so compaction must move rows."""
    g1, g2, g3 = greedy[:3]
    tree = DraftTree.root(anchor)
    w1 = tree.add(0, wrong[0], "test")
    tree.add(w1, wrong[1], "test")
    n1 = tree.add(0, g1, "test")
    tree.add(n1, wrong[2], "test")
    n2 = tree.add(n1, g2, "test")
    tree.add(n2, g3, "test")
    return tree


def test_tree_forward_matches_sequential_forwards(smol, model, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(model, smol.stop_ids, VerifierConfig(top_k=4))
    state = verifier.prefill(prompt)
    tree = branchy_tree(prompt[-1], greedy, wrong=[100, 200, 300])
    ver = verifier.verify(state, tree, hidden_layer=-1)
    for node in range(len(tree)):
        ids = prompt + [tree.tokens[n] for n in tree.path_to(node)]
        hidden, logits = sequential_last_hidden(smol.model, ids)  # the reference: plain kernels
        assert torch.allclose(ver.hidden[node], hidden, atol=1e-3), f"node {node}"
        assert ver.argmax[node].item() == logits.argmax().item()
        assert ver.topk_ids[node].tolist() == logits.topk(4).indices.tolist()


@pytest.mark.skipif(not AVX512, reason="one attention kernel at every size on AVX-512 builds only (AVX2: two-pass, exact up to rounding)")
def test_on_the_fast_kernels_a_tree_node_has_the_bits_of_the_one_token_step_over_its_path(smol, setup):
    # Speculation then cannot change our own greedy output, near-ties included: the tree's
    # greedy nodes sit after wrong siblings (masked columns between them), the steps see their
    # path's keys contiguous.
    prompt, greedy = setup
    verifier = TreeVerifier(smol.tree_model(), smol.stop_ids, VerifierConfig(top_k=4))
    tree = branchy_tree(prompt[-1], greedy, wrong=[100, 200, 300])
    ver = verifier.verify(verifier.prefill(prompt), tree, hidden_layer=-1)
    state = verifier.prefill(prompt)
    for depth, node in enumerate([0] + tree.path_to(len(tree) - 1)):
        step = verifier.verify(state, DraftTree.root(state.anchor), hidden_layer=-1)
        assert torch.equal(step.hidden[0], ver.hidden[node]), f"depth {depth}"
        assert torch.equal(step.topk_logits[0], ver.topk_logits[node])
        if depth < 3:
            assert step.committed == [greedy[depth]]


def test_greedy_walk_bonus_and_compaction(smol, model, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(model, smol.stop_ids)
    state = verifier.prefill(prompt)
    ver = verifier.verify(state, branchy_tree(prompt[-1], greedy, wrong=[100, 200, 300]))
    assert ver.path == [3, 5, 6]  # g1, g2, g3 sit behind rejected siblings
    assert ver.committed == greedy[:4]  # three drafts plus the bonus
    assert state.length == len(prompt) + 3 and state.anchor == greedy[3]
    # The compacted cache must equal a fresh prefill of the committed sequence.
    fresh = verifier.prefill(prompt + greedy[:4])
    for ours, ref in zip(state.cache.layers, fresh.cache.layers):
        assert ours.keys.shape == ref.keys.shape
        assert torch.allclose(ours.keys, ref.keys, atol=1e-4)
        assert torch.allclose(ours.values, ref.values, atol=1e-4)
    # Decoding continues correctly from the compacted cache.
    ver2 = verifier.verify(state, DraftTree.chain(state.anchor, greedy[4:6], "test"))
    assert ver2.committed[:2] == greedy[4:6]


def test_root_only_tree_is_one_autoregressive_step(smol, model, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(model, smol.stop_ids)
    state = verifier.prefill(prompt)
    ver = verifier.verify(state, DraftTree.root(prompt[-1]))
    assert ver.path == [] and ver.committed == [greedy[0]] and state.length == len(prompt)


def test_stop_token_among_drafts_cuts_and_drops_bonus(smol, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(smol.model, frozenset({greedy[1]}))  # pretend g2 is a stop token
    state = verifier.prefill(prompt)
    ver = verifier.verify(state, DraftTree.chain(prompt[-1], greedy[:4], "test"))
    assert ver.committed == greedy[:2] and ver.finished


def test_bonus_stop_token_finishes(smol, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(smol.model, frozenset({greedy[2]}))
    state = verifier.prefill(prompt)
    ver = verifier.verify(state, DraftTree.chain(prompt[-1], greedy[:2] + [99], "test"))
    assert ver.committed == greedy[:3] and ver.finished


def test_tree_root_must_be_the_anchor(smol, setup):
    prompt, _ = setup
    verifier = TreeVerifier(smol.model, smol.stop_ids)
    state = verifier.prefill(prompt)
    with pytest.raises(ValueError, match="anchor"):
        verifier.verify(state, DraftTree.root(prompt[-1] + 1))


def test_models_that_cannot_honour_a_tree_mask_are_refused():
    from types import SimpleNamespace

    from oilbird.errors import ModelError
    from oilbird.verifier import check_tree_attention

    check_tree_attention(SimpleNamespace(_attn_implementation="sdpa",
                                         layer_types=["full_attention"] * 2))
    with pytest.raises(ModelError, match="flash_attention_2"):
        check_tree_attention(SimpleNamespace(_attn_implementation="flash_attention_2"))
    with pytest.raises(ModelError, match="sliding_attention"):
        check_tree_attention(SimpleNamespace(_attn_implementation="sdpa",
                                             layer_types=["full_attention", "sliding_attention"]))


def test_prefill_observation_matches_full_logits(smol, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(smol.model, smol.stop_ids, VerifierConfig(top_k=5, harvest_dtype="model"))
    state, obs = verifier.prefill_observed(prompt, chunk=7)  # odd chunk: exercise the seams
    with torch.inference_mode():
        logits = smol.model(input_ids=torch.tensor([prompt[:-1]])).logits[0]  # [P, V]
    assert obs.tokens == prompt[:-1] and state.length == len(prompt) - 1
    assert obs.topk_ids.tolist() == logits.topk(5).indices.tolist()
    assert obs.hidden.shape == (len(prompt) - 1, smol.model.config.hidden_size)
    # Decoding from the observed prefill is unchanged.
    ver = verifier.verify(state, DraftTree.root(prompt[-1]))
    assert ver.committed == [greedy[0]]


def test_only_the_asked_for_layer_is_exposed_and_the_prefill_top_k_is_optional(smol, model, setup):
    prompt, greedy = setup
    verifier = TreeVerifier(model, smol.stop_ids)
    state, obs = verifier.prefill_observed(prompt, topk=False, hidden_layer=0)
    assert obs.topk_ids.shape == (len(prompt) - 1, 0)
    embed = smol.model.get_input_embeddings()(torch.tensor(prompt[:-1]))  # [P, hidden]
    assert torch.allclose(obs.hidden, embed)  # index 0: the static input embedding
    ver = verifier.verify(state, DraftTree.chain(prompt[-1], greedy[:3], "test"))
    assert ver.hidden is None  # nobody asked: no hidden state is kept
    assert ver.committed == greedy[:4]
    ver = verifier.verify(state, DraftTree.root(state.anchor), hidden_layer=-1)
    assert ver.hidden.shape == (1, smol.model.config.hidden_size)
    with pytest.raises(ModelError, match="out of range"):
        verifier.verify(state, DraftTree.root(state.anchor), hidden_layer=99)


def test_a_bfloat16_harvest_finds_nearly_the_same_top_k(smol, setup):
    # The harvest is draft material only; in bfloat16 it may reorder near-ties, no more.
    prompt, _ = setup
    exact = TreeVerifier(smol.model, smol.stop_ids, VerifierConfig(top_k=5, harvest_dtype="model"))
    fast = TreeVerifier(smol.model, smol.stop_ids, VerifierConfig(top_k=5, harvest_dtype="bfloat16"))
    _, a = exact.prefill_observed(prompt)
    _, b = fast.prefill_observed(prompt)
    assert a.tokens == b.tokens and b.topk_logits.dtype == torch.float32
    assert (a.topk_ids[:, 0] == b.topk_ids[:, 0]).float().mean() >= 0.9
    overlap = sum(len(set(x) & set(y)) for x, y in zip(a.topk_ids.tolist(), b.topk_ids.tolist()))
    assert overlap >= 0.9 * a.topk_ids.numel()
    assert torch.allclose(a.topk_logits[:, 0], b.topk_logits[:, 0], atol=0.5)
    with pytest.raises(ValueError, match="harvest_dtype"):
        VerifierConfig(harvest_dtype="int8")
