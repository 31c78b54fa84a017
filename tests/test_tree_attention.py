"""Tree attention: grouped-query attention under a tree mask, without copying the cache, gives
exactly what transformers' copying SDPA path gives; the skinny kernel gives it up to rounding."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from oilbird.tree import DraftTree
from oilbird.skinny_gemm import kernels, skinny_available
from oilbird.tree_attention import INVARIANT_KERNEL, attention_kernel, skinny_tree_attention, tree_attention


class Attn(torch.nn.Module):
    def __init__(self, groups):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


@pytest.mark.parametrize("kv_heads,groups,cached", [(3, 3, 40), (2, 7, 100), (4, 1, 10)])
def test_masked_gqa_equals_the_copying_path(kv_heads, groups, cached):
    g = torch.Generator().manual_seed(kv_heads * groups)
    tree = DraftTree.root(1)
    a = tree.add(0, 2, "t")
    tree.add(0, 3, "t")
    tree.add(a, 4, "t")
    n = len(tree)
    query = torch.randn(1, kv_heads * groups, n, 16, generator=g)  # [B, H_q, N, D]
    key = torch.randn(1, kv_heads, cached + n, 16, generator=g)  # [B, H_kv, S, D]
    value = torch.randn(1, kv_heads, cached + n, 16, generator=g)
    mask = tree.attention_mask(cached, torch.float32)  # [1, 1, N, S]
    module = Attn(groups)
    ours, _ = tree_attention(module, query, key, value, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert ours.shape == ref.shape == (1, n, kv_heads * groups, 16)
    assert torch.equal(ours, ref)


def test_unmasked_and_single_token_forwards_are_transformers_own():
    g = torch.Generator().manual_seed(0)
    module = Attn(3)
    for n, mask in ((1, None), (5, None)):
        query = torch.randn(1, 9, n, 16, generator=g)
        key, value = torch.randn(1, 3, 20, 16, generator=g), torch.randn(1, 3, 20, 16, generator=g)
        ours, _ = tree_attention(module, query, key, value, mask)
        ref, _ = sdpa_attention_forward(module, query, key, value, mask)
        assert torch.equal(ours, ref)


SKINNY, WHY = skinny_available()


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("kv_heads,groups,cached,dim", [(3, 3, 40, 64), (2, 7, 100, 64), (4, 1, 10, 128),
                                                        (3, 3, 512, 64), (1, 2, 0, 64)])
def test_the_skinny_kernel_equals_the_copying_path_up_to_rounding(kv_heads, groups, cached, dim):
    # cached + nodes not a multiple of 16 (a partial key block), a query tile spanning two heads
    g = torch.Generator().manual_seed(kv_heads * groups + cached)
    tree = DraftTree.root(1)
    a = tree.add(0, 2, "t")
    tree.add(0, 3, "t")
    b = tree.add(a, 4, "t")
    tree.add_chain(b, [5, 6, 7], "t")
    n, s = len(tree), cached + len(tree)
    query = torch.randn(1, n, kv_heads * groups, dim, generator=g).transpose(1, 2)  # [B, H_q, N, D], strided
    room = torch.randn(2, 1, kv_heads, s + 9, dim, generator=g)  # a preallocated cache with spare rows
    key, value = room[0][:, :, :s], room[1][:, :, :s]  # [B, H_kv, S, D], views
    mask = tree.attention_mask(cached, torch.float32)  # [1, 1, N, S]
    module = Attn(groups)
    ours, _ = skinny_tree_attention(module, query, key, value, mask, scaling=dim ** -0.5)
    ref, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=dim ** -0.5)
    assert ours.shape == ref.shape == (1, n, kv_heads * groups, dim)
    assert torch.allclose(ours, ref, atol=2e-6, rtol=1e-5)
    bool_mask = mask == 0  # True = attend: the same attention
    assert torch.allclose(skinny_tree_attention(module, query, key, value, bool_mask, scaling=dim ** -0.5)[0],
                          ref, atol=2e-6, rtol=1e-5)


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("cached", [37, 512])
def test_bfloat16_gives_each_node_the_bits_of_a_one_token_step_over_its_path(cached):
    # bfloat16 ties often, so speculation is lossless only if a tree node's attention is
    # bit-identical to the one-token step that would compute it: the path's keys contiguous,
    # no mask. One kernel at every row count, masked keys adding exact zeros, gives that.
    g = torch.Generator().manual_seed(cached)
    tree = DraftTree.root(1)
    a = tree.add(0, 2, "t")
    b = tree.add(0, 3, "t")
    c = tree.add_chain(a, [4, 5, 6], "t")
    tree.add_chain(b, [7, 8], "t")
    tree.add(c, 9, "t")
    n, s, dim = len(tree), cached + len(tree), 64
    bf16 = torch.bfloat16
    query = torch.randn(1, 9, n, dim, generator=g).to(bf16)  # [B, H_q, N, D]
    key = torch.randn(1, 3, s, dim, generator=g).to(bf16)  # [B, H_kv, S, D]
    value = torch.randn(1, 3, s, dim, generator=g).to(bf16)
    module = Attn(3)
    full, _ = skinny_tree_attention(module, query, key, value, tree.attention_mask(cached, bf16))
    assert full.dtype == bf16 and full.shape == (1, n, 9, dim)
    # Checked on the kernel's float32 output, before the rounding to bfloat16 hides most differences.
    q32, k32, v32 = query.float(), key.float(), value.float()
    tree_out = kernels().tree_attention(q32, k32, v32, tree.attention_mask(cached, torch.float32),
                                        dim ** -0.5, INVARIANT_KERNEL)  # [1, N, H_q, D]
    assert torch.equal(tree_out.to(bf16), full)
    ancestors = tree.ancestor_matrix("cpu")  # [N, N], row n: n and its ancestors
    for node in range(n):
        cols = list(range(cached)) + [cached + j for j in range(n) if ancestors[node, j]]
        one = kernels().tree_attention(q32[:, :, node:node + 1].contiguous(), k32[:, :, cols].contiguous(),
                                       v32[:, :, cols].contiguous(), None, dim ** -0.5, INVARIANT_KERNEL)
        assert torch.equal(one[0, 0], tree_out[0, node]), node
    ref, _ = sdpa_attention_forward(module, query.float(), key.float(), value.float(),
                                    tree.attention_mask(cached, torch.float32), scaling=dim ** -0.5)
    assert torch.allclose(full.float(), ref, atol=1e-2, rtol=2 ** -7)  # one bfloat16 rounding


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("nodes", [2, 3, 5, 6, 8, 11])
def test_a_node_has_its_one_token_bits_whatever_the_tiles_of_its_tree(nodes):
    # 3 query heads a group: a one-token step's 3 rows fill part of one tile; a tree's rows fill
    # tiles and leave from 1 to all of a tile's lanes to its last one, beside other nodes' rows.
    g = torch.Generator().manual_seed(nodes)
    tree = DraftTree.root(1)
    for n in range(1, nodes):
        tree.add((n - 1) // 2, n + 1, "t")  # a binary tree: branches and chains
    cached, dim = 45, 64
    s = cached + nodes
    query = torch.randn(1, 9, nodes, dim, generator=g)  # [B, H_q, N, D]
    key, value = torch.randn(2, 1, 3, s, dim, generator=g)  # [B, H_kv, S, D] each
    tree_out = kernels().tree_attention(query, key, value, tree.attention_mask(cached, torch.float32),
                                        dim ** -0.5, INVARIANT_KERNEL)  # [1, N, H_q, D]
    ancestors = tree.ancestor_matrix("cpu")  # [N, N]
    for node in range(nodes):
        cols = list(range(cached)) + [cached + j for j in range(nodes) if ancestors[node, j]]
        one = kernels().tree_attention(query[:, :, node:node + 1].contiguous(), key[:, :, cols].contiguous(),
                                       value[:, :, cols].contiguous(), None, dim ** -0.5, INVARIANT_KERNEL)
        assert torch.equal(one[0, 0], tree_out[0, node]), node


def test_the_skinny_kernel_leaves_what_it_does_not_cover_to_sdpa():
    g = torch.Generator().manual_seed(3)
    module = Attn(3)
    query = torch.randn(1, 9, 4, 16, generator=g)  # head_dim 16: not the kernel's
    key, value = torch.randn(1, 3, 20, 16, generator=g), torch.randn(1, 3, 20, 16, generator=g)
    mask = torch.zeros(1, 1, 4, 20)
    ours, _ = skinny_tree_attention(module, query, key, value, mask)
    assert torch.equal(ours, tree_attention(module, query, key, value, mask)[0])


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("kernel", ["two-pass", "lanes"])
@pytest.mark.parametrize("kv_heads,groups,nodes,dim", [(2, 7, 40, 64), (3, 3, 64, 64), (1, 2, 33, 128),
                                                       (3, 3, 1, 64), (3, 3, 6, 64)])
def test_every_kernel_is_exact_on_trees_of_any_size(kernel, kv_heads, groups, nodes, dim):
    """The C++ kernels, called directly: one node to large trees, row tiles that do not divide them."""
    from oilbird.skinny_gemm import kernels

    g = torch.Generator().manual_seed(nodes)
    tree = DraftTree.root(1)
    tree.add_chain(0, list(range(2, nodes // 2 + 1)), "t")
    while len(tree) < nodes:
        tree.add(len(tree) // 3, len(tree) + 100, "t")  # side branches
    cached, n = 70, len(tree)
    query = torch.randn(1, kv_heads * groups, n, dim, generator=g)
    key, value = torch.randn(2, 1, kv_heads, cached + n, dim, generator=g)
    mask = tree.attention_mask(cached, torch.float32)
    ours = kernels().tree_attention(query, key, value, mask, dim ** -0.5, kernel)
    ref, _ = sdpa_attention_forward(Attn(groups), query, key, value, mask, scaling=dim ** -0.5)
    assert torch.allclose(ours, ref, atol=2e-6, rtol=1e-5)


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("kernel", ["two-pass", "lanes"])
def test_every_kernel_honors_a_mask_that_hides_cached_keys(kernel):
    """A masked column inside the cache (a stale row), not only among the tree's own: the lanes
    kernel adds the mask from the first column any row hides, wherever that is."""
    from oilbird.skinny_gemm import kernels

    g = torch.Generator().manual_seed(11)
    cached, n = 50, 8
    query = torch.randn(1, 9, n, 64, generator=g)
    key, value = torch.randn(2, 1, 3, cached + n, 64, generator=g)
    mask = DraftTree.chain(1, list(range(2, n + 1)), "t").attention_mask(cached, torch.float32)
    mask[..., 7] = torch.finfo(torch.float32).min  # every row
    mask[..., 3, 20] = torch.finfo(torch.float32).min  # one row
    ours = kernels().tree_attention(query, key, value, mask, 0.125, kernel)
    ref, _ = sdpa_attention_forward(Attn(3), query, key, value, mask, scaling=0.125)
    assert torch.allclose(ours, ref, atol=2e-6, rtol=1e-5)
    unmasked = kernels().tree_attention(query, key, value, torch.zeros_like(mask), 0.125, kernel)
    assert not torch.allclose(ours[:, :1], unmasked[:, :1], atol=1e-3)  # the stale row mattered


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
def test_an_unknown_kernel_name_is_refused():
    from oilbird.skinny_gemm import kernels

    q, k, v = torch.randn(3, 1, 2, 1, 64)
    with pytest.raises(RuntimeError, match="unknown kernel 'flash'"):
        kernels().tree_attention(q, k, v, None, 0.125, "flash")


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
def test_one_token_steps_and_the_prefill_go_to_the_kernel():
    g = torch.Generator().manual_seed(5)
    module = Attn(3)
    key, value = torch.randn(2, 1, 3, 83, 64, generator=g)
    step = torch.randn(1, 9, 1, 64, generator=g)  # one token, no mask: attends every cached key
    ours, _ = skinny_tree_attention(module, step, key, value, None)
    ref, _ = sdpa_attention_forward(module, step, key, value, None)
    assert not torch.equal(ours, ref)  # summed in another order: the kernel ran
    assert torch.allclose(ours, ref, atol=2e-6, rtol=1e-5)
    prefill = torch.randn(1, 9, 83, 64, generator=g)  # no mask over many tokens means causal
    ours, _ = skinny_tree_attention(module, prefill, key, value, None)
    ref, _ = sdpa_attention_forward(module, prefill, key, value, None)
    assert not torch.equal(ours, ref)
    assert torch.allclose(ours, ref, atol=2e-6, rtol=1e-5)
    # A prompt whose keys and values outgrow its kernel's CAUSAL_MAX_KV_BYTES per head goes to
    # SDPA, exactly (8193 keys on an AVX-512 build, whose prefills run the lanes kernel; 769 on AVX2).
    keys = past_causal_limit()
    long_key, long_value = torch.randn(2, 1, 3, keys, 64, generator=g)
    long_prefill = torch.randn(1, 9, keys, 64, generator=g)
    ours, _ = skinny_tree_attention(module, long_prefill, long_key, long_value, None)
    assert torch.equal(ours, sdpa_attention_forward(module, long_prefill, long_key, long_value, None)[0])


def past_causal_limit(head_dim: int = 64) -> int:
    """The fewest keys whose causal forward leaves the kernel's causal mode here."""
    from oilbird.tree_attention import CAUSAL_MAX_KV_BYTES, attention_kernel

    return CAUSAL_MAX_KV_BYTES[attention_kernel()] // (2 * head_dim * 4) + 1


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
def test_each_kernel_has_its_causal_limit():
    """A prefill's keys fit the causal mode up to its kernel's limit: the lanes kernel (every
    forward of an AVX-512 build) runs 8192 keys at head_dim 64, the two-pass kernel (AVX2) 768."""
    from oilbird.skinny_gemm import isa
    from oilbird.tree_attention import attention_kernel, causal_mode_fits

    lanes = isa() in ("AVX512", "AMX")
    assert attention_kernel() == ("lanes" if lanes else "two-pass")  # at every row count
    keys = 8192 if lanes else 768
    assert causal_mode_fits(keys, 64) and not causal_mode_fits(keys + 1, 64)
    assert causal_mode_fits(4096, 64) == lanes and causal_mode_fits(2048, 128) == lanes
    assert causal_mode_fits(8192, 64) == lanes and not causal_mode_fits(8193, 64)


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("dim", [64, 128])
@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (14, 2), (4, 4)])
@pytest.mark.parametrize("cached,nodes", [(0, 1), (0, 2), (0, 37), (0, 130), (5, 3), (61, 64), (200, 17)])
@pytest.mark.parametrize("kernel", ["two-pass", "lanes"])
def test_causal_attention_over_a_cached_prefix_matches_sdpa_with_its_causal_mask(kernel, dim, heads, kv_heads,
                                                                                 cached, nodes):
    """Query n attends keys [0, cached + n]: SDPA with the same rule spelled as a mask. Sizes
    cover one-row tiles, tiles crossing heads, and key counts that are not multiples of 4 or 16."""
    from oilbird.skinny_gemm import kernels

    g = torch.Generator().manual_seed(cached * 1000 + nodes)
    query = torch.randn(1, heads, nodes, dim, generator=g)
    key, value = torch.randn(2, 1, kv_heads, cached + nodes, dim, generator=g)
    allowed = torch.ones(nodes, cached + nodes, dtype=torch.bool).tril(cached)  # [N, S]
    ref = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed,
                                                           enable_gqa=True).transpose(1, 2)
    ours = kernels().tree_attention(query, key, value, None, dim ** -0.5, kernel, causal=True)
    assert torch.allclose(ours, ref, atol=3e-6, rtol=1e-5), (ours - ref).abs().max()


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
def test_causal_attention_refuses_a_mask_and_fewer_keys_than_queries():
    from oilbird.skinny_gemm import kernels

    q, k, v = torch.randn(3, 1, 2, 4, 64)
    with pytest.raises(RuntimeError, match="causal attention takes no mask"):
        kernels().tree_attention(q, k, v, torch.zeros(1, 1, 4, 4), 0.125, causal=True)
    with pytest.raises(RuntimeError, match="S >= N keys"):
        kernels().tree_attention(q, k[:, :, :3], v[:, :, :3], None, 0.125, "lanes", causal=True)


