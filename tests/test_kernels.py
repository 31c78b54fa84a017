"""The verifier's fast copy of a model: shared weights, the skinny (or oneDNN) GEMM, tree
attention; the caller's model untouched; bad kernel choices refused with a clear message."""

import pytest
import torch

from oilbird.kernels import (ForwardConfig, PackedLinear, describe_kernels, onednn_available,
                             resolve_gemm, tree_model)
from oilbird.skinny_gemm import PairsLinear, SkinnyLinear, bf16_dot_ready, kernels, skinny_available
from oilbird.tree_attention import SKINNY_ATTENTION, TREE_ATTENTION

needs_onednn = pytest.mark.skipif(not onednn_available(), reason="this PyTorch build has no oneDNN")
SKINNY = skinny_available()[0]
Q4 = SKINNY and kernels().q4_available()  # SmolLM2's GGUF blocks read as they are (oilbird/gguf_weights.py)
# what 'auto' picks for SmolLM2 (CPU, float32)
PREFILL = "+prefill:bf16" if Q4 and kernels().amx_bf16_available() else ""  # ForwardConfig.prefill_kernel 'auto'
FAST = f"skinny{'+q4_1,q8_0<=8192' + PREFILL if Q4 else ''}+fused/{SKINNY_ATTENTION}" if SKINNY else f"onednn/{TREE_ATTENTION}"
FAST_LINEAR = SkinnyLinear if SKINNY else PackedLinear


LAYERS = [pytest.param(SkinnyLinear, marks=pytest.mark.skipif(not SKINNY, reason=f"no skinny GEMM here: {skinny_available()[1]}")),
          pytest.param(PackedLinear, marks=needs_onednn)]


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("rows", [1, 2, 5, 8, 12, 13, 16, 25, 64, 300])
@pytest.mark.parametrize("bias", [False, True])
def test_packed_layers_compute_the_linear(layer, rows, bias):
    # 300 outputs: not a multiple of 16 (the skinny kernel pads); 13+ rows: its tiled path
    g = torch.Generator().manual_seed(rows)
    linear = torch.nn.Linear(96, 300, bias=bias)
    x = torch.randn(1, rows, 96, generator=g)
    with torch.inference_mode():
        ours, ref = layer(linear)(x), linear(x)
    assert ours.shape == ref.shape == (1, rows, 300)
    assert torch.allclose(ours, ref, atol=1e-5, rtol=1e-4)
    with torch.inference_mode():  # a non-contiguous input is read right
        wide = torch.randn(rows, 192, generator=g)[:, ::2]
        assert torch.allclose(layer(linear)(wide), linear(wide), atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not SKINNY, reason=f"no skinny GEMM here: {skinny_available()[1]}")
@pytest.mark.parametrize("outputs", [192, 300, 576])  # 12 blocks of 16, 19 (padded), 36
def test_skinny_linear_gives_a_row_the_same_bits_whatever_shares_the_call(outputs):
    # The kernel picks its group width and tiles by the row count, the output count and the
    # threads; a row's sum must not change with any of them (a tree node = the one-token step).
    g = torch.Generator().manual_seed(outputs)
    layer = SkinnyLinear(torch.nn.Linear(576, outputs))
    x = torch.randn(40, 576, generator=g)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            torch.set_num_threads(1)
            reference = layer(x)  # [40, outputs]
            for n in (2, 3):
                torch.set_num_threads(n)
                assert torch.equal(layer(x), reference)
                for rows in range(1, 17):
                    assert torch.equal(layer(x[7:7 + rows]), reference[7:7 + rows])
    finally:
        torch.set_num_threads(threads)


def test_skinny_linear_refuses_what_it_cannot_run():
    if not SKINNY:
        with pytest.raises(ValueError, match="unavailable"):
            SkinnyLinear(torch.nn.Linear(16, 16))
        return
    with pytest.raises(ValueError, match="float32 only"):
        SkinnyLinear(torch.nn.Linear(16, 16).to(torch.bfloat16))
    with pytest.raises(ValueError, match="float16 on cpu"):
        resolve_gemm(ForwardConfig(gemm="skinny"), torch.device("cpu"), torch.float16)
    # bfloat16: our dot-product GEMM where the CPU has AVX512_BF16, else oneDNN
    bf16 = "skinny" if bf16_dot_ready()[0] else "onednn"
    assert resolve_gemm(ForwardConfig(gemm="auto"), torch.device("cpu"), torch.bfloat16) == bf16


BF16 = pytest.mark.skipif(not bf16_dot_ready()[0], reason=f"no AVX512_BF16 GEMM here: {bf16_dot_ready()[1]}")


