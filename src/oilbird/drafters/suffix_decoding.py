"""SuffixDecoding (ALGORITHMS.md §3): drafts from suffix trees over this request and past responses.

Contract:
- Per tenant, a global `SuffixTree` holds the *responses* (generated tokens only) of that tenant's
  requests, the active one included: each committed token is appended as it is committed, as
  Arctic does. That is committed text, so drafting stays strictly online. The tenants' caches
  live in a `TenantMap`; `drop_tenant` forgets one.
- Two caps per tenant, both with the oldest cached response evicted first (FIFO by start):
  - `max_cached_requests` responses, the active one counted (as Arctic); a new request that
    would pass it evicts the oldest when it starts.
  - `max_cached_tokens` tokens over all cached responses, the active one counted as it grows:
    before each appended token, the oldest *other* responses are evicted until it fits. A
    response is never evicted by its own growth; once it alone fills the cap, it stops growing
    in the global tree (its first `max_cached_tokens` tokens stay cached) while its local tree
    keeps the whole request, so the request itself still drafts from all of its text. Eviction
    removes the response from the tree (`SuffixTree.remove`, O(length x D)).
  A request id that is already cached has its old response evicted when it starts again, so a
  re-run never drafts from its own earlier answer.
- Per request (in its `SuffixDecodingState`), a local tree over its prompt and response so far;
  dropped by `stop_request`. Concurrent requests of a tenant share its cache, each appending to
  its own response.
- `propose(request_id, budget)` speculates on both trees with the request's last D committed
  tokens as context (the last one is the anchor, so the drafted tokens are what follows it),
  keeps the higher score (a tie goes to the local tree) and hangs the draft below the anchor: at
  most `budget` nodes, root included, each tagged "suffix" and scored with its estimated
  probability.
- Tenants never share a tree.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.registry import register
from oilbird.suffix_tree import SuffixTree
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import Verification

_LOCAL = 0  # seq_id of the single sequence in a local tree


@dataclass
class SuffixDecodingConfig:
    """SuffixDecoding parameters (ArcticInference defaults, ALGORITHMS.md §10)."""

    max_depth: int = 64
    """D: suffixes are inserted to this depth, and the context is cut to its last D tokens."""
    max_spec_factor: float = 1.0
    """alpha: a match of m context tokens may draft up to floor(alpha * m + offset) tokens."""
    max_spec_offset: float = 0.0
    """offset added to alpha * m in the speculation-length rule (may be negative)."""
    min_token_prob: float = 0.1
    """Drafted tokens need an estimated probability (product of count ratios) at least this."""
    max_cached_requests: int = 100000
    """Responses kept per tenant in the global tree, the active one included (0: no global
    tree); the oldest is evicted first."""
    max_cached_tokens: int = 1_000_000
    """Tokens kept per tenant in the global tree over all cached responses, the active one
    included (0: no global tree); the oldest responses are evicted first, and a response that
    alone fills the cap stops growing there. About 0.8 KB per token."""
    use_tree: bool = True
    """Draft a best-first tree (True) or only the most frequent path (False)."""
    max_spec_tokens: int = 0
    """Cap on drafted tokens per step; 0 means only the node budget minus the root limits it."""

    def __post_init__(self) -> None:
        if self.max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {self.max_depth}")
        if self.max_cached_requests < 0:
            raise ValueError(f"max_cached_requests must be >= 0, got {self.max_cached_requests}")
        if self.max_cached_tokens < 0:
            raise ValueError(f"max_cached_tokens must be >= 0, got {self.max_cached_tokens}")
        if self.max_spec_tokens < 0:
            raise ValueError(f"max_spec_tokens must be >= 0, got {self.max_spec_tokens}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise ValueError(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")


class ResponseCache:
    """One tenant's global tree and its cached responses in arrival (FIFO) order.

    Args:
        max_depth: D of the suffix tree.
        max_requests: the most cached responses (0: the global tree is disabled).
        max_tokens: the most cached tokens over all responses (0: the global tree is disabled).
    """

    def __init__(self, max_depth: int, max_requests: int, max_tokens: int = 1_000_000) -> None:
        self.tree = SuffixTree(max_depth)
        self.max_requests = max_requests
        self.max_tokens = max_tokens
        self.seq_ids: OrderedDict[str, int] = OrderedDict()
        """request id -> seq_id in `tree`, oldest first."""
        self.lengths: dict[int, int] = {}
        """seq_id -> tokens of that response in `tree`, for every cached response."""
        self.num_tokens = 0
        """Tokens of all cached responses (the sum of `lengths`)."""
        self._next_seq_id = 0

    def open(self, request_id: str) -> int | None:
        """Reserve a slot for a new response, evicting the oldest beyond the request cap.

        Returns:
            The response's seq_id, or None when the global tree is disabled.
        """
        if self.max_requests == 0 or self.max_tokens == 0:
            return None
        if request_id in self.seq_ids:
            self.evict(request_id)
        seq_id = self._next_seq_id
        self._next_seq_id += 1
        self.seq_ids[request_id] = seq_id
        self.lengths[seq_id] = 0
        while len(self.seq_ids) > self.max_requests:  # the new response is last, never evicted here
            self.evict(next(iter(self.seq_ids)))
        return seq_id

    def append(self, seq_id: int, token: int) -> bool:
        """Append one committed token to response `seq_id`, evicting older responses to fit it.

        Args:
            seq_id: a seq_id returned by `open`.
            token: the committed token.

        Returns:
            Whether the token entered the tree: False once the response was evicted (another
            request of the tenant needed the room) or alone fills the token cap.
        """
        if seq_id not in self.lengths:
            return False  # evicted meanwhile: never bring it back outside the accounting
        if not self._make_room(seq_id):
            return False  # it alone fills the cap: it stops growing here
        self.tree.append(seq_id, token)
        self.lengths[seq_id] += 1
        self.num_tokens += 1
        return True

    def _make_room(self, growing: int) -> bool:
        """Evict the oldest responses other than `growing` until one more token fits.

        Returns:
            Whether it fits: False when `growing` alone fills the token cap.
        """
        while self.num_tokens >= self.max_tokens:
            victim = next((rid for rid, sid in self.seq_ids.items() if sid != growing), None)
            if victim is None:
                return False
            self.evict(victim)
        return True

    def evict(self, request_id: str) -> None:
        """Drop a cached response from the tree.

        Raises:
            KeyError: if `request_id` has no cached response.
        """
        seq_id = self.seq_ids.pop(request_id)
        self.num_tokens -= self.lengths.pop(seq_id)
        if seq_id in self.tree:  # an empty response was never inserted
            self.tree.remove(seq_id)

    def memory_bytes(self) -> int:
        """Approximate bytes held: ~650 per tree node in CPython, measured with tracemalloc on a
        12k-node tree (the stored token lists included).

        Returns:
            The estimate; the tree has at most about two nodes per cached token.
        """
        return 650 * self.tree.num_nodes


@dataclass
class SuffixDecodingState(RequestState):
    """A SuffixDecoding request: its local tree and its slot in its tenant's response cache."""

    local: SuffixTree | None = None
    """Suffix tree over this request's prompt and response so far (seq_id `_LOCAL`)."""
    cache: ResponseCache | None = None
    """The tenant's cache, kept for the whole request (a drop_tenant orphans it)."""
    response_seq: int | None = None
    """This response's seq_id in `cache`; None when the global tree is disabled."""


