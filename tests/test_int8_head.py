"""The int8 LM head (oilbird/int8_head.py, csrc/int8_head.cpp): its logits within their stated bound
and the same bits for a row at any row count, Q8_0 blocks read back from the byte plane, the
float32 top-k recovered exactly, the head chosen where it applies and refused where not, and on
the real model the same top-k as the model's own head and the same greedy output."""

import pytest
import torch

from oilbird.errors import ModelError
from oilbird.gguf_weights import BlockLinear
from oilbird.int8_head import Int8Head, choose_head, int8_head_unavailable, q8_0_blocks
from oilbird.kernels import ForwardConfig
from oilbird.lm_head import top_k_and_argmax
from oilbird.skinny_gemm import SkinnyLinear, kernels, skinny_available

from test_gguf_weights import k_quant_blocks  # tests/ is on sys.path

VNNI = skinny_available()[0] and kernels().q4_available() and kernels().int8_head_available()
needs_vnni = pytest.mark.skipif(not VNNI, reason="the int8 head needs our kernels built with AVX512-VNNI")
TILES = VNNI and kernels().int8_head_tiles_available()
needs_tiles = pytest.mark.skipif(not TILES, reason="the int8 head's tiles path needs AMX-INT8 (Xeon since Sapphire Rapids)")


def q8_0_head(vocab: int, hidden: int, seed: int) -> BlockLinear:
    """A head on random Q8_0 blocks (llama.cpp's bytes), as the loader builds the presets' heads."""
    q, d, m, weight = k_quant_blocks("Q8_0", vocab, hidden, seed)
    linear = torch.nn.Linear(hidden, vocab, bias=False)
    with torch.no_grad():
        linear.weight.copy_(weight)
    return BlockLinear(SkinnyLinear(linear), q, d, m, max_rows=64, block_type="Q8_0")