def test_the_skinny_mask_builder_leaves_out_only_the_plain_causal_mask():
    """`prefix_causal_mask` returns None exactly where the mask would be plain causal (one
    sequence, no padding, the forward's tokens the last keys) and the keys fit the kernel's causal
    mode; elsewhere it is SDPA's builder."""
    from types import SimpleNamespace

    from transformers.masking_utils import sdpa_mask

    from oilbird.tree_attention import prefix_causal_mask

    config = SimpleNamespace(head_dim=64)  # 768 keys fit either kernel's CAUSAL_MAX_KV_BYTES at head_dim 64
    too_many = 8193  # past either kernel's limit at head_dim 64
    assert prefix_causal_mask(1, 300, 353, q_offset=53, config=config) is None  # over 53 cached rows
    assert prefix_causal_mask(1, 30, 83, q_offset=53, config=config) is None
    assert prefix_causal_mask(1, 30, 30, attention_mask=torch.ones(1, 30, dtype=torch.bool), config=config) is None
    padded = torch.ones(1, 353, dtype=torch.bool)
    padded[0, :3] = False
    for args, kwargs in (((1, 300, 353), {"q_offset": 53, "attention_mask": padded}),
                         ((2, 300, 353), {"q_offset": 53}),
                         ((1, 300, 360), {"q_offset": 53}),
                         ((1, 100, too_many), {"q_offset": too_many - 100})):  # too many keys
        ours = prefix_causal_mask(*args, **kwargs, config=config)
        assert ours is not None and torch.equal(ours, sdpa_mask(*args, **kwargs))
    assert torch.equal(prefix_causal_mask(1, 300, 353, q_offset=53),  # no config: SDPA's, to be safe
                       sdpa_mask(1, 300, 353, q_offset=53))


