"""The keys of the semantic memory: unit vectors in a growable matrix, searched exactly.

Contract (pure data structures; `oilbird.semantic_store` builds the tenant stores on them):
- `normalize`: L2-normalized float32 rows; the store keys and queries by cosine.
- `KeyMatrix`: rows appended in order, held as float16 or int8 with a per-row scale; `top` is the
  cosine top-k over a row range, `scores` every score of a range; `drop_front` forgets the oldest rows.
- `cosine_topk`: the top-k of a query over float16 key rows (a range, or listed rows): on a CPU
  our kernel (csrc/key_search.cpp: the keys widened in registers, float32 sums, one pass, ties to
  the lower row), else float32 scores and `torch.topk` on the CPU, a float16 matmul on a GPU.
The approximate index for large stores is `oilbird.semantic_index.ListIndex`.
"""

from __future__ import annotations

import torch

from oilbird.errors import ConfigError

KEY_DTYPES = ("float16", "int8")
_FALLBACK_CHUNK = 8192
"""Rows widened to float32 at once by the CPU fallback: a bounded temporary, whatever the store."""


def _kernel():
    """Our compiled kernels when they run here, else None (they build on the first call)."""
    from oilbird.skinny_gemm import kernels, skinny_available  # not at import: a build is slow

    return kernels() if skinny_available()[0] else None


