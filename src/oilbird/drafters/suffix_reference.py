"""The official SuffixDecoding, as a drafter: a reference peer for our `suffix` drafter.

Drafts with `arctic_inference.suffix_decoding.SuffixDecodingCache` (PyPI `arctic-inference`),
under the same `SuffixDecodingConfig` as our implementation, so the two can be run side by side
at the same budget and their τ compared. One cache per tenant, in a `TenantMap`, as for every
pooled drafter; `drop_tenant` forgets one.

Caps, as in `oilbird.drafters.suffix_decoding` (oldest cached response evicted first):
- `max_cached_requests` is Arctic's own request cap (FIFO, the active response counted).
- `max_cached_tokens` is ours: Arctic does not count tokens, so `_TenantCache` keeps each cached
  response's length and, before the committed tokens of a step are added, evicts the oldest other
  responses (`evict_cached_response`) until they fit. The one difference from our drafter: when
  the active response alone would pass the cap, Arctic offers no way to stop it growing in the
  global tree while its local tree grows, so it is evicted from the global tree instead (Arctic
  then feeds only the request's local tree, as for any response evicted mid-request).

The package is optional. It builds from source on a CPU machine:
    pip install nanobind==2.9.2 cmake ninja setuptools wheel
    PATH=$VIRTUAL_ENV/bin:$PATH pip install --no-build-isolation --no-deps arctic-inference
(CMake must find the same Python that has nanobind, hence the PATH.)
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.registry import register
from oilbird.drafters.suffix_decoding import SuffixDecodingConfig
from oilbird.errors import ConfigError
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import Verification

INSTALL_HINT = ("pip install nanobind==2.9.2 cmake ninja setuptools wheel && "
                "PATH=$VIRTUAL_ENV/bin:$PATH pip install --no-build-isolation --no-deps arctic-inference")

_BYTES_PER_TOKEN = 400
"""Estimated bytes per cached token. Arctic's public API reports no size; its tree's debugging
walk (`estimate_memory()`, arctic-inference 0.3.0) gave about 320 bytes per cached token on
phrase-like and on random text (10k tokens), and 400 allows for the allocator and the stored
sequences."""


class _TenantCache:
    """One tenant's Arctic cache plus our count of each cached response's tokens.

    Args:
        cache: a fresh `SuffixDecodingCache` (kept as `arctic`).
        max_tokens: the most cached tokens over all responses.
    """

    def __init__(self, cache, max_tokens: int) -> None:
        self.arctic = cache
        self.max_tokens = max_tokens
        self.lengths: OrderedDict[str, int] = OrderedDict()
        """request id -> tokens in the global tree, oldest first, for every cached response."""
        self.num_tokens = 0

    def start(self, request_id: str, prompt_ids: list[int]) -> None:
        """Start a request in Arctic and mirror its (FIFO, request-capped) bookkeeping."""
        if request_id in self.arctic.cached_requests:  # a re-run: drop its old answer
            self.evict(request_id)
        self.arctic.start_request(request_id, prompt_ids)
        self._forget_evicted()
        if request_id in self.arctic.cached_requests:
            self.lengths[request_id] = 0

    def add(self, request_id: str, tokens: list[int]) -> None:
        """Add committed tokens of the active request, evicting older responses to fit them."""
        if request_id in self.lengths and not self._make_room(request_id, len(tokens)):
            self.evict(request_id)  # it alone would pass the cap (see the module docstring)
        self.arctic.add_active_response(request_id, tokens)
        if request_id in self.lengths:
            self.lengths[request_id] += len(tokens)
            self.num_tokens += len(tokens)

    def _make_room(self, growing: str, tokens: int) -> bool:
        """Evict the oldest responses other than `growing` until `tokens` more fit.

        Returns:
            Whether they fit: False when `growing` alone would pass the cap.
        """
        while self.num_tokens + tokens > self.max_tokens:
            victim = next((rid for rid in self.lengths if rid != growing), None)
            if victim is None:
                return False
            self.evict(victim)
        return True

    def evict(self, request_id: str) -> None:
        """Evict a cached response from Arctic's global tree and from our count."""
        self.arctic.evict_cached_response(request_id)
        self.num_tokens -= self.lengths.pop(request_id, 0)

    def _forget_evicted(self) -> None:
        # Arctic's request cap evicts oldest first, the order of `lengths`, so whatever it
        # evicted sits at the front.
        cached = self.arctic.cached_requests
        while self.lengths:
            oldest = next(iter(self.lengths))
            if oldest in cached:
                return
            self.num_tokens -= self.lengths.pop(oldest)

    def memory_bytes(self) -> int:
        """Estimated bytes of the global tree (`_BYTES_PER_TOKEN` per cached token)."""
        return _BYTES_PER_TOKEN * self.num_tokens


@dataclass
class SuffixReferenceState(RequestState):
    """A suffix-ref request: its tenant's cache (Arctic keeps the request's local tree by id)."""

    cache: _TenantCache | None = None
    """The tenant's cache, kept for the whole request (a drop_tenant orphans it)."""


@register
class SuffixReference(Drafter):
    """Arctic Inference's SuffixDecodingCache behind our drafter protocol."""

    name = "suffix-ref"
    Config = SuffixDecodingConfig
    State = SuffixReferenceState

    def __init__(self, config: SuffixDecodingConfig | None = None) -> None:
        super().__init__(config)
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError:
            raise ConfigError("method 'suffix-ref' needs the arctic-inference package: "
                              + INSTALL_HINT) from None
        cfg = self.config
        # A token cap of 0 disables the global tree, as max_cached_requests = 0 does in Arctic.
        max_requests = 0 if cfg.max_cached_tokens == 0 else cfg.max_cached_requests
        self.caches: TenantMap[_TenantCache] = TenantMap(lambda: _TenantCache(
            SuffixDecodingCache(max_tree_depth=cfg.max_depth, max_cached_requests=max_requests),
            cfg.max_cached_tokens))

    def start_request(self, request_id: str, prompt_ids: list[int],
                      tenant: str = "default") -> SuffixReferenceState:
        state = super().start_request(request_id, prompt_ids, tenant)
        # The request keeps its cache: a drop_tenant while it runs orphans it, and nothing
        # re-creates the tenant before its next request.
        state.cache = self.caches.get(tenant)
        state.cache.start(request_id, prompt_ids)
        return state

    def observe(self, request_id: str, verification: Verification) -> SuffixReferenceState:
        state = super().observe(request_id, verification)
        state.cache.add(request_id, list(verification.committed))
        return state

    def stop_request(self, request_id: str) -> SuffixReferenceState | None:
        """End the request in Arctic (its response stays cached); unknown ids are ignored."""
        state = super().stop_request(request_id)
        if state is not None:
            state.cache.arctic.stop_request(request_id)
        return state

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        cfg = self.config
        limit = budget - 1 if cfg.max_spec_tokens <= 0 else min(cfg.max_spec_tokens, budget - 1)
        tree = DraftTree.root(state.anchor)
        if limit < 1:
            return tree
        draft = state.cache.arctic.speculate(
            request_id, state.sequence[-cfg.max_depth:], max_spec_tokens=limit,
            max_spec_factor=cfg.max_spec_factor, max_spec_offset=cfg.max_spec_offset,
            min_token_prob=cfg.min_token_prob, use_tree_spec=cfg.use_tree)
        index = []  # draft position -> tree node
        for token, parent, prob in zip(draft.token_ids, draft.parents, draft.probs):
            node_parent = 0 if parent < 0 else index[parent]
            index.append(tree.add(node_parent, token, self.name, prob))
        return tree
