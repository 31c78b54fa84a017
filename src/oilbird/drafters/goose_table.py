"""GOOSE's two-tier successor table: the target's top-K after a token, kept across requests.

Rows are harvested from the target's top-K at every node of every forward (rejected nodes and,
optionally, the prefill included): unigram cur -> row, and bigram (prev, cur) -> row. Scores are
the softmax over the row's top-K logits. (GOOSE calls it an adjacency table; it is a different
structure from Token Recycling's `AdjacencyTable`.)

Cap: each tier holds at most `max_rows` rows; a write to a full tier evicts the tier's least
recently *written* row first (a row moves to the newest end whenever it is overwritten; reading a
row does not refresh it). So a table holds at most 2 x `max_rows` rows, about
`SuccessorTable.memory_bytes()` bytes.
"""

from __future__ import annotations

from collections import OrderedDict

import torch

Row = tuple[list[int], list[float]]
"""A successor row: the target's top-k ids, best first, and their softmax scores."""


class SuccessorTable:
    """Successors harvested from the target's top-K: unigram cur -> row, bigram (prev, cur) -> row.

    Each tier is capped at `max_rows` rows and evicts its least recently written row first (see
    the module docstring).

    Args:
        max_rows: the most rows per tier.
        top_k: the row width the harvests use; only sizes the `memory_bytes` estimate.

    Raises:
        ValueError: if `max_rows` is below 1.
    """

    def __init__(self, max_rows: int = 1_000_000, top_k: int = 10) -> None:
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self.max_rows = max_rows
        self.top_k = top_k
        # OrderedDict, not dict: evicting the oldest row of a plain dict rescans the deleted
        # slots at its front, which turns a full table's every write into O(rows).
        self.unigram: OrderedDict[int, Row] = OrderedDict()
        self.bigram: OrderedDict[tuple[int, int], Row] = OrderedDict()
        self.evicted_rows = 0
        """Rows evicted by the cap so far (both tiers)."""

    def harvest(self, tokens: list[int], prevs: list[int | None], topk_ids: torch.Tensor,
                topk_logits: torch.Tensor, k: int) -> None:
        """Record each position's top-k (last occurrence wins; the cap evicts the oldest rows).

        Args:
            tokens: token at each position.
            prevs: the token before each position (None: no bigram key).
            topk_ids, topk_logits: [n, >=k] the target's top-k at each position.
            k: the row width to keep.
        """
        ids = topk_ids[:, :k].tolist()
        scores = torch.softmax(topk_logits[:, :k].float(), dim=-1).tolist()  # within top-k
        for token, prev, row_ids, row_scores in zip(tokens, prevs, ids, scores):
            entry = (row_ids, row_scores)  # one pair shared by both tiers until overwritten
            self._write(self.unigram, token, entry)
            if prev is not None:
                self._write(self.bigram, (prev, token), entry)

    def _write(self, tier: OrderedDict, key, entry: Row) -> None:
        tier[key] = entry
        tier.move_to_end(key)  # an overwrite makes the row the most recently written
        if len(tier) > self.max_rows:
            tier.popitem(last=False)
            self.evicted_rows += 1

    def successors(self, prev: int | None, token: int, use_bigram: bool) -> list[tuple[int, float]]:
        """The (id, score) successors of `token`: the bigram row first, else the unigram row.

        Args:
            prev: the token before `token` (None: unigram only).
            token: the token whose successors are wanted.
            use_bigram: whether to consult the bigram tier.

        Returns:
            (successor id, score) pairs, best first; empty when neither tier has a row.
        """
        entry = self.bigram.get((prev, token)) if use_bigram and prev is not None else None
        if entry is None:
            entry = self.unigram.get(token)
        return list(zip(*entry)) if entry else []

    def __len__(self) -> int:
        """Rows in both tiers."""
        return len(self.unigram) + len(self.bigram)

    def memory_bytes(self) -> int:
        """Approximate bytes held: both tiers' rows at a per-row estimate (`_row_bytes`).

        Returns:
            The estimate; at most 2 x max_rows x `_row_bytes(top_k)`.
        """
        return len(self) * _row_bytes(self.top_k)


def _row_bytes(k: int) -> int:
    """Estimated bytes per successor-table row of width k (CPython, 64-bit).

    A row costs its OrderedDict slot and link node (~100), its key (an int, or a 2-tuple of
    ints, ~70), the 2-tuple pairing its lists (~56) and the lists: ids (56 + 8k, 32 per int
    object) and scores (56 + 8k, 24 per float). A harvest shares one pair between the two tiers,
    so counting it in full per row errs high. Measured with tracemalloc at k = 10: 1,010 bytes
    per row with no pair shared, 623 with every pair shared; this gives 1,058.
    """
    return 170 + 56 + 2 * 56 + (8 + 32 + 8 + 24) * k
