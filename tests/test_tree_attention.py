"""Tree attention: grouped-query attention under a tree mask, without copying the cache, gives
exactly what transformers' copying SDPA path gives."""

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from oilbird.tree import DraftTree
from oilbird.tree_attention import tree_attention


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