@pytest.mark.skipif(not SKINNY, reason=f"the skinny kernels cannot run here: {WHY}")
@pytest.mark.parametrize("cached,nodes", [(53, 30), (700, 100), (None, 100)])
def test_an_unmasked_prefill_over_a_cached_prefix_is_causal_lower_right(cached, nodes):
    """No mask over N < S keys: query n sees keys [0, S - N + n], on the kernel's causal mode (53
    cached; 700 too on an AVX-512 build, past the two-pass kernel's limit on AVX2) and, past its
    kernel's CAUSAL_MAX_KV_BYTES (None: as many cached as that takes), on the masked path with the
    mask spelled out."""
    cached = past_causal_limit() - nodes if cached is None else cached
    g = torch.Generator().manual_seed(cached)
    module = Attn(3)
    query = torch.randn(1, 9, nodes, 64, generator=g)
    key, value = torch.randn(2, 1, 3, cached + nodes, 64, generator=g)
    allowed = torch.ones(nodes, cached + nodes, dtype=torch.bool).tril(cached)  # [N, S]
    ref = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=allowed,
                                                           enable_gqa=True).transpose(1, 2)
    ours, _ = skinny_tree_attention(module, query, key, value, None)
    assert torch.allclose(ours, ref, atol=3e-6, rtol=1e-5), (ours - ref).abs().max()
