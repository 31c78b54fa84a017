"""The verifier's KV cache: preallocated rows, written in place, compacted by row moves.

transformers' `DynamicCache` concatenates each layer's whole cache with the new rows on every
forward: a copy of the cache per layer per forward, paid by every decoding step. `TreeCache` is a
`transformers.Cache` whose layers (`PreallocatedLayer`) keep K and V in buffers with room to
spare: a forward writes its N rows into the buffer and the layer exposes the first `length` rows
as views; the buffer grows geometrically when full (an amortised copy, not one per step).

After a tree forward the verifier keeps the accepted path and drops the rest: `compact` copies
the accepted rows down to their committed positions and shortens the views (O(|path|) rows per
layer, no reallocation).

Contract: a layer's `keys`/`values` are always [B, H_kv, length, D] views of its buffers, so every
attention implementation reads them as it reads a `DynamicCache`'s tensors.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer

MIN_ROOM = 256
"""Rows of headroom a buffer is (re)allocated with beyond what it must hold."""


class PreallocatedLayer(DynamicLayer):
    """One layer's K and V in preallocated buffers (see the module docstring).

    Args:
        dtype: the buffers' dtype; None: the rows' own. float32 for a bfloat16 model whose
            attention runs on a float32 kernel: its rows are widened once, when written, instead of
            the whole cache at every forward.
    """

    def __init__(self, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        self.storage_dtype = dtype

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.length = 0
        self._keys = self._values = None  # [B, H_kv, capacity, D] each, once rows arrive

    def _reserve(self, rows: int, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Make the buffers hold at least `rows` rows, keeping the first `length`."""
        if self._keys is not None and rows <= self._keys.shape[-2]:
            return
        old = self._keys.shape[-2] if self._keys is not None else 0
        capacity = max(rows + MIN_ROOM, 2 * old)  # geometric growth: amortised O(1) per row
        b, h, _, d = key_states.shape
        dtype = self.storage_dtype or key_states.dtype
        keys = key_states.new_empty((b, h, capacity, d), dtype=dtype)  # [B, H_kv, capacity, D]
        values = value_states.new_empty((b, h, capacity, value_states.shape[-1]), dtype=dtype)
        if self.length:
            keys[:, :, : self.length] = self._keys[:, :, : self.length]
            values[:, :, : self.length] = self._values[:, :, : self.length]
        self._keys, self._values = keys, values

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]  # [B, H_kv, length, D] views
        self.values = self._values[:, :, : self.length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args,
               **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
        """Append N rows ([B, H_kv, N, D] each); return all rows held, as views."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self._reserve(end, key_states, value_states)
        self._keys[:, :, self.length:end] = key_states
        self._values[:, :, self.length:end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def crop(self, tokens_to_remove: int) -> None:
        """Drop the last `-tokens_to_remove` rows (transformers' convention: a negative count)."""
        if tokens_to_remove > 0:
            raise ValueError(f"crop takes a negative row count, got {tokens_to_remove}")
        if not self.is_initialized or tokens_to_remove == 0:
            return
        self.length = max(0, self.length + tokens_to_remove)
        if self._keys is not None:
            self._expose()

    def reset(self) -> None:
        super().reset()
        self.length = 0
        self._keys = self._values = None


class TreeCache(Cache):
    """A transformers `Cache` of `PreallocatedLayer`s, one per decoder layer.

    Args:
        num_layers: the model's decoder layers (`config.num_hidden_layers`).
        dtype: the buffers' dtype (`PreallocatedLayer`); None: the rows' own.
    """

    def __init__(self, num_layers: int, dtype: torch.dtype | None = None) -> None:
        super().__init__(layers=[PreallocatedLayer(dtype) for _ in range(num_layers)])


def new_cache(config, dtype: torch.dtype | None = None) -> Cache:
    """The cache the verifier decodes with for a model of `config`, its rows kept in `dtype`
    (None: the model's own)."""
    return TreeCache(config.get_text_config(decoder=True).num_hidden_layers, dtype)


def compact_cache(cache: Cache, prefix: int, n_nodes: int, path: list[int]) -> None:
    """Keep cache rows [0, P] (prefix and root) and P + c for c in `path`; drop the rest.

    Accepted rows are copied down to P+1.. in place, then the tail is dropped, so the cost is
    O(|path|) rows per layer rather than a copy of the whole cache. Works on a `TreeCache` and
    on transformers' `DynamicCache` alike.
    """
    keep = prefix + 1 + len(path)
    if path and path != list(range(1, len(path) + 1)):  # rows not already in place
        src = torch.tensor(path, dtype=torch.long) + prefix  # [L]
        dst = torch.arange(prefix + 1, keep)  # [L]
        for layer in cache.layers:
            src_d, dst_d = src.to(layer.keys.device), dst.to(layer.keys.device)
            # The right side gathers first, so overlaps are safe; on a TreeCache `keys` is a view
            # and the rows move inside its buffer.
            layer.keys[:, :, dst_d] = layer.keys[:, :, src_d]
            layer.values[:, :, dst_d] = layer.values[:, :, src_d]
    drop = prefix + n_nodes - keep
    if drop > 0:
        cache.crop(-drop)
