"""TreeCache: preallocated rows behave exactly like transformers' DynamicCache (pure tensors)."""

import torch
from transformers import DynamicCache

from oilbird.kv_cache import MIN_ROOM, TreeCache, compact_cache


def rows(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(1, 3, n, 8, generator=g), torch.randn(1, 3, n, 8, generator=g)  # [B, H_kv, n, D]


def fill(cache, sizes):
    for i, n in enumerate(sizes):
        for layer in range(2):
            cache.update(*rows(n, 10 * i + layer), layer)


def assert_same(ours, ref):
    assert ours.get_seq_length() == ref.get_seq_length()
    for a, b in zip(ours.layers, ref.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_appends_grow_past_the_first_buffer_and_match_a_dynamic_cache():
    ours, ref = TreeCache(2), DynamicCache()
    sizes = [5, 1, MIN_ROOM + 7, 3, 1]  # the third append outgrows the first allocation
    fill(ours, sizes)
    fill(ref, sizes)
    assert_same(ours, ref)
    assert ours.layers[0].keys.shape == (1, 3, sum(sizes), 8)
    assert ours.layers[0]._keys.shape[-2] > sum(sizes)  # spare rows: the next append copies nothing


def test_crop_then_append_overwrites_the_dropped_rows():
    ours, ref = TreeCache(2), DynamicCache()
    fill(ours, [6, 4])
    fill(ref, [6, 4])
    ours.crop(-3)
    ref.crop(-3)
    assert_same(ours, ref)
    fill(ours, [2])
    fill(ref, [2])
    assert_same(ours, ref)


def test_compaction_moves_the_accepted_rows_like_the_dynamic_cache():
    prefix, n_nodes, path = 4, 6, [2, 4, 5]  # rows behind rejected siblings must move down
    for path in ([2, 4, 5], [1, 2], []):
        ours, ref = TreeCache(2), DynamicCache()
        fill(ours, [prefix, n_nodes])
        fill(ref, [prefix, n_nodes])
        compact_cache(ours, prefix, n_nodes, path)
        compact_cache(ref, prefix, n_nodes, path)
        assert_same(ours, ref)
        assert ours.get_seq_length() == prefix + 1 + len(path)


def test_reset_empties_the_cache():
    cache = TreeCache(2)
    fill(cache, [3])
    cache.reset()
    assert cache.get_seq_length() == 0
    fill(cache, [2])
    assert cache.get_seq_length() == 2


def test_a_float32_cache_holds_bfloat16_rows_widened_exactly():
    # A bfloat16 model on the float32 attention kernel: rows widened once, when written.
    ours, ref = TreeCache(2, dtype=torch.float32), DynamicCache()
    for i, n in enumerate([5, 1, MIN_ROOM + 3]):
        for layer in range(2):
            k, v = (t.to(torch.bfloat16) for t in rows(n, 10 * i + layer))
            keys, values = ours.update(k, v, layer)
            ref.update(k, v, layer)
            assert keys.dtype == values.dtype == torch.float32
    for a, b in zip(ours.layers, ref.layers):
        assert torch.equal(a.keys, b.keys.float()) and torch.equal(a.values, b.values.float())
    total = ref.get_seq_length()
    compact_cache(ours, total - 3, 3, [2])  # a 3-node tree whose node 2 was accepted
    assert ours.get_seq_length() == total - 1
    assert torch.equal(ours.layers[0].keys[:, :, total - 2], ref.layers[0].keys[:, :, total - 1].float())
