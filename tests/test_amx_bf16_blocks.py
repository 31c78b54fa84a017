"""The 'bf16' kernel over GGUF blocks (csrc/amx_bf16_blocks.cpp, `ForwardConfig.block_kernel`): AMX
bfloat16 tiles over each input written as three exact bfloat16 parts. A row's bits never depend on
how many rows are beside it (the narrow path up to 16 rows and the wide one above it alike); the
result is the blocks' exact product to float32 precision; on the real model a forward's rows are
those of a shorter forward, bit for bit, and speculation stays token-identical to its own greedy
decoding. Runs where the CPU has AMX-BF16 (Intel Xeon since Sapphire Rapids); skipped elsewhere,
saying so."""

import pytest
import torch

from oilbird.decode import DecodeConfig, decode
from oilbird.drafters import make_drafter
from oilbird import gguf_weights
from oilbird.kernels import ForwardConfig, describe_kernels
from oilbird.skinny_gemm import kernels
from oilbird.verifier import TreeVerifier
from test_amx_blocks import LAYOUTS, inputs, layer, needs_tiles  # tests/ is on sys.path (the BlockLinear test is there)


@needs_tiles
@pytest.mark.parametrize("kind", LAYOUTS)
def test_a_rows_bits_do_not_depend_on_the_rows_beside_it(kind):
    packed, plane, center, exact = layer(kind)
    x = inputs(70)
    bf16 = kernels().linear_amx_bf16
    full = bf16(x, packed, None, plane, center)  # [70, 64]: the wide path (rows in 32s)
    for rows in (1, 2, 3, 5, 16, 17, 31, 33, 64):  # narrow up to 16 rows, wide above, partial tiles
        assert torch.equal(bf16(x[:rows], packed, None, plane, center), full[:rows]), rows
    for i in range(0, 70, 9):  # each row alone, and a window that starts mid-tile
        assert torch.equal(bf16(x[i:i + 1], packed, None, plane, center), full[i:i + 1]), i
        assert torch.equal(bf16(x[i:i + 20], packed, None, plane, center), full[i:i + 20]), i
    # The exact product of the blocks, to float32 precision: the error under 2^-20 of sum |x| |w|.
    error = (full.double() - x.double() @ exact.T).abs()
    assert (error <= 2.0 ** -20 * (x.double().abs() @ exact.abs().T)).all()


@needs_tiles
def test_the_bias_is_added_after_the_sum_and_bad_input_is_refused():
    packed, plane, center, _ = layer("Q4_1")
    x, bias = inputs(20), torch.randn(64)
    bf16 = kernels().linear_amx_bf16
    for rows in (3, 20):  # both paths
        assert torch.equal(bf16(x[:rows], packed, bias, plane, center), bf16(x[:rows], packed, None, plane, center) + bias)
    assert bf16(x[:3].view(3, 1, 256), packed, None, plane, center).shape == (3, 1, 64)  # any leading shape
    assert bf16(x[:0], packed, None, plane, center).shape == (0, 64)
    with pytest.raises(RuntimeError, match="features"):
        bf16(torch.randn(2, 128), packed, None, plane, center)
    with pytest.raises(RuntimeError, match="bias"):
        bf16(x, packed, torch.randn(63), plane, center)
    with pytest.raises(RuntimeError, match="pack_q4"):
        bf16(x, packed[:, :, :300].contiguous(), None, plane, center)
    with pytest.raises(RuntimeError, match="center"):
        bf16(x, packed, None, plane, 200)


@needs_tiles
def test_smollm2_on_the_bf16_kernel_gives_a_longer_forwards_rows_the_shorter_ones_bits(smol):
    tiles = smol.tree_model(ForwardConfig(block_kernel="bf16"))
    fma = smol.tree_model(ForwardConfig())
    assert describe_kernels(tiles).startswith("skinny+q4_1,q8_0<=8192:bf16+fused/")
    ids = torch.tensor([smol.encode_text("def fibonacci(n):\n    \"\"\"Return the n-th number." * 4)])
    with torch.inference_mode():
        long = tiles(input_ids=ids[:, :40]).logits  # [1, 40, V]: the wide path
        for n in (1, 2, 9, 16, 17, 33):  # narrow and wide: the same rows' bits
            assert torch.equal(tiles(input_ids=ids[:, :n]).logits, long[:, :n]), n
        # another rounding than the float32 kernel's, not another model
        assert torch.allclose(long, fma(input_ids=ids[:, :40]).logits, atol=1e-3)


