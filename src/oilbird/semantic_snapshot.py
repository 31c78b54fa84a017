"""A tenant's semantic trace store as tensors, for snapshots (oilbird/pool_state.py), and back.

The trace store's keys are the verifier's hidden states: a replay of the request log (text only)
cannot rebuild them, so they are snapshotted. What is saved: the stored keys as they are held
(float16, or int8 with per-row scales), the tokens, the segment starts and the count of evicted
records (so record ids stay stable). Segment owners are not saved: after a restore every segment
is anonymous, which is what they are once their requests have finished. The rejected-branch pool
(a small ring of recent rejections) and the calibrator are not saved; they refill within a few
requests.
"""

from __future__ import annotations

import torch

from oilbird.semantic_memory import SemanticMemory


def memory_tensors(memory: SemanticMemory) -> dict[str, torch.Tensor]:
    """The trace store of `memory` as named CPU tensors; {} when it holds no record."""
    store = memory.store
    if store is None or len(store) == 0:
        return {}
    n = len(store)
    return {
        "trace.keys": store.keys.keys[:n].cpu().clone(),  # [n, d] float16 or int8
        "trace.scales": store.keys.scales[:n].cpu().clone(),  # [n]
        "trace.tokens": torch.tensor(store.tokens, dtype=torch.int64),  # [n]
        "trace.starts": torch.tensor(store.starts, dtype=torch.int64),  # [segments]
        "trace.evicted": torch.tensor([store.evicted_records], dtype=torch.int64),  # [1]
    }


def restore_memory(memory: SemanticMemory, tensors: dict[str, torch.Tensor]) -> None:
    """Load `memory_tensors`' output into an empty trace store of `memory`.

    Raises:
        ValueError: the tensors are not such a snapshot (missing names, inconsistent shapes, a
            key dtype other than the config's), or the store already holds records.
    """
    names = ("trace.keys", "trace.scales", "trace.tokens", "trace.starts", "trace.evicted")
    missing = [name for name in names if name not in tensors]
    if missing:
        raise ValueError(f"not a trace-store snapshot: missing {missing}")
    keys, scales, tokens = tensors["trace.keys"], tensors["trace.scales"], tensors["trace.tokens"]
    starts = tensors["trace.starts"].tolist()
    n = tokens.numel()
    if keys.dim() != 2 or keys.shape[0] != n or scales.shape != (n,):
        raise ValueError(f"snapshot shapes disagree: keys {tuple(keys.shape)}, scales "
                         f"{tuple(scales.shape)}, tokens {n}")
    if not starts or starts[0] != 0 or starts != sorted(set(starts)) or starts[-1] >= max(n, 1):
        raise ValueError(f"snapshot segment starts are invalid: {starts[:5]}...")
    store = memory.ensure(torch.empty(0, keys.shape[1]))
    expected = torch.float16 if store.keys.kind == "float16" else torch.int8
    if keys.dtype != expected:
        raise ValueError(f"snapshot keys are {keys.dtype}, the config's key dtype is {store.keys.kind}")
    if len(store):
        raise ValueError("the trace store already holds records; restore into an empty one")
    matrix = store.keys
    matrix._alloc(max(1024, n))
    matrix.keys[:n] = keys.to(matrix.device)
    matrix.scales[:n] = scales.to(matrix.device)
    matrix.n = n
    store.tokens = tokens.tolist()
    store.starts = starts
    store.owners = [None] * len(starts)
    store.evicted_records = int(tensors["trace.evicted"][0])