def hidden_rows(rows: int, hidden: int, seed: int) -> torch.Tensor:
    """Hidden states with a few large channels, as final norms leave them."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, hidden, generator=g)
    x[:, :: hidden // 4] *= 20
    return x


@needs_vnni
def test_the_plane_gives_back_the_q8_0_blocks_and_refuses_other_planes():
    head = q8_0_head(64, 96, 0)
    q, d = q8_0_blocks(head)
    assert q.dtype == torch.uint8 and q.shape == (64, 96) and d.shape == (64, 3)
    rebuilt = d.repeat_interleave(32, dim=1) * (q.float() - 128)
    assert torch.equal(rebuilt, head.weight.detach())
    q6, d6, m6, w6 = k_quant_blocks("Q6_K", 64, 256, 1)
    linear = torch.nn.Linear(256, 64, bias=False)
    with torch.no_grad():
        linear.weight.copy_(w6)
    with pytest.raises(ValueError, match="Q8_0 blocks, not Q6_K"):
        q8_0_blocks(BlockLinear(SkinnyLinear(linear), q6, d6, m6, max_rows=8, block_type="Q6_K"))


@needs_vnni
def test_the_logits_stay_within_their_bound_and_a_row_has_the_same_bits_at_any_row_count():
    head = q8_0_head(160, 192, 2)
    int8 = Int8Head(head)
    x = hidden_rows(13, 192, 3)
    logits, bracket = kernels().int8_head_logits(x, int8.packed)  # [13, 160], [13]
    exact = x.double() @ head.weight.detach().double().T
    bound = bracket.double()[:, None] * int8.norms.double()[None, :]
    assert ((logits.double() - exact).abs() <= bound).all()
    assert (logits.double() - exact).abs().max() > 1e-4  # the rounding is real: the bound is not idle
    for rows in (1, 5, 8, 9):  # passes of other sizes: 13 rows run as 7 + 6, 9 as 5 + 4, 8 as one
        part, part_bracket = kernels().int8_head_logits(x[:rows].contiguous(), int8.packed)
        assert torch.equal(part, logits[:rows]) and torch.equal(part_bracket, bracket[:rows])


@needs_tiles
def test_the_tiles_give_the_vnni_sums_bits_at_every_row_count_and_block_parity():
    # 7 blocks of 16 tokens: the last runs alone (the tiles take blocks in pairs); 5 groups: the
    # ring of three stored groups wraps; rows past 16 take a second row tile.
    head = q8_0_head(112, 160, 8)
    int8 = Int8Head(head)
    x = hidden_rows(40, 160, 9)
    for rows in (1, 2, 3, 15, 16, 17, 33, 40):
        part = x[:rows].contiguous()
        u_vnni, b_vnni = kernels().int8_head_logits(part, int8.packed, "vnni")
        u_tiles, b_tiles = kernels().int8_head_logits(part, int8.packed, "tiles")
        assert torch.equal(u_tiles, u_vnni) and torch.equal(b_tiles, b_vnni), rows
    with pytest.raises(RuntimeError, match="unknown kernel 'amx'"):
        kernels().int8_head_logits(x, int8.packed, "amx")


@needs_vnni
def test_the_head_picks_the_tiles_from_its_row_count_where_they_run(monkeypatch):
    head = q8_0_head(64, 96, 10)
    calls = []
    module = kernels()

    class Recorder:  # stands in for the module: records the kernel each call asks for
        def __getattr__(self, name):
            return getattr(module, name)

        def int8_head_logits(self, x, packed, kernel):
            calls.append((len(x), kernel))
            return module.int8_head_logits(x, packed, "vnni")

    import oilbird.int8_head as int8_head_module
    monkeypatch.setattr(int8_head_module, "kernels", lambda: Recorder())
    monkeypatch.setattr(int8_head_module, "tiles_run", lambda: True)
    int8 = Int8Head(head, tiles_from=4)
    for rows in (1, 3, 4, 9):
        int8.greedy(hidden_rows(rows, 96, 11), 4)
    assert calls == [(1, "vnni"), (3, "vnni"), (4, "tiles"), (9, "tiles")]
    calls.clear()
    Int8Head(head, tiles_from=0).greedy(hidden_rows(9, 96, 11), 4)
    assert calls == [(9, "vnni")]
    monkeypatch.setattr(int8_head_module, "tiles_run", lambda: False)  # no AMX here: never asked for
    assert Int8Head(head, tiles_from=4).tiles_from == 0


@needs_vnni
@pytest.mark.parametrize("rows", [1, 7, 20])
def test_the_top_k_is_float32s_even_where_the_rounded_logits_reorder_it(rows):
    head = q8_0_head(320, 256, 4)
    int8 = Int8Head(head)
    x = hidden_rows(rows, 256, 5)
    logits, values, ids = int8.greedy(x, 10)
    want_ids, want_values, _ = top_k_and_argmax(head(x), 10)  # the float32 kernel's top-k
    assert torch.equal(ids, want_ids)
    assert torch.allclose(values, want_values, rtol=0, atol=1e-4)
    approx_ids, _, _ = top_k_and_argmax(logits, 10)
    reordered = not torch.equal(approx_ids, want_ids)
    assert int8.candidates >= 10 * rows and (reordered or int8.candidates > 10 * rows)


@needs_vnni
def test_rows_with_non_finite_inputs_keep_their_own_order_without_a_bound():
    head = q8_0_head(48, 64, 6)
    x = hidden_rows(2, 64, 7)
    x[1, 3] = float("nan")
    _, bracket = kernels().int8_head_logits(x, Int8Head(head).packed)
    assert bracket[0].isfinite() and bracket[1].isnan()
    _, _, ids = Int8Head(head).greedy(x, 4)  # no bound for row 1: it keeps u's order, no crash
    assert ids.shape == (2, 4)


@needs_vnni
def test_the_real_models_int8_head_gives_its_own_heads_top_k(smol):
    model = smol.tree_model(ForwardConfig())
    assert int8_head_unavailable(model) is None and choose_head(model, "auto") == "int8"
    head = model.get_output_embeddings()
    prompt = torch.tensor([smol.encode_chat([{"role": "user", "content": "List three prime numbers."}])])
    with torch.inference_mode():
        final = model.get_decoder()(input_ids=prompt).last_hidden_state[0]  # [P, 576]
        int8 = Int8Head(head)
        for rows in (final[:1], final):
            _, values, ids = int8.greedy(rows, 10)
            want_ids, want_values, _ = top_k_and_argmax(head(rows), 10)
            assert torch.equal(ids, want_ids)
            assert torch.allclose(values, want_values, rtol=0, atol=1e-4)


@pytest.mark.skipif(not skinny_available()[0], reason="no kernels here: every head but the model's is refused earlier")
def test_the_int8_head_is_refused_where_the_head_is_not_q8_0_blocks(smol):
    model = smol.tree_model(ForwardConfig(q4_rows=0))  # float32 layers everywhere, the head too
    assert "Q8_0" in int8_head_unavailable(model)
    assert choose_head(model, "auto") in ("certified", "model")
    with pytest.raises(ModelError, match="int8 LM head cannot serve this model.*head='auto'"):
        choose_head(model, "int8")