@needs_tiles
@pytest.mark.parametrize("method", ["pld", "oilbird"])
def test_speculation_on_the_bf16_kernel_equals_its_greedy_decoding(smol, api_bank_prompts, method):
    verifier = TreeVerifier(smol.tree_model(ForwardConfig(block_kernel="bf16")), smol.stop_ids)
    greedy, drafter = make_drafter("ar"), make_drafter(method)
    forwards = tokens = 0
    for i, ids in enumerate(api_bank_prompts[:3]):
        config = DecodeConfig(max_new_tokens=32)
        want = decode(verifier, greedy, ids, config, max_context=smol.max_context, request_id=f"a{i}")
        got = decode(verifier, drafter, ids, config, max_context=smol.max_context, request_id=f"s{i}")
        assert got.output_ids == want.output_ids, i
        forwards, tokens = forwards + got.forwards, tokens + len(got.output_ids)
    assert tokens / forwards > 1.1  # drafts were accepted: the trees' rows were verified


@pytest.mark.parametrize("kernel, require", [("int8", gguf_weights.require_int8),
                                             ("bf16", gguf_weights.require_bf16_tiles)])
def test_an_amx_kernel_without_amx_is_refused_saying_what_to_use(monkeypatch, kernel, require):
    class NoTiles:  # what a build without AMX (or an OS that withholds the tiles) reports
        def amx_available(self):
            return False

        amx_bf16_available = amx_available

    monkeypatch.setattr(gguf_weights, "kernels", lambda: NoTiles())
    with pytest.raises(ValueError, match=f"'{kernel}' block kernel needs a CPU with AMX.*use block_kernel='fma'"):
        require()


@needs_tiles
def test_prefills_run_the_prefill_kernel_and_every_other_forward_the_steps(smol):
    mixed = smol.tree_model(ForwardConfig(prefill_kernel="bf16", wide_rows=0))
    tiles, fma = smol.tree_model(ForwardConfig(block_kernel="bf16")), smol.tree_model(ForwardConfig(prefill_kernel="same"))
    assert describe_kernels(mixed).startswith("skinny+q4_1,q8_0<=8192+prefill:bf16+fused/")
    assert describe_kernels(mixed, prefill=False) == describe_kernels(fma)  # a cost curve prices no prefill
    assert gguf_weights.prefill_switch(fma) is None  # no prefill kernel: nothing to switch
    switch = gguf_weights.prefill_switch(mixed)
    ids = torch.tensor([smol.encode_text("def fibonacci(n):\n    \"\"\"Return the n-th number." * 4)])[:, :40]
    with torch.inference_mode():
        with switch.prefilling():  # every block layer, the fused MLPs' gate and up included
            assert torch.equal(mixed(input_ids=ids).logits, tiles(input_ids=ids).logits)
        assert not switch.on
        assert torch.equal(mixed(input_ids=ids).logits, fma(input_ids=ids).logits)
    with pytest.raises(ValueError, match="prefill_kernel"):
        ForwardConfig(prefill_kernel="amx")
    auto = smol.tree_model(ForwardConfig(wide_rows=0))  # 'auto': the bfloat16 tiles for prefills where they run
    assert describe_kernels(auto) == describe_kernels(mixed)
    assert describe_kernels(smol.tree_model(ForwardConfig(block_kernel="bf16", prefill_kernel="auto"))) == describe_kernels(tiles)


@needs_tiles
def test_forwards_of_wide_rows_or_more_run_the_prefill_kernel(smol):
    wide = smol.tree_model(ForwardConfig(prefill_kernel="bf16", wide_rows=8))
    tiles, fma = smol.tree_model(ForwardConfig(block_kernel="bf16")), smol.tree_model(ForwardConfig(prefill_kernel="same"))
    # the curve prices trees, so its key names the wide rows' kernel; without a prefill kernel there are none
    assert describe_kernels(wide, prefill=False).startswith("skinny+q4_1,q8_0<=8192+rows>=8:bf16+fused/")
    assert describe_kernels(smol.tree_model(ForwardConfig(prefill_kernel="same", wide_rows=8))) == describe_kernels(fma)
    ids = torch.tensor([smol.encode_text("def fibonacci(n):\n    \"\"\"Return the n-th number." * 4)])
    with torch.inference_mode():
        for n in (1, 2, 7):  # one-token steps and small trees: the step's kernel
            assert torch.equal(wide(input_ids=ids[:, :n]).logits, fma(input_ids=ids[:, :n]).logits), n
        for n in (8, 17, 40):  # every block layer of a wide forward, the fused MLPs' gate and up included
            assert torch.equal(wide(input_ids=ids[:, :n]).logits, tiles(input_ids=ids[:, :n]).logits), n
    with pytest.raises(ValueError, match="wide_rows"):
        ForwardConfig(wide_rows=-1)


