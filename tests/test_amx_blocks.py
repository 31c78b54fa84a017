"""The 'int8' kernel over GGUF blocks (csrc/amx_blocks.cpp, `ForwardConfig.block_kernel`): AMX
tiles and VNNI dot products give the same bits (and, with the 'bf16' kernel's, a `BlockLinear` on
either AMX kernel); a row's bits never depend on how many rows are
beside it; the result is the blocks' exact product to float32 precision; and on the real model a
forward's rows are those of a shorter forward, bit for bit. Runs where the CPU has AMX and
AVX512-VNNI (Intel Xeon since Sapphire Rapids); skipped elsewhere, saying so."""

import pytest
import torch

from oilbird.gguf_weights import BlockLinear, int8_center
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.skinny_gemm import kernels, skinny_available
from test_gguf_weights import k_quant_blocks, linear_of, q5_blocks, random_blocks  # tests/ is on sys.path

AMX = skinny_available()[0] and kernels().amx_available()
needs_amx = pytest.mark.skipif(not AMX, reason="the 'int8' block kernel needs AMX and AVX512-VNNI "
                               "(Intel Xeon since Sapphire Rapids) and an OS that grants AMX's tiles")
BF16_TILES = AMX and kernels().amx_bf16_available()
needs_tiles = pytest.mark.skipif(not BF16_TILES, reason="the 'bf16' block kernel needs AMX-BF16 and AVX512_BF16 "
                                 "(Intel Xeon since Sapphire Rapids) and an OS that grants AMX's tiles")

LAYOUTS = ["Q4_1", "Q5_0", "Q8_0", "Q6_K", "Q4_K"]


def layer(kind: str):
    """(packed blocks, byte plane?, the int8 kernel's centre, the exact weight in float64) of a random
    [64, 256] layer of GGUF type `kind`."""
    if kind == "Q4_1":
        q, d, m, _ = random_blocks(64, 256, 3)
    elif kind == "Q5_0":
        q, d, m, _ = q5_blocks(64, 256, 4)
    else:
        q, d, m, _ = k_quant_blocks(kind, 64, 256, 5)
    plane = d.dtype == torch.float32
    group = 16 if plane else 32
    exact = d.double().repeat_interleave(group, 1) * q.double() + m.double().repeat_interleave(group, 1)  # [64, 256]
    if plane:
        return kernels().pack_q8(q, d, m), True, int8_center(q, d, m), exact
    return kernels().pack_q4(q, d, m, 5 if int(q.max()) > 15 else 4), False, 16 if int(q.max()) > 15 else 8, exact


def inputs(rows: int, seed: int = 0) -> torch.Tensor:
    """[rows, 256] inputs spread over orders of magnitude, with zeros and one all-zero group."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 256, generator=g) * torch.exp(2 * torch.randn(rows, 256, generator=g))
    x[:, 5] = 0.0
    x[0, 32:64] = 0.0
    return x


@needs_amx
@pytest.mark.parametrize("kind", LAYOUTS)
def test_tiles_and_dot_products_give_the_same_bits_at_every_row_count(kind):
    packed, plane, center, exact = layer(kind)
    x = inputs(40)
    amx = kernels().linear_amx
    tiles = amx(x, packed, None, plane, center, 0)  # [40, 64]
    assert torch.equal(amx(x, packed, None, plane, center, 64), tiles)  # every row on dot products
    for rows in (1, 2, 3, 4, 5, 8, 16, 17, 33):  # 1: dot products, more: tiles (4-row and 16-row paths)
        assert torch.equal(amx(x[:rows], packed, None, plane, center, 1), tiles[:rows]), rows
    for i in range(0, 40, 7):  # each row alone
        assert torch.equal(amx(x[i:i + 1], packed, None, plane, center, 1), tiles[i:i + 1]), i
    # The exact product of the blocks, to float32 precision: the error under 2^-20 of sum |x| |w|.
    error = (tiles.double() - x.double() @ exact.T).abs()
    assert (error <= 2.0 ** -20 * (x.double().abs() @ exact.abs().T)).all()


@needs_amx
def test_the_bias_is_added_after_the_sum_and_bad_input_is_refused():
    packed, plane, center, _ = layer("Q4_1")
    x, bias = inputs(3), torch.randn(64)
    amx = kernels().linear_amx
    assert torch.equal(amx(x, packed, bias, plane, center, 1), amx(x, packed, None, plane, center, 1) + bias)
    assert amx(x.view(3, 1, 256), packed, None, plane, center, 1).shape == (3, 1, 64)  # any leading shape
    with pytest.raises(RuntimeError, match="features"):
        amx(torch.randn(2, 128), packed, None, plane, center, 1)
    with pytest.raises(RuntimeError, match="bias"):
        amx(x, packed, torch.randn(63), plane, center, 1)
    with pytest.raises(RuntimeError, match="packed"):
        amx(x, packed[:, :, :300], None, plane, center, 1)


def test_the_block_kernel_is_checked_by_name():
    with pytest.raises(ValueError, match="block_kernel"):
        ForwardConfig(block_kernel="amx")


@pytest.mark.parametrize("kernel", [pytest.param("int8", marks=needs_amx), pytest.param("bf16", marks=needs_tiles)])
def test_a_block_layer_on_an_amx_kernel_keeps_its_weight_and_names_its_kernel(kernel):
    from oilbird.skinny_gemm import SkinnyLinear

    q, d, m, weight = random_blocks(32, 64, 9)
    dense = linear_of(weight)
    block = BlockLinear(SkinnyLinear(dense), q, d, m, max_rows=64, kernel=kernel)
    x = inputs(40)[:, :64].contiguous()  # every path: one row, a few, 16-row tiles, more
    assert f"{kernel} kernel" in repr(block)
    assert torch.allclose(block(x), dense(x), rtol=1e-5, atol=1e-5)
    assert torch.equal(block(x[2:3]), block(x)[2:3])
    assert torch.equal(block(x[:5]), block(x)[:5])
    with pytest.raises(ValueError, match="block kernel"):
        BlockLinear(SkinnyLinear(dense), q, d, m, max_rows=8, kernel="fast")


@needs_amx
def test_smollm2_on_the_int8_kernel_gives_a_longer_forwards_rows_the_shorter_ones_bits(smol):
    int8 = smol.tree_model(ForwardConfig(block_kernel="int8", prefill_kernel="same"))
    fma = smol.tree_model(ForwardConfig())
    assert describe_kernels(int8).startswith("skinny+q4_1,q8_0<=8192:int8+fused/")
    ids = torch.tensor([smol.encode_text("def fibonacci(n):\n    \"\"\"Return the n-th number." * 3)])
    with torch.inference_mode():
        long = int8(input_ids=ids[:, :24]).logits  # [1, 24, V]
        for n in (1, 2, 5, 9, 16):  # dot products, 4-row tiles, 16-row tiles: the same rows' bits
            assert torch.equal(int8(input_ids=ids[:, :n]).logits, long[:, :n]), n
        # another rounding than the float32 kernel's, not another model
        assert torch.allclose(long, fma(input_ids=ids[:, :24]).logits, atol=1e-3)
