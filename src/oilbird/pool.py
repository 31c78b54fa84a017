"""The cross-request pool: committed token streams of past requests, one store per tenant.

Contract:
- Strictly online: a request's text (prompt + output) enters its tenant's store only when the
  request ends (`add_request`), so a request being decoded sees the requests before it and never
  its own future. Its own committed text is the drafters' per-request business.
- Tenants are isolated: each has its own `TokenStore` (tokens and suffix automaton); nothing is
  shared across tenants. `Pool` is the `TenantMap` of the stores: a tenant's store is built on
  first use and `drop(tenant)` forgets it (a request in flight keeps the store it holds).
- Bounded: each store keeps at most `max_tokens` tokens; the oldest requests are evicted first
  (FIFO by the time they ended), and a request longer than the whole cap keeps its last
  `max_tokens` tokens. The suffix automaton cannot delete, so it is rebuilt from the retained
  requests once evicted tokens make up half of what it indexes (amortized O(1) per token): it
  indexes at most 2 x `max_tokens` tokens.
- `memory_bytes()` reports an estimate of a store's (or the pool's) footprint, for benchmark
  records.
"""

from __future__ import annotations

import sys
from collections import deque
from dataclasses import dataclass

from oilbird.suffix_automaton import SuffixAutomaton
from oilbird.tenants import TenantMap


@dataclass
class PoolConfig:
    """Capacity of one tenant's store."""

    max_tokens: int = 4_000_000
    """Cap on stored tokens per tenant; the oldest requests are evicted beyond it."""
    track_recent: bool = False
    """Keep each automaton state's most recent occurrence too (`SuffixAutomaton(track_recent=True)`),
    for drafters that copy from it."""
    track_counts: bool = False
    """Keep each automaton state's occurrence count too (`SuffixAutomaton(track_counts=True)`),
    for drafters that follow or score continuations by frequency."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")


class TokenStore:
    """One tenant's past requests and the suffix automaton indexing them."""

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        self.requests: deque[tuple[str, list[int]]] = deque()
        self.num_tokens = 0
        self.evicted_requests = 0
        self.sam = SuffixAutomaton(self.config.track_recent, self.config.track_counts)
        self._indexed_tokens = 0  # tokens in the automaton, evicted ones included
        self.version = 0
        """Bumped whenever the automaton changes, so cursors into it know to re-match."""

    def add_request(self, request_id: str, tokens: list[int]) -> None:
        """Store a finished request's committed tokens (prompt and output).

        A request longer than the whole cap keeps only its last `max_tokens` tokens.
        """
        tokens = [int(t) for t in tokens[-self.config.max_tokens:]]
        self.requests.append((request_id, tokens))
        self.num_tokens += len(tokens)
        self.sam.extend_many(tokens)
        self.sam.end_document()
        self.version += 1
        self._indexed_tokens += len(tokens)
        while self.num_tokens > self.config.max_tokens:
            _, old = self.requests.popleft()
            self.num_tokens -= len(old)
            self.evicted_requests += 1
        if self._indexed_tokens >= 2 * self.num_tokens:
            self._rebuild()

    def _rebuild(self) -> None:
        self.sam = SuffixAutomaton(self.config.track_recent, self.config.track_counts)
        for _, tokens in self.requests:
            self.sam.extend_many(tokens)
            self.sam.end_document()
        self._indexed_tokens = self.num_tokens

    def memory_bytes(self) -> int:
        """Rough footprint: token lists plus the automaton's per-state containers."""
        per_token = 8 + 28  # list slot + small int (CPython)
        sam = self.sam
        # list slots: link, length, first_end and the transitions dict; last_end and prev_end
        # with track_recent, count with track_counts
        slots = 4 + 2 * sam.track_recent + sam.track_counts
        per_state = slots * 8 + sys.getsizeof({}) + 28 * 3
        transitions = sum(len(t) for t in sam.next) * 2 * 8 * 2  # key and value slots, dict overhead
        return int(self.num_tokens * per_token + len(sam.tokens) * per_token
                   + sam.num_states * per_state + transitions)


class Pool(TenantMap[TokenStore]):
    """All tenants' stores: a `TenantMap` whose factory builds a `TokenStore` under `config`.

    `get(tenant)` is a tenant's store, `drop(tenant)` forgets it, `memory_bytes()` sums them.

    Args:
        config: the capacity of every tenant's store.
    """

    def __init__(self, config: PoolConfig | None = None) -> None:
        self.config = config or PoolConfig()
        super().__init__(lambda: TokenStore(self.config))
