"""Layers on the GGUF's own blocks: a kernel whose output equals the float32 kernel's on the
de-quantized weights bit for bit (4-bit, 5-bit and byte-plane layouts), the loader's row order,
refusals, and on the real model the same logits. The readers: tests/test_gguf_blocks.py."""

import numpy as np
import pytest
import torch

from oilbird.fused_layers import FusedMLP
from oilbird.gguf_blocks import BLOCK_READERS, dequantize, read_q5_0
from oilbird.gguf_weights import BlockLinear, row_order
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.skinny_gemm import SkinnyLinear, kernels, skinny_available

Q4 = skinny_available()[0] and kernels().q4_available()
needs_q4 = pytest.mark.skipif(not Q4, reason="the Q4_1 GEMM needs our kernels built for AVX-512")


def random_blocks(n: int, k: int, seed: int):
    """Random Q4_1 blocks of an [n, k] weight and the float32 weight the loader makes of them."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (n, k), generator=g, dtype=torch.uint8)
    d = (torch.rand(n, k // 32, generator=g) * 0.01).half()
    m = (-torch.rand(n, k // 32, generator=g) * 0.08).half()
    return q, d, m, dequantize(q, d, m)


def q5_blocks(n: int, k: int, seed: int):
    """Random Q5_0 blocks of an [n, k] weight in llama.cpp's bytes (gguf-py's quantizer), read
    back, and the float32 weight gguf-py's de-quantizer (transformers' loader) makes of them."""
    from gguf import GGMLQuantizationType, quants

    weight = np.random.default_rng(seed).standard_normal((n, k)).astype(np.float32) * 0.05
    raw = quants.quantize(weight, GGMLQuantizationType.Q5_0)  # [n, k / 32 * 22] uint8
    loaded = torch.from_numpy(quants.dequantize(raw, GGMLQuantizationType.Q5_0).astype(np.float32))
    return (*read_q5_0(raw), loaded)


def k_quant_blocks(kind: str, n: int, k: int, seed: int):
    """Random Q4_K / Q6_K / Q8_0 bytes of an [n, k] weight (finite float16 scales), read back, and
    gguf-py's de-quantized float32 weight."""
    from gguf import GGMLQuantizationType, quants

    from test_gguf_blocks import random_raw  # tests/ is on sys.path

    raw = random_raw(kind, n, k, seed)
    loaded = torch.from_numpy(quants.dequantize(raw, getattr(GGMLQuantizationType, kind)).astype(np.float32))
    return (*BLOCK_READERS[kind](raw), loaded)


def linear_of(weight: torch.Tensor) -> torch.nn.Linear:
    """A bias-free linear layer holding `weight` [out, in]."""
    linear = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    return linear


def test_row_order_finds_the_loaders_permutation_or_none():
    _, _, _, weight = random_blocks(48, 64, 0)
    order = torch.randperm(48, generator=torch.Generator().manual_seed(1))
    found = row_order(weight[order], weight)
    assert found is not None and torch.equal(weight[found], weight[order])
    assert torch.equal(row_order(weight, weight), torch.arange(48))
    other = weight.clone()
    other[5, 7] = torch.nextafter(other[5, 7], torch.tensor(1.0))  # one bit of one weight
    assert row_order(other, weight) is None


@needs_q4
@pytest.mark.parametrize("shape", [(576, 576), (192, 576), (1536, 576), (576, 1536), (48, 64)])
def test_the_q4_kernel_gives_the_float32_kernels_bits_at_every_row_count(shape):
    n, k = shape
    q, d, m, weight = random_blocks(n, k, n + k)
    packed, dense = kernels().pack_q4(q, d, m), kernels().pack(weight)
    bias = torch.randn(n)
    threads = torch.get_num_threads()
    try:
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            for rows in [*range(1, 21), 33, 64]:
                x = torch.randn(rows, k)
                assert torch.equal(kernels().linear_q4(x, packed, None), kernels().linear(x, dense, None)), (t, rows)
            x = torch.randn(7, k)
            assert torch.equal(kernels().linear_q4(x, packed, bias), kernels().linear(x, dense, bias))
    finally:
        torch.set_num_threads(threads)


