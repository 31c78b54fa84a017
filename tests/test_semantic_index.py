"""The inverted-list index on hand-built keys (oilbird.semantic_index): training, lists, search."""

import pytest
import torch

from oilbird.semantic_index import ListIndex
from oilbird.semantic_keys import KeyMatrix, normalize


def clustered(n: int, clusters: int, dim: int = 32, seed: int = 0) -> torch.Tensor:
    """Unit keys around `clusters` random directions, as hidden states bunch by context."""
    g = torch.Generator().manual_seed(seed)
    centers = normalize(torch.randn(clusters, dim, generator=g))
    which = torch.randint(clusters, (n,), generator=g)
    return normalize(centers[which] + 0.3 * torch.randn(n, dim, generator=g) / dim ** 0.5)


def built(n: int, clusters: int, lists: int, probes: int, filed: int | None = None, seed: int = 0):
    """(keys as rows, the KeyMatrix, a ListIndex trained on it with `filed` rows filed: all by default)."""
    rows = clustered(n, clusters, seed=seed)
    keys = KeyMatrix(rows.shape[1], "cpu")
    keys.append(rows)
    index = ListIndex(lists=lists, probes=probes)
    index.train(keys)
    index.sync(keys, first_id=0, most=n if filed is None else filed)
    return rows, keys, index


def test_probing_every_list_is_exact_search():
    _, keys, index = built(2000, 12, lists=8, probes=8)
    g = torch.Generator().manual_seed(5)
    for _ in range(10):
        query = normalize(torch.randn(1, 32, generator=g))[0]
        sims, found = index.search(keys, query, 5, first_id=0, visible=2000)
        exact_sims, exact_rows = keys.top(query, 5, 0, 2000)
        assert found == exact_rows and sims == pytest.approx(exact_sims)


def test_few_probes_find_most_neighbors_of_clustered_keys_and_read_few_rows():
    rows, keys, index = built(20000, 64, lists=64, probes=4, seed=1)
    assert sum(index.count) == 20000 and index.high == 20000
    hits = 0
    for q in range(0, 20000, 400):  # queries: stored keys nudged
        query = normalize(rows[q] + 0.05 * torch.ones(32))
        _, found = index.search(keys, query, 8, first_id=0, visible=20000)
        _, exact = keys.top(query, 8, 0, 20000)
        hits += len(set(found) & set(exact))
    assert hits / (8 * 50) > 0.9  # recall@8
    assert max(index.count) < 20000 / 8  # a list is a small part of the store


def test_lists_hold_increasing_ids_and_forget_the_evicted():
    rows, keys, index = built(1000, 5, lists=4, probes=4, filed=300, seed=2)
    index.sync(keys, first_id=0, most=300)
    assert index.indexed_rows(0) == 600
    for lst in range(4):
        live = index.ids[lst][index.head[lst]:index.count[lst]]
        assert torch.all(live[1:] > live[:-1])
    keys.drop_front(250)  # the store evicts ids below 250: its row 0 is now id 250
    index.drop_below(250)
    assert index.indexed_rows(250) == 350
    sims, found = index.search(keys, rows[400], 3, first_id=250, visible=350)
    assert found[0] == 150 and all(0 <= r < 350 for r in found)


def test_the_kernel_gathers_the_lists_as_pytorch_does():
    rows, keys, index = built(3000, 6, lists=16, probes=5, filed=2500, seed=3)
    keys.append(rows[:40])  # exact duplicates of rows 0-39: ties, which go to the lower row
    index.sync(keys, first_id=0, most=600)
    keys.drop_front(100)  # ids below 100 evicted; row 0 is id 100
    index.drop_below(100)
    if keys.list_kernel() is None:
        pytest.skip("our kernels do not run on this CPU (the PyTorch path is the one tested above)")
    g = torch.Generator().manual_seed(9)
    queries = [rows[7], rows[2990]] + [normalize(torch.randn(1, 32, generator=g))[0] for _ in range(8)]
    for visible in (2940, 2000, 37):
        got = [index.search(keys, q, 6, first_id=100, visible=visible) for q in queries]
        want = [index.search(keys, q, 6, first_id=100, visible=visible, kernel=False) for q in queries]
        assert [found for _, found in got] == [found for _, found in want]
        assert all(all(0 <= r < visible for r in found) for _, found in got)
        assert [sims for sims, _ in got] == [sims for sims, _ in want]  # the same float32 sums


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="probes <= lists"):
        ListIndex(lists=4, probes=8)
