"""Our CPU kernels' top-k of logit rows: the same selection as torch.topk, ties to the lower id,
float32 and bfloat16 alike (oilbird/skinny_gemm.py, csrc/topk.cpp)."""

import pytest
import torch

from oilbird.skinny_gemm import skinny_available, topk

SKINNY, WHY = skinny_available()


def reference(x: torch.Tensor, k: int):
    """Descending by value, exact ties by the lower id: a stable sort of the negated row."""
    order = torch.sort(-x.float(), dim=-1, stable=True).indices[:, :k]
    return x.float().gather(1, order), order


@pytest.mark.skipif(not SKINNY, reason=f"the kernels cannot run here: {WHY}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab,k", [(49152, 10), (300, 2), (37, 37), (16, 1), (1000, 5)])
def test_topk_selects_like_a_stable_sort(dtype, vocab, k):
    g = torch.Generator().manual_seed(vocab + k)
    x = torch.randn(23, vocab, generator=g).to(dtype)
    x[3] = torch.randint(0, 4, (vocab,), generator=g).to(dtype)  # a row of many exact ties
    x[5, :] = -float("inf")
    x[5, vocab // 2] = 1.0  # one finite value among -inf
    values, ids = topk(x, k)
    want_values, want_ids = reference(x, k)
    assert values.dtype == torch.float32 and ids.dtype == torch.long and values.shape == (23, k)
    assert torch.equal(values, want_values) and torch.equal(ids, want_ids)
    assert torch.equal(ids[:, 0], x.float().argmax(dim=-1))  # top-1 is argmax's (lowest tied) id


def test_topk_falls_back_to_torch_where_the_kernel_does_not_apply():
    x = torch.randn(4, 50, dtype=torch.float64)
    values, ids = topk(x, 3)
    assert values.dtype == torch.float32
    assert torch.equal(ids, x.topk(3, dim=-1).indices)
    strided = torch.randn(50, 4).t()  # rows not contiguous: copied, same answer
    assert torch.equal(topk(strided, 3)[1], reference(strided, 3)[1])


def test_every_kernel_source_ships_in_the_package():
    """A wheel carries only the package-data globs: a header left out builds nowhere but here."""
    import fnmatch
    import tomllib
    from pathlib import Path

    import oilbird.skinny_gemm as sg

    root = Path(__file__).resolve().parents[1]
    globs = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["oilbird"]
    for path in [*sg.SOURCES, *sg.HEADERS]:
        rel = path.relative_to(Path(sg.__file__).parent).as_posix()
        assert any(fnmatch.fnmatch(rel, g) for g in globs), f"{rel} is not in package-data"
    assert set(sg.CSRC.iterdir()) == set(sg.SOURCES) | set(sg.HEADERS)  # nothing unlisted either


def test_a_cold_build_is_announced_and_a_built_library_is_not(tmp_path):
    """The first build takes minutes: the user is told where and why; later loads say nothing."""
    from oilbird.skinny_gemm import build_notice

    name = "oilbird_skinny_gemm_0123abcd"
    notice = build_notice(tmp_path, name)
    assert notice is not None and "compiling the CPU kernels" in notice and str(tmp_path) in notice
    (tmp_path / "skinny_gemm.o").touch()  # a half-done build's objects are not the library
    assert build_notice(tmp_path, name) is not None
    (tmp_path / f"{name}.so").touch()
    assert build_notice(tmp_path, name) is None


@pytest.mark.skipif(not SKINNY, reason=f"the CPU kernels cannot be built here: {WHY}")
def test_the_loaded_kernels_live_where_build_notice_looks():
    """After a load, the notice for this installation's build directory is silent."""
    from oilbird.skinny_gemm import build_directory, build_notice, source_key

    key = source_key()
    assert build_notice(build_directory(key), f"oilbird_skinny_gemm_{key}") is None
