"""Prompt Lookup Decoding (ALGORITHMS.md §2).

Find the longest recent n-gram (n = max_ngram .. min_ngram) that ends the committed sequence
and also occurs earlier, take its *earliest* earlier occurrence that is followed by at least one
token, and draft the up to K tokens that followed it, as one chain under the anchor.

`pld_lookup` is the reference definition (a scan). `NgramIndex` answers the same question in
O(max_ngram) per lookup and per committed token by remembering, for each n-gram, the first start
position that already has a following token: since the earliest occurrence never changes once
recorded, insertion-only dicts suffice.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.registry import register
from oilbird.tree import DraftTree
from oilbird.verifier import Verification


@dataclass
class PLDConfig:
    """Prompt lookup parameters (Spec-Bench and SAM-Decoding defaults)."""

    max_ngram: int = 3
    """Longest n-gram suffix tried as the lookup key."""
    min_ngram: int = 1
    """Shortest n-gram suffix tried before giving up."""
    num_pred_tokens: int = 10
    """K: tokens copied after the matched occurrence."""

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise ValueError(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_pred_tokens < 1:
            raise ValueError(f"num_pred_tokens must be >= 1, got {self.num_pred_tokens}")


def pld_lookup(seq: Sequence[int], max_ngram: int, min_ngram: int, k: int) -> list[int]:
    """Reference PLD: the continuation of the earliest earlier occurrence of the longest suffix.

    Args:
        seq: the committed sequence S (its last token is the anchor).
        max_ngram, min_ngram: n-gram sizes to try, longest first.
        k: the most tokens to return.

    Returns:
        S[j+n : j+n+k] for the earliest j with S[j:j+n] == S[-n:] and j+n < len(S); [] if none.
    """
    length = len(seq)
    for n in range(min(max_ngram, length - 1), min_ngram - 1, -1):
        query = list(seq[length - n:])
        for j in range(0, length - n):  # j + n < len(S): the occurrence has a following token
            if list(seq[j:j + n]) == query:
                return list(seq[j + n:j + n + k])
    return []


class NgramIndex:
    """Incremental index: for each n, n-gram -> earliest start that has a following token."""

    def __init__(self, max_ngram: int, min_ngram: int = 1) -> None:
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.seq: list[int] = []
        self.first: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(min_ngram, max_ngram + 1)}

    def extend(self, tokens: Sequence[int]) -> None:
        """Append committed tokens, indexing every n-gram that now has a follower."""
        for token in tokens:
            self.seq.append(int(token))
            end = len(self.seq) - 1  # the n-grams ending just before `end` gained a follower
            for n, table in self.first.items():
                start = end - n
                if start >= 0:
                    table.setdefault(tuple(self.seq[start:end]), start)

    def lookup(self, k: int) -> list[int]:
        """Same answer as `pld_lookup(self.seq, max_ngram, min_ngram, k)`."""
        length = len(self.seq)
        for n in range(min(self.max_ngram, length - 1), self.min_ngram - 1, -1):
            start = self.first[n].get(tuple(self.seq[length - n:]))
            if start is not None:
                return self.seq[start + n:start + n + k]
        return []


@dataclass
class PLDState(RequestState):
    """A PLD request: its n-gram index over the committed sequence."""

    index: NgramIndex | None = None


@register
class PromptLookup(Drafter):
    """PLD: a chain copied from the request's own earlier text."""

    name = "pld"
    Config = PLDConfig
    State = PLDState

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> PLDState:
        state = super().start_request(request_id, prompt_ids, tenant)
        state.index = NgramIndex(self.config.max_ngram, self.config.min_ngram)
        state.index.extend(prompt_ids)
        return state

    def observe(self, request_id: str, verification: Verification) -> PLDState:
        state = super().observe(request_id, verification)
        state.index.extend(verification.committed)
        return state

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        k = min(self.config.num_pred_tokens, budget - 1)
        draft = state.index.lookup(k) if k > 0 else []
        return DraftTree.chain(state.anchor, draft, self.name)
