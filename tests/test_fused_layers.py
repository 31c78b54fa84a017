"""Fused layers: the RMSNorm kernel against transformers' RMSNorm, row by row; the gated MLP over one
pack bit-identical to the model's; the swap on SmolLM2, what it refuses, and the one-query attention
without a mask."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaMLP, LlamaRMSNorm

from oilbird.fused_layers import FusedMLP, FusedRMSNorm, fuse_layers
from oilbird.gguf_weights import BlockLinear
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.skinny_gemm import SkinnyLinear, kernels, skinny_available

SKINNY = skinny_available()[0]
needs_kernels = pytest.mark.skipif(not SKINNY, reason=f"no CPU kernels here: {skinny_available()[1]}")
needs_q4 = pytest.mark.skipif(not (SKINNY and kernels().q4_available()),
                              reason="the Q4_1 GEMM needs our kernels built for AVX-512")


def llama_norm(d: int, seed: int) -> LlamaRMSNorm:
    norm = LlamaRMSNorm(d, eps=1e-5)
    norm.weight.data = torch.randn(d, generator=torch.Generator().manual_seed(seed))
    return norm


@needs_kernels
@pytest.mark.parametrize("d", [576, 896, 64, 100])  # SmolLM2, Qwen2.5-0.5B, a head dim, an odd tail
def test_rms_norm_kernel_matches_transformers_and_ignores_the_rows_beside(d):
    norm = llama_norm(d, d)
    fused = FusedRMSNorm(norm)
    g = torch.Generator().manual_seed(1)
    for rows in (1, 2, 16, 300):  # 300 x 896 runs on both threads
        x = torch.randn(1, rows, d, generator=g) * 3  # [1, rows, d]
        with torch.inference_mode():
            y, ref = fused(x), norm(x)
        assert y.shape == x.shape
        # the same formula; only the mean's rounding may differ (float64 sum against float32)
        assert torch.allclose(y, ref, rtol=2e-6, atol=1e-7), (rows, (y - ref).abs().max())
        # a row's bits do not depend on the rows beside it (a tree node gets a one-token step's bits)
        alone = torch.cat([fused(x[:, i: i + 1]) for i in range(rows)], dim=1)
        assert torch.equal(y, alone), rows
    strided = torch.randn(4, 2 * d, generator=g)[:, ::2]  # not contiguous
    assert torch.equal(fused(strided), fused(strided.contiguous()))


@needs_kernels
def test_rms_norm_kernel_refuses_bad_input():
    fused = FusedRMSNorm(llama_norm(64, 0))
    with pytest.raises(RuntimeError, match="float32"):
        fused(torch.randn(2, 64, dtype=torch.float64))
    with pytest.raises(RuntimeError, match="weight"):
        kernels().rms_norm(torch.randn(2, 64), torch.randn(32), 1e-5)
    with pytest.raises(ValueError, match="float32 weight"):
        FusedRMSNorm(LlamaRMSNorm(64).to(torch.bfloat16))


def tiny_llama() -> LlamaForCausalLM:
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=32)
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@needs_kernels
def test_fused_mlp_on_the_float32_kernel_is_bit_identical_and_shares_its_pack():
    model = tiny_llama()
    mlp = model.model.layers[0].mlp
    for name in ("gate_proj", "up_proj", "down_proj"):
        mlp.set_submodule(name, SkinnyLinear(mlp.get_submodule(name)))
    fused = FusedMLP(mlp)
    gate_pack, up_pack = mlp.gate_proj.packed, mlp.up_proj.packed
    assert gate_pack.data_ptr() == fused.packed.data_ptr()  # views of the one pack, no copy
    assert up_pack.data_ptr() == fused.packed[10].data_ptr()  # 160 / 16 = 10 blocks of the gate
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        for rows in (1, 3, 16, 65):
            x = torch.randn(1, rows, 64, generator=g)
            assert torch.equal(fused(x), mlp(x)), rows


@needs_kernels
def test_fused_mlp_refuses_pairs_it_cannot_join():
    model = tiny_llama()
    mlp = model.model.layers[0].mlp
    with pytest.raises(ValueError, match="our kernels"):
        FusedMLP(mlp)  # plain nn.Linear
    mlp.gate_proj = SkinnyLinear(mlp.gate_proj)
    with pytest.raises(ValueError, match="our kernels"):
        FusedMLP(mlp)  # one on our kernel, one not


class GemmaStyleNorm(torch.nn.Module):
    """Gemma's form, (1 + weight): under a known class name, fuse_layers must find that it differs."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(d))
        self.variance_epsilon = 1e-6

    def forward(self, x):
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return (1.0 + self.weight) * x