@BF16
@pytest.mark.parametrize("bias", [False, True])
def test_pairs_linear_rounds_like_bfloat16_and_gives_each_row_the_same_bits(bias):
    g = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(97, 300, bias=bias).to(torch.bfloat16)  # odd inputs, padded outputs
    x = torch.randn(1, 64, 97, generator=g).to(torch.bfloat16)
    layer = PairsLinear(linear)
    with torch.inference_mode():
        ours, ref = layer(x), linear(x)
        exact = torch.nn.functional.linear(x.float(), linear.weight.float(),
                                           None if linear.bias is None else linear.bias.float())
    assert ours.dtype == torch.bfloat16 and ours.shape == (1, 64, 300)
    # float32 sums rounded once: within one bfloat16 rounding of the exact value, as PyTorch's
    assert torch.allclose(ours.float(), exact, rtol=2 ** -8, atol=1e-3)
    assert torch.allclose(ours.float(), ref.float(), rtol=2 ** -7, atol=2e-3)
    with torch.inference_mode():  # a row's bits do not depend on the rows beside it
        for rows in (1, 3, 13, 40):
            assert torch.equal(layer(x[:, :rows]), ours[:, :rows])
        assert torch.equal(layer(x[:, 50:51]), ours[:, 50:51])
        # the kernel takes the bfloat16 rows as they are or their float32 widening: the same bits
        rows = torch.nn.functional.pad(x[0], (0, 1))  # [64, 98]: the packed weight's even width
        assert torch.equal(kernels().linear_pairs(rows, layer.packed),
                           kernels().linear_pairs(rows.float(), layer.packed))
    with pytest.raises(ValueError, match="bfloat16 layers only"):
        PairsLinear(torch.nn.Linear(16, 16))


@needs_onednn
def test_tree_model_shares_weights_and_leaves_the_model_alone(smol):
    fast = smol.tree_model()
    assert fast is smol.tree_model()  # built once per config
    assert describe_kernels(fast) == FAST
    assert describe_kernels(smol.model) == "default/sdpa"  # the audit's reference is untouched
    # Where the GGUF blocks run (AVX-512), the head reads the file's Q8_0 blocks on our float32 kernel's bits.
    head = fast.lm_head.dense if Q4 else fast.lm_head
    assert type(smol.model.lm_head) is torch.nn.Linear and isinstance(head, FAST_LINEAR)
    ours = dict(fast.named_parameters())
    for name, param in smol.model.named_parameters():
        assert ours[name].data_ptr() == param.data_ptr(), name  # no second copy of the weights
    ids = torch.tensor([[1, 9690, 198, 2683, 359, 253]])
    with torch.inference_mode():
        a, b = smol.model(input_ids=ids).logits, fast(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-2) and torch.equal(a.argmax(-1), b.argmax(-1))


def test_nothing_to_change_returns_the_model_itself(smol):
    assert tree_model(smol.model, ForwardConfig(gemm="default", attention="sdpa")) is smol.model


def test_bad_choices_are_refused_with_what_to_do():
    with pytest.raises(ValueError, match="gemm must be one of"):
        ForwardConfig(gemm="mkl")
    with pytest.raises(ValueError, match="attention must be one of"):
        ForwardConfig(attention="flash")
    with pytest.raises(ValueError, match="dtype must be one of"):
        ForwardConfig(dtype="fp8")
    with pytest.raises(ValueError, match="device must be"):
        ForwardConfig(device="tpu")
    with pytest.raises(ValueError, match="gemm='default'"):
        resolve_gemm(ForwardConfig(gemm="onednn"), torch.device("cpu"), torch.float16)
    assert resolve_gemm(ForwardConfig(), torch.device("cuda"), torch.bfloat16) == "default"


def test_cuda_without_a_gpu_is_a_clear_error(tmp_path):
    from oilbird.errors import ModelError
    from oilbird.models import load_model

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ModelError, match="--device cpu"):
        load_model("smollm2-135m", device="cuda", cache_dir=tmp_path)


def test_attention_auto_takes_the_skinny_kernel_where_it_runs_and_says_why_not(smol):
    from types import SimpleNamespace

    from oilbird.kernels import resolve_attention

    assert resolve_attention(ForwardConfig(), smol.model) == ("skinny" if SKINNY else "tree")
    assert resolve_attention(ForwardConfig(attention="sdpa"), smol.model) == "sdpa"
    bf16 = torch.nn.Linear(4, 4).to(torch.bfloat16)  # bfloat16: the kernel where the bfloat16 GEMM runs
    bf16.config = SimpleNamespace(head_dim=64, hidden_size=576, num_attention_heads=9)
    assert resolve_attention(ForwardConfig(), bf16) == ("skinny" if bf16_dot_ready()[0] else "tree")
    half = torch.nn.Linear(4, 4).to(torch.float16)
    half.config = bf16.config
    assert resolve_attention(ForwardConfig(), half) == "tree"
    with pytest.raises(ValueError, match="attention='tree'"):
        resolve_attention(ForwardConfig(attention="skinny"), half)
    odd = torch.nn.Linear(4, 4)
    odd.config = SimpleNamespace(head_dim=80, hidden_size=640, num_attention_heads=8)
    assert resolve_attention(ForwardConfig(), odd) == "tree"
    with pytest.raises(ValueError, match="head_dim 80" if SKINNY else "attention='tree'"):
        resolve_attention(ForwardConfig(attention="skinny"), odd)


def test_an_impossible_kernel_choice_is_a_user_error_the_cli_prints():
    from oilbird.errors import OilbirdError

    with pytest.raises(OilbirdError, match="float32 or bfloat16.*Use gemm='auto'"):
        resolve_gemm(ForwardConfig(gemm="skinny"), torch.device("cpu"), torch.float16)
