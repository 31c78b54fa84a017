"""The verifier's LM heads (oilbird/lm_head.py, csrc/certified_topk.cpp): the top-k and argmax of
the model's logits; the certified head's logits from a bfloat16 copy of the weight, with top-k and
argmax equal to float32's, even where bfloat16 alone reorders them."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from oilbird.int8_head import int8_head_unavailable
from oilbird.lm_head import CertifiedHead, certified_head_unavailable, error_coefficient, top_k_and_argmax
from oilbird.errors import ModelError
from oilbird.skinny_gemm import kernels, skinny_available
from oilbird.verifier import TreeVerifier, VerifierConfig

SKINNY, WHY = skinny_available()
needs_kernels = pytest.mark.skipif(not SKINNY, reason=f"the kernels cannot run here: {WHY}")


def head_of(weight: torch.Tensor) -> CertifiedHead:
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    linear.weight.data.copy_(weight)
    return CertifiedHead(linear)


def float64_topk(hidden: torch.Tensor, weight: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact top-k: descending, ties by the lower id (a stable sort of the negated logits)."""
    logits = hidden.double() @ weight.double().T
    order = torch.sort(-logits, dim=-1, stable=True).indices[:, :k]
    return logits.gather(1, order), order


def test_top_k_and_argmax_agree_and_ties_take_the_lowest_id():
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 1.0, 2.0, 0.0]])  # row 0: ids 1 and 3 tie
    ids, values, argmax = top_k_and_argmax(logits, 3)
    assert argmax.tolist() == [1, 0] == logits.argmax(dim=-1).tolist()
    assert ids.shape == (2, 3) and values[:, 0].tolist() == [3.0, 5.0]
    assert ids[1].tolist() == [0, 2, 1]
    ids, _, argmax = top_k_and_argmax(logits, 1)
    assert ids.shape == (2, 1) and argmax.tolist() == [1, 0]


def test_the_error_coefficient_covers_bfloat16_rounding_and_float32_sums():
    assert 2.0 ** -8 < error_coefficient(576) < 1.02 * (2.0 ** -8 + 4 * 576 * 2.0 ** -24) + 1e-9
    assert error_coefficient(896) > error_coefficient(576)  # longer sums, larger bound
    assert error_coefficient(576, rounded_inputs=True) > 2 * 2.0 ** -8  # both sides rounded


@needs_kernels
@pytest.mark.parametrize("rows", [1, 3, 12, 13, 40])
def test_bfloat16_weights_are_widened_and_summed_in_float32(rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(300, 96, generator=g)  # 300: padded to a multiple of 16
    x = torch.randn(rows, 96, generator=g)
    packed = kernels().pack(torch.cat([weight, weight.new_zeros(4, 96)]).to(torch.bfloat16))
    ours = kernels().linear(x, packed, None)[:, :300]
    want = x.double() @ weight.to(torch.bfloat16).double().T  # the rounded weight, exact sums
    assert ours.dtype == torch.float32
    assert torch.allclose(ours.double(), want, atol=1e-4, rtol=1e-5)


@pytest.mark.skipif(not SKINNY or not kernels().bf16_dot_available(), reason="no AVX512_BF16 kernel here")
@pytest.mark.parametrize("rows", [1, 5, 12, 13, 40])
def test_bfloat16_dot_products_round_both_sides_and_sum_in_float32(rows):
    g = torch.Generator().manual_seed(rows)
    weight = torch.randn(320, 95, generator=g).to(torch.bfloat16)  # odd width: padded with a zero
    x = torch.randn(rows, 95, generator=g)
    ours = kernels().linear_pairs(x, kernels().pack_pairs(weight))
    want = x.to(torch.bfloat16).double() @ weight.double().T
    assert ours.dtype == torch.float32 and ours.shape == (rows, 320)
    assert torch.allclose(ours.double(), want, atol=1e-4, rtol=1e-5)


@needs_kernels
def test_a_near_tie_that_bfloat16_flips_is_certified_right():
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 32, generator=g) * 0.1
    hidden = torch.randn(5, 32, generator=g)
    # Token 40 is token 7 plus a nudge bfloat16 rounds away: the two tie in bfloat16, and the
    # bfloat16 argmax takes the lower id, 7; in float32 token 40 is larger by the nudge.
    weight[7] = (hidden[0] * 3).to(torch.bfloat16).float()
    weight[40] = weight[7] + 1e-4 * torch.sign(hidden[0]) * (weight[7].abs() < 1).float()
    head = head_of(weight)
    logits = head.logits(hidden)
    assert logits[0, 7] == logits[0, 40]  # bfloat16 cannot tell them apart
    assert logits[0].argmax().item() == 7
    values, ids, candidates = head.topk(hidden, logits, 3)
    assert ids[0, 0].item() == 40 and ids[0, 1].item() == 7
    assert torch.equal(ids, float64_topk(hidden, weight, 3)[1])
    assert candidates[0].item() >= 3  # both and more were computed again in float32