@needs_q4
@pytest.mark.parametrize("shape", [(896, 896), (128, 896), (48, 64)])
def test_the_kernel_on_five_bit_blocks_gives_the_float32_kernels_bits_at_every_row_count(shape):
    n, k = shape
    q, d, m, weight = q5_blocks(n, k, n + k)
    linear = torch.nn.Linear(k, n)  # Qwen2.5's projections have a bias
    with torch.no_grad():
        linear.weight.copy_(weight)
    dense = SkinnyLinear(linear)
    layer = BlockLinear(dense, q, d, m, max_rows=64, block_type="Q5_0")
    assert layer.bits == 5 and layer.packed_q4.shape[-1] == 384 and "Q5_0" in repr(layer)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for t in (1, 2):
                torch.set_num_threads(t)
                for rows in [*range(1, 18), 33, 64]:  # one pass up to 16 rows, rebuilt tiles above
                    x = torch.randn(rows, k)
                    assert torch.equal(layer(x), dense(x)), (t, rows)
    finally:
        torch.set_num_threads(threads)


@needs_q4
@pytest.mark.parametrize("kind", ["Q4_K", "Q6_K", "Q8_0"])
def test_the_byte_plane_gives_the_float32_kernels_bits_at_every_row_count(kind):
    n, k = (896, 512) if kind != "Q8_0" else (128, 896)  # Qwen2.5's down and value projections' widths
    q, d, m, weight = k_quant_blocks(kind, n, k, 7)
    linear = torch.nn.Linear(k, n, bias=kind == "Q8_0")
    with torch.no_grad():
        linear.weight.copy_(weight)
    dense = SkinnyLinear(linear)
    layer = BlockLinear(dense, q, d, m, max_rows=64, block_type=kind)
    assert layer.bits == 8 and layer.packed_q4.shape == (n // 16, k // 16, 384)
    threads = torch.get_num_threads()
    try:
        with torch.inference_mode():
            for t in (1, 2):
                torch.set_num_threads(t)
                for rows in [*range(1, 18), 40]:
                    x = torch.randn(rows, k)
                    assert torch.equal(layer(x), dense(x)), (t, rows)
    finally:
        torch.set_num_threads(threads)
    with pytest.raises(RuntimeError, match="float32"):
        kernels().pack_q8(q, d.half(), m)


@needs_q4
def test_a_gated_mlp_fuses_only_projections_in_one_block_layout():
    q5, d5, m5, w5 = q5_blocks(64, 64, 1)
    q4, d4, m4, w4 = random_blocks(64, 64, 2)
    layers = []
    for w, q, d, m, kind in ((w5, q5, d5, m5, "Q5_0"), (w4, q4, d4, m4, "Q4_1")):
        linear = torch.nn.Linear(64, 64, bias=False)
        with torch.no_grad():
            linear.weight.copy_(w)
        layers.append(BlockLinear(SkinnyLinear(linear), q, d, m, max_rows=8, block_type=kind))
    mlp = torch.nn.Module()
    mlp.gate_proj, mlp.up_proj, mlp.down_proj, mlp.act_fn = layers[0], layers[1], layers[1], torch.nn.SiLU()
    with pytest.raises(ValueError, match="5- and 4-bit"):
        FusedMLP(mlp)


@needs_q4
def test_q4_linear_refuses_blocks_that_are_not_its_weight_and_bad_input():
    q, d, m, weight = random_blocks(32, 64, 3)
    linear = linear_of(weight)
    layer = BlockLinear(SkinnyLinear(linear), q, d, m, max_rows=4)
    x = torch.randn(3, 64)
    with torch.inference_mode():
        assert torch.equal(layer(x), SkinnyLinear(linear)(x))
        wide = torch.randn(5, 128)[:, ::2]  # a non-contiguous input is read right
        assert torch.equal(layer(wide), SkinnyLinear(linear)(wide.contiguous()))
    q2 = q.clone()
    q2[4, 10] ^= 1  # one nibble off
    with pytest.raises(ValueError, match="bit for bit"):
        BlockLinear(SkinnyLinear(linear), q2, d, m, max_rows=4)
    with pytest.raises(RuntimeError, match="4-bit"):
        kernels().pack_q4(q + 16, d, m)
    with pytest.raises(RuntimeError, match="multiple of 16"):
        kernels().pack_q4(q[:20], d[:20], m[:20])
    with pytest.raises(ValueError, match="q4_rows"):
        ForwardConfig(q4_rows=-1)


@needs_q4
def test_the_switch_sends_prefills_and_forwards_of_wide_rows_to_the_prefill_kernel():
    from oilbird.gguf_weights import PrefillSwitch

    q, d, m, weight = random_blocks(32, 64, 7)
    switch = PrefillSwitch(wide_rows=4)
    layer = BlockLinear(SkinnyLinear(linear_of(weight)), q, d, m, max_rows=64, switch=switch)
    calls = []  # which kernel ran, by rows: a recorder stands in for an AMX kernel (any host)
    layer._prefill = lambda x, packed, bias: calls.append(x.numel() // 64) or layer.kernel(x, packed, bias)
    with torch.inference_mode():
        for rows in (1, 3, 4, 9):
            layer(torch.randn(1, rows, 64))
        with switch.prefilling():
            layer(torch.randn(1, 2, 64))
    assert calls == [4, 9, 2]  # wide forwards and the prefill; the step and a 3-row tree keep the step's kernel
    off = BlockLinear(SkinnyLinear(linear_of(weight)), q, d, m, max_rows=64, switch=PrefillSwitch())
    off._prefill = lambda x, packed, bias: calls.append("off") or off.kernel(x, packed, bias)
    with torch.inference_mode():
        off(torch.randn(1, 40, 64))  # wide_rows 0: only prefills switch
    assert calls[-1] == 2


@needs_q4
def test_the_float32_copy_is_packed_only_when_a_forward_needs_it():
    q, d, m, weight = random_blocks(32, 64, 5)
    linear = torch.nn.Linear(64, 32)
    with torch.no_grad():
        linear.weight.copy_(weight)
    layer = BlockLinear(SkinnyLinear(linear), q, d, m, max_rows=4)
    with torch.inference_mode():
        small = layer(torch.randn(2, 4, 64))[0]  # [2, 4, 64]: 8 rows, above max_rows
        assert layer.dense._packed is not None and small.shape == (4, 32)
    layer = BlockLinear(SkinnyLinear(linear), q, d, m, max_rows=4)
    with torch.inference_mode():
        for rows in (1, 4):
            layer(torch.randn(1, rows, 64))
        assert layer.dense._packed is None  # every forward read the blocks: no float32 pack held
        x = torch.randn(1, 5, 64)
        assert torch.equal(layer(x), SkinnyLinear(linear)(x))  # 5 rows: the float32 kernel, packed now
        assert layer.dense._packed is not None


@needs_q4
def test_smollm2_reads_its_own_4_bit_weights_with_the_same_logits(smol):
    plain = smol.tree_model(ForwardConfig(q4_rows=0))
    q4 = smol.tree_model(ForwardConfig(q4_rows=8, prefill_kernel="same"))  # the step's kernel for every forward
    layers = [m for m in q4.modules() if isinstance(m, BlockLinear)]
    assert len(layers) == 7 * smol.model.config.num_hidden_layers + 1  # every decoder linear layer and the head
    assert describe_kernels(q4).startswith("skinny+q4_1,q8_0<=8+fused/") and "q4" not in describe_kernels(plain)
    assert q4.lm_head.weight is smol.model.lm_head.weight  # weights still shared
    ids = torch.tensor([smol.encode_text("def fibonacci(n):\n    \"\"\"Return the n-th number." * 3)])
    with torch.inference_mode():
        for n in (1, 3, 8, 9, 16):  # up to 8 rows: the 4-bit blocks; 9 and 16: the float32 kernel
            assert torch.equal(q4(input_ids=ids[:, :n]).logits, plain(input_ids=ids[:, :n]).logits), n