@needs_tiles
@pytest.mark.parametrize("method", ["pld", "oilbird"])
def test_speculation_after_a_prefill_on_another_kernel_equals_greedy_decoding(smol, api_bank_prompts, method):
    verifier = TreeVerifier(smol.tree_model(ForwardConfig(prefill_kernel="bf16", wide_rows=0)), smol.stop_ids)
    plain = TreeVerifier(smol.tree_model(ForwardConfig(prefill_kernel="same")), smol.stop_ids)
    greedy, drafter = make_drafter("ar"), make_drafter(method)
    for i, ids in enumerate(api_bank_prompts[:3]):
        config = DecodeConfig(max_new_tokens=32)
        want = decode(verifier, greedy, ids, config, max_context=smol.max_context, request_id=f"a{i}")
        got = decode(verifier, drafter, ids, config, max_context=smol.max_context, request_id=f"s{i}")
        assert got.output_ids == want.output_ids, i
        # the same model: its prompt's last bits are another kernel's, its answer the same here
        assert decode(plain, greedy, ids, config, max_context=smol.max_context).output_ids == want.output_ids, i


@needs_tiles
@pytest.mark.parametrize("method", ["pld", "oilbird"])
def test_speculation_with_wide_trees_on_the_prefill_kernel_equals_greedy_decoding(smol, api_bank_prompts, method):
    # Trees of 8 nodes or more round as the tiles do, steps as the float32 kernel does: the same
    # model, so greedy decoding's tokens, here as in every audited run (docs/RESULTS.md, stop 62).
    verifier = TreeVerifier(smol.tree_model(ForwardConfig(prefill_kernel="bf16", wide_rows=8)), smol.stop_ids)
    greedy, drafter = make_drafter("ar"), make_drafter(method)
    wide = 0
    for i, ids in enumerate(api_bank_prompts[:3]):
        config = DecodeConfig(max_new_tokens=32)
        want = decode(verifier, greedy, ids, config, max_context=smol.max_context, request_id=f"a{i}")
        got = decode(verifier, drafter, ids, config, max_context=smol.max_context, request_id=f"s{i}")
        assert got.output_ids == want.output_ids, i
        wide += sum(n >= 8 for n in got.nodes_per_forward)
    assert wide, "no tree reached 8 nodes: the prefill kernel verified nothing"


@needs_tiles
def test_a_prompt_that_holds_an_earlier_answer_is_prefilled_alike_by_every_method(smol, api_bank_prompts):
    from oilbird.prefix_cache import PrefixCache

    verifier = TreeVerifier(smol.tree_model(ForwardConfig(prefill_kernel="bf16")), smol.stop_ids)
    assert verifier.prefills_apart and not TreeVerifier(smol.tree_model(ForwardConfig(prefill_kernel="same")),
                                                        smol.stop_ids).prefills_apart
    follow_up = smol.encode_text(" Thanks. And the next one?")
    outputs, reused = {}, {}
    for method in ("ar", "oilbird"):  # Oilbird harvests its prefills and reuses only observed rows
        drafter, cache, outs = make_drafter(method), PrefixCache(), []
        prompt = api_bank_prompts[0]
        for turn in range(2):  # the second prompt: the first, its answer, a follow-up
            result = decode(verifier, drafter, prompt, DecodeConfig(max_new_tokens=24), max_context=smol.max_context,
                            request_id=f"{method}{turn}", prefix_cache=cache)
            outs.append(result.output_ids)
            reused[method] = result.prefix_reused
            prompt = prompt + result.output_ids + follow_up
        outputs[method] = outs
    assert outputs["ar"] == outputs["oilbird"]
    # both reused the first prompt's prefilled rows, neither the answer's decoded ones
    assert reused["ar"] == reused["oilbird"] == len(api_bank_prompts[0]) - 1