@needs_kernels
def test_exact_ties_take_the_lowest_id_and_clear_rows_need_no_recomputation():
    g = torch.Generator().manual_seed(1)
    weight = torch.randn(256, 48, generator=g) * 0.05
    hidden = torch.randn(4, 48, generator=g)
    weight[200] = hidden[1] / hidden[1].norm()  # a clear winner for row 1 ...
    weight[9] = weight[200]  # ... twice: the lower id wins
    weight[77] = hidden[2] * 0.2  # a clear winner for row 2, once
    head = head_of(weight)
    _, ids, candidates = head.topk(hidden, head.logits(hidden), 1)
    assert ids[1, 0].item() == 9
    assert ids[2, 0].item() == 77 and candidates[2].item() == 1
    values, ids, _ = head.topk(hidden, head.logits(hidden), 2)
    assert ids[1].tolist() == [9, 200] and values[1, 0] == values[1, 1]


@needs_kernels
def test_random_rows_agree_with_float64_and_nan_rows_do_not_crash():
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(4096, 64, generator=g) * 0.1
    hidden = torch.randn(500, 64, generator=g) * 3
    head = head_of(weight)
    logits = head.logits(hidden)
    values, ids, candidates = head.topk(hidden, logits, 10)
    want_values, want_ids = float64_topk(hidden, weight, 10)
    assert torch.equal(ids, want_ids)
    assert torch.allclose(values.double(), want_values, atol=1e-5)
    assert (candidates >= 10).all() and candidates.float().mean() < 40  # few beyond k, but some
    hidden[3] = float("nan")
    _, ids, candidates = head.topk(hidden, head.logits(hidden), 10)
    assert ((0 <= ids[3]) & (ids[3] < 4096)).all() and candidates[3].item() == 0


def tiny_llama(**overrides) -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=1, **overrides)
    return LlamaForCausalLM(config).eval()


@needs_kernels
def test_where_it_applies_and_why_not():
    assert certified_head_unavailable(tiny_llama()) is None
    assert "scales" in certified_head_unavailable(tiny_llama(logit_scale=2.0))
    assert "bfloat16" in certified_head_unavailable(tiny_llama().to(torch.bfloat16))
    gpt2 = tiny_llama()
    gpt2.config.model_type = "gpt2"  # a model type not known to apply its head unchanged
    assert "not one known" in certified_head_unavailable(gpt2)
    with pytest.raises(ModelError, match="head='model'"):
        TreeVerifier(tiny_llama(logit_scale=2.0), {0}, VerifierConfig(head="certified"))
    assert TreeVerifier(tiny_llama(logit_scale=2.0), {0}).head_kind == "model"  # 'auto' falls back
    with pytest.raises(ValueError, match="head must be"):
        VerifierConfig(head="bf16")
    with pytest.raises(ValueError, match="head_tiles must be >= 0"):
        VerifierConfig(head_tiles=-1)


@needs_kernels
def test_the_real_model_verifies_the_same_tree_with_either_head(smol):
    from oilbird.tree import DraftTree

    prompt = smol.encode_chat([{"role": "user", "content": "List three colors of the rainbow."}])
    model = smol.tree_model()
    results = {}
    heads = ("model", "certified", "int8") if int8_head_unavailable(model) is None else ("model", "certified")
    for head in heads:
        verifier = TreeVerifier(model, smol.stop_ids, VerifierConfig(head=head))
        assert verifier.head_kind == head
        state = verifier.prefill(prompt)
        tree = DraftTree.root(prompt[-1])
        for i, token in enumerate([1300, 25, 1303, 28, 30, 31, 2, 17, 18]):  # a bushy tree of 10 nodes
            tree.add(i // 3, token, "test")
        results[head] = verifier.verify(state, tree, hidden_layer=-1)
    model_head = results["model"]
    for head in heads[1:]:
        other = results[head]
        assert torch.equal(model_head.argmax, other.argmax)
        assert model_head.committed == other.committed and torch.equal(model_head.hidden, other.hidden)
        # drafters read the same top-k: float32's ids and values
        assert torch.equal(model_head.topk_ids, other.topk_ids)
        assert torch.allclose(model_head.topk_logits, other.topk_logits, atol=1e-4)


@needs_kernels
def test_auto_takes_the_int8_head_or_the_models_own_where_it_reads_the_gguf_blocks(smol):
    from oilbird.gguf_weights import BlockLinear
    from oilbird.kernels import ForwardConfig

    blocks, dense = smol.tree_model(), smol.tree_model(ForwardConfig(q4_rows=0))
    on_blocks = isinstance(blocks.get_output_embeddings(), BlockLinear)  # AVX-512 builds
    vnni = on_blocks and kernels().int8_head_available()
    assert TreeVerifier(blocks, smol.stop_ids).head_kind == ("int8" if vnni else "model" if on_blocks else "certified")
    assert TreeVerifier(dense, smol.stop_ids).head_kind == "certified"
    assert TreeVerifier(blocks, smol.stop_ids, VerifierConfig(head="certified")).head_kind == "certified"