def _float32_scores(keys: torch.Tensor, query: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """Scores of float16 rows [start, stop) as float32 sums, widened a chunk at a time. Returns [stop - start]."""
    return torch.cat([keys[s:min(stop, s + _FALLBACK_CHUNK)].float() @ query
                      for s in range(start, stop, _FALLBACK_CHUNK)])


def cosine_topk(keys: torch.Tensor, query: torch.Tensor, k: int, start: int = 0, stop: int | None = None,
                rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best rows of float16 `keys` by dot product with the unit `query`.

    Args:
        keys: [n, d] float16 unit rows.
        query: [d] unit vector (any float dtype).
        k: most rows returned.
        start, stop: the row range searched (stop None: to the end); ignored when `rows` is given.
        rows: [m] int64 row indices to search instead of a range.

    Returns:
        (scores [k'] float32, positions [k']) descending, k' = min(k, rows searched); a position is
        a row index for a range and an index into `rows` otherwise. On a CPU each score is the
        float32 sum of the float16 key times the float32 query, and exact ties keep the lower
        position first; on a GPU the scores come from a float16 matmul.
    """
    stop = keys.shape[0] if stop is None else stop
    count = len(rows) if rows is not None else stop - start
    if k <= 0 or count <= 0:
        return torch.empty(0), torch.empty(0, dtype=torch.long)
    if keys.device.type == "cpu":
        kernel, q = _kernel(), query.float()
        if kernel is not None:
            if rows is not None:
                return kernel.key_topk_rows(keys, q, rows, k)
            return kernel.key_topk(keys, q, start, stop, k)
        # [count]: listed rows are few (the rejected pool's matches for one token), a range may be the store
        scores = keys[rows].float() @ q if rows is not None else _float32_scores(keys, q, start, stop)
    else:
        picked = keys[rows] if rows is not None else keys[start:stop]  # [count, d]
        scores = (picked @ query.to(keys.device, torch.float16)).float()  # [count]
    top = scores.topk(min(k, count))
    return top.values, top.indices + (start if rows is None else 0)


def normalize(vectors: torch.Tensor) -> torch.Tensor:
    """L2-normalize rows in float32, so cosine similarity becomes a dot product.

    Args:
        vectors: [n, d] (or [d]) states of any float dtype.

    Returns:
        The unit rows, float32, same shape.
    """
    vectors = vectors.float()
    return vectors / vectors.norm(dim=-1, keepdim=True).clamp_min(1e-6)


class KeyMatrix:
    """A growable [n, d] matrix of unit keys on one device, float16 or int8 + per-row scale.

    Args:
        dim: width d of a key.
        device: where the keys live.
        dtype: "float16" or "int8".

    Raises:
        ConfigError: for another dtype.
    """

    def __init__(self, dim: int, device: torch.device | str, dtype: str = "float16") -> None:
        if dtype not in KEY_DTYPES:
            raise ConfigError(f"key dtype must be one of {KEY_DTYPES}, got {dtype!r}")
        self.dim, self.device, self.kind = dim, torch.device(device), dtype
        self.n = 0
        self._alloc(1024)

    def _alloc(self, capacity: int) -> None:
        torch_dtype = torch.float16 if self.kind == "float16" else torch.int8
        keys = torch.zeros((capacity, self.dim), dtype=torch_dtype, device=self.device)  # [cap, d]
        scales = torch.ones(capacity, dtype=torch.float32, device=self.device)  # [cap]
        if self.n:
            keys[: self.n] = self.keys[: self.n]
            scales[: self.n] = self.scales[: self.n]
        self.keys, self.scales = keys, scales

    def append(self, unit: torch.Tensor) -> None:
        """Append unit rows [m, d] (float32)."""
        m = unit.shape[0]
        if self.n + m > self.keys.shape[0]:
            self._alloc(max(2 * self.keys.shape[0], self.n + m))
        unit = unit.to(self.device)
        if self.kind == "float16":
            self.keys[self.n:self.n + m] = unit.half()
        else:  # symmetric per-row int8: x ~= q * scale
            scale = unit.abs().amax(dim=-1).clamp_min(1e-8) / 127.0  # [m]
            self.keys[self.n:self.n + m] = (unit / scale[:, None]).round().to(torch.int8)
            self.scales[self.n:self.n + m] = scale
        self.n += m

    def drop_front(self, m: int) -> None:
        """Forget the first m rows."""
        keep = self.n - m
        self.keys[:keep] = self.keys[m:self.n].clone()
        self.scales[:keep] = self.scales[m:self.n].clone()
        self.n = keep

    def scores(self, query: torch.Tensor, upto: int, chunk: int = 65536, start: int = 0) -> torch.Tensor:
        """Cosine similarity of the unit `query` [d] with rows [start, upto). Returns [upto - start] float32."""
        if upto <= start:
            return torch.empty(0)
        if self.kind == "float16" and self.device.type == "cpu":  # float32 sums, as `cosine_topk`
            return _float32_scores(self.keys, query.float(), start, upto)  # [upto - start]
        q = query.to(self.device, torch.float16)  # [d]
        if self.kind == "float16":
            return (self.keys[start:upto] @ q).float()  # [upto - start]
        # int8: dequantize chunk by chunk, so no [upto, d] float copy is ever held.
        parts = [(self.keys[s:min(upto, s + chunk)].half() @ q).float() * self.scales[s:min(upto, s + chunk)]
                 for s in range(start, upto, chunk)]
        return torch.cat(parts)

    def top(self, query: torch.Tensor, k: int, start: int, stop: int) -> tuple[list[float], list[int]]:
        """The k rows of [start, stop) most similar to the unit `query` [d]: (scores, row indices), best first."""
        if self.kind == "float16":
            values, indices = cosine_topk(self.keys, query, k, start, stop)
        else:
            scores = self.scores(query, stop, start=start)  # [stop - start]
            if len(scores) == 0:
                return [], []
            top = scores.topk(min(k, len(scores)))
            values, indices = top.values, top.indices + start
        return values.tolist(), indices.tolist()

    def top_rows(self, query: torch.Tensor, k: int, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The k of the listed `rows` [m] most similar to the unit `query`: (scores, positions in `rows`), best first."""
        if self.kind == "float16":
            return cosine_topk(self.keys, query, k, rows=rows)
        scores = self.rows_at(rows) @ query.to(self.device, torch.float32)  # [m]
        top = scores.topk(min(k, len(rows)))
        return top.values, top.indices

    def list_kernel(self):
        """Our compiled kernels where they can search these keys by inverted lists (float16 keys
        on a CPU that runs them; `ListIndex.search`), else None."""
        if self.kind != "float16" or self.device.type != "cpu":
            return None
        return _kernel()

    def rows(self, start: int, stop: int) -> torch.Tensor:
        """Rows [start, stop) as float32 [m, d] (dequantized)."""
        rows = self.keys[start:stop].float()
        return rows * self.scales[start:stop, None] if self.kind == "int8" else rows

    def rows_at(self, indices: torch.Tensor) -> torch.Tensor:
        """The rows at `indices` [m] as float32 [m, d] (dequantized)."""
        rows = self.keys[indices].float()
        return rows * self.scales[indices, None] if self.kind == "int8" else rows

    def bytes_per_row(self) -> int:
        return self.dim * self.keys.element_size() + (4 if self.kind == "int8" else 0)