OtherForm = type("LlamaRMSNorm", (GemmaStyleNorm,), {})  # the name fuse_layers looks for


@needs_kernels
def test_fuse_layers_keeps_a_module_whose_outputs_differ():
    model = tiny_llama()
    model.model.layers[0].input_layernorm = OtherForm(64)
    for name, module in list(model.named_modules()):
        if type(module) is torch.nn.Linear:
            model.set_submodule(name, SkinnyLinear(module))
    kept = fuse_layers(model)
    assert list(kept) == ["model.layers.0.input_layernorm"] and "differ" in kept["model.layers.0.input_layernorm"]
    assert isinstance(model.model.layers[1].input_layernorm, FusedRMSNorm)
    assert all(isinstance(layer.mlp, FusedMLP) for layer in model.model.layers)


@needs_q4
def test_smollm2_fused_forward_gives_the_same_tokens(smol):
    fused = smol.tree_model(ForwardConfig())
    plain = smol.tree_model(ForwardConfig(fused=False))
    norms = [m for m in fused.modules() if isinstance(m, FusedRMSNorm)]
    mlps = [m for m in fused.modules() if isinstance(m, FusedMLP)]
    layers = smol.model.config.num_hidden_layers
    assert len(norms) == 2 * layers + 1 and len(mlps) == layers
    assert isinstance(mlps[0].gate_proj, BlockLinear)  # the GGUF's blocks, joined
    assert not any(isinstance(m, (FusedRMSNorm, FusedMLP)) for m in plain.modules())
    assert describe_kernels(fused).endswith("+fused/oilbird_skinny") and "fused" not in describe_kernels(plain)
    assert fused.model.norm.weight is smol.model.model.norm.weight  # weights still shared
    ids = torch.tensor([smol.encode_text("def fibonacci(n):\n    \"\"\"Return the n-th number." * 3)])
    with torch.inference_mode():
        for n in (1, 8, ids.shape[1]):
            a, b = fused(input_ids=ids[:, :n]).logits, plain(input_ids=ids[:, :n]).logits
            assert torch.equal(a.argmax(-1), b.argmax(-1)), n
            assert torch.allclose(a, b, rtol=0, atol=1e-3), (n, (a - b).abs().max())


@needs_kernels
def test_one_query_without_a_mask_attends_every_key_as_with_a_zero_mask():
    g = torch.Generator().manual_seed(3)
    for heads, kv in ((9, 3), (14, 2)):  # SmolLM2's groups (two-pass kernel), Qwen2.5's (lanes)
        q = torch.randn(1, heads, 1, 64, generator=g)
        k, v = torch.randn(1, kv, 300, 64, generator=g), torch.randn(1, kv, 300, 64, generator=g)
        zeros = torch.zeros(1, 1, 1, 300)
        assert torch.equal(kernels().tree_attention(q, k, v, None, 0.125),
                           kernels().tree_attention(q, k, v, zeros, 0.125))


@needs_kernels
def test_linear_kernels_take_any_leading_shape():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(32, 64, generator=g)
    x = torch.randn(2, 3, 64, generator=g)
    packed = kernels().pack(w)
    assert torch.equal(kernels().linear(x, packed, None), kernels().linear(x.reshape(6, 64), packed, None).reshape(2, 3, 32))
    with pytest.raises(RuntimeError, match="features"):
        kernels().linear(torch.randn(2, 63), packed, None)