@register
class SuffixDecoding(Drafter):
    """SuffixDecoding: local (prompt + response) and per-tenant global (responses) suffix trees."""

    name = "suffix"
    Config = SuffixDecodingConfig
    State = SuffixDecodingState

    def __init__(self, config: SuffixDecodingConfig | None = None) -> None:
        super().__init__(config)
        cfg = self.config
        self.caches: TenantMap[ResponseCache] = TenantMap(lambda: ResponseCache(
            cfg.max_depth, cfg.max_cached_requests, cfg.max_cached_tokens))
        """tenant -> its global tree of responses."""

    def start_request(self, request_id: str, prompt_ids: list[int],
                      tenant: str = "default") -> SuffixDecodingState:
        state = super().start_request(request_id, prompt_ids, tenant)
        state.local = SuffixTree(self.config.max_depth)
        state.local.extend(_LOCAL, prompt_ids)
        # The request keeps its cache: a drop_tenant while it runs orphans it, and nothing
        # re-creates the tenant before its next request.
        state.cache = self.caches.get(tenant)
        state.response_seq = state.cache.open(request_id)
        return state

    def observe(self, request_id: str, verification: Verification) -> SuffixDecodingState:
        state = super().observe(request_id, verification)
        for token in verification.committed:
            state.local.append(_LOCAL, token)
            if state.response_seq is not None:
                state.cache.append(state.response_seq, token)
        return state

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        cfg = self.config
        tree = DraftTree.root(state.anchor)
        max_tokens = budget - 1 if cfg.max_spec_tokens == 0 else min(cfg.max_spec_tokens, budget - 1)
        if max_tokens < 1:
            return tree
        context = state.sequence[-cfg.max_depth:]
        args = (max_tokens, cfg.max_spec_factor, cfg.max_spec_offset, cfg.min_token_prob, cfg.use_tree)
        best = state.local.speculate(context, *args)
        if len(state.cache.tree):
            other = state.cache.tree.speculate(context, *args)
            if other.score > best.score:
                best = other
        nodes: list[int] = []  # draft index -> tree node; parents precede children in the draft
        for token, parent, prob in zip(best.token_ids, best.parents, best.probs):
            nodes.append(tree.add(0 if parent < 0 else nodes[parent], token, self.name, prob))
        return tree
