"""The semantic store's key search (oilbird.semantic_keys.cosine_topk): our kernel and its fallback
against float32 scores computed here, over row ranges and listed rows, ties, and odd widths."""

import pytest
import torch

from oilbird import semantic_keys
from oilbird.semantic_keys import KeyMatrix, cosine_topk, normalize
from oilbird.skinny_gemm import skinny_available

KERNEL = skinny_available()[0]
PATHS = [pytest.param("kernel", marks=pytest.mark.skipif(not KERNEL, reason=f"no kernels here: {skinny_available()[1]}")),
         "fallback"]


@pytest.fixture
def path(request, monkeypatch):
    if request.param == "fallback":
        monkeypatch.setattr(semantic_keys, "_kernel", lambda: None)
    return request.param


def reference(keys: torch.Tensor, query: torch.Tensor, rows: list[int], k: int) -> list[int]:
    """The k best of `rows` by float32 score, ties to the earlier listed row."""
    scores = (keys[rows].float() @ query.float()).tolist()
    order = sorted(range(len(rows)), key=lambda i: (-scores[i], i))
    return order[:k]


@pytest.mark.parametrize("path", PATHS, indirect=True)
@pytest.mark.parametrize("dim", [576, 40, 7])  # whole registers, a partial register, less than one
def test_range_search_matches_float32_scores(path, dim):
    gen = torch.Generator().manual_seed(dim)
    keys = normalize(torch.randn(9000, dim, generator=gen)).half()  # [n, d]: more than one block of rows
    query = normalize(torch.randn(1, dim, generator=gen))[0]
    for start, stop, k in [(0, 9000, 8), (123, 8800, 5), (4000, 4003, 8), (17, 17, 3)]:
        values, rows = cosine_topk(keys, query, k, start, stop)
        expected = [start + i for i in reference(keys, query, list(range(start, stop)), k)]
        assert rows.tolist() == expected
        exact = keys[expected].float() @ query
        assert torch.allclose(values, exact, atol=1e-5)


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_listed_rows_return_positions_into_the_list(path):
    gen = torch.Generator().manual_seed(1)
    keys = normalize(torch.randn(300, 64, generator=gen)).half()
    query = keys[250].float()  # the best row is 250, at position 3 of the list below
    rows = torch.tensor([7, 19, 120, 250, 251, 299])
    values, positions = cosine_topk(keys, query, 4, rows=rows)
    assert positions.tolist() == reference(keys, query, rows.tolist(), 4)
    assert positions[0] == 3 and values[0] == pytest.approx(1.0, abs=2e-3)
    assert cosine_topk(keys, query, 4, rows=torch.tensor([], dtype=torch.long))[1].tolist() == []


@pytest.mark.parametrize("path", PATHS, indirect=True)
def test_exact_ties_keep_the_lower_row(path):
    base = normalize(torch.randn(1, 32, generator=torch.Generator().manual_seed(2))).half()
    keys = base.repeat(10_000, 1)  # [n, d]: every score equal, across the kernel's blocks of rows
    _, rows = cosine_topk(keys, base[0].float(), 3, 2, 10_000)
    if path == "kernel":
        assert rows.tolist() == [2, 3, 4]
    else:  # torch.topk leaves the order of exact ties unspecified; the rows are still within range
        assert all(2 <= r < 10_000 for r in rows.tolist())


@pytest.mark.skipif(not KERNEL, reason="needs the kernels")
def test_kernel_rejects_bad_rows():
    keys = torch.zeros(4, 16, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="out of range"):
        cosine_topk(keys, torch.ones(16), 2, rows=torch.tensor([1, 4]))
    with pytest.raises(RuntimeError, match="float16"):
        cosine_topk(keys.float(), torch.ones(16), 2)


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_key_matrix_top_agrees_with_its_scores(dtype):
    keys = KeyMatrix(24, "cpu", dtype)
    gen = torch.Generator().manual_seed(3)
    keys.append(normalize(torch.randn(2000, 24, generator=gen)))
    query = normalize(torch.randn(1, 24, generator=gen))[0]
    sims, rows = keys.top(query, 6, 100, 1900)
    scores = keys.scores(query, 1900, start=100)  # [1800]
    assert rows == (scores.topk(6).indices + 100).tolist()
    assert sims == pytest.approx(scores.topk(6).values.tolist(), abs=1e-5)
    assert keys.top(query, 6, 50, 50) == ([], [])
