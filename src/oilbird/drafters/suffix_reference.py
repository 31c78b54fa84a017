"""The official SuffixDecoding, as a drafter: a reference peer for our `suffix` drafter.

Drafts with `arctic_inference.suffix_decoding.SuffixDecodingCache` (PyPI `arctic-inference`),
under the same `SuffixDecodingConfig` as our implementation, so the two can be run side by side
at the same budget and their τ compared. One cache per tenant, as for every pooled drafter.

The package is optional. It builds from source on a CPU machine:
    pip install nanobind==2.9.2 cmake ninja setuptools wheel
    PATH=$VIRTUAL_ENV/bin:$PATH pip install --no-build-isolation --no-deps arctic-inference
(CMake must find the same Python that has nanobind, hence the PATH.)
"""

from __future__ import annotations

from oilbird.drafters.base import Drafter
from oilbird.drafters.registry import register
from oilbird.drafters.suffix_decoding import SuffixDecodingConfig
from oilbird.errors import ConfigError
from oilbird.tree import DraftTree
from oilbird.verifier import Verification

INSTALL_HINT = ("pip install nanobind==2.9.2 cmake ninja setuptools wheel && "
                "PATH=$VIRTUAL_ENV/bin:$PATH pip install --no-build-isolation --no-deps arctic-inference")


@register
class SuffixReference(Drafter):
    """Arctic Inference's SuffixDecodingCache behind our drafter protocol."""

    name = "suffix-ref"
    Config = SuffixDecodingConfig

    def __init__(self, config: SuffixDecodingConfig | None = None) -> None:
        super().__init__(config)
        try:
            from arctic_inference.suffix_decoding import SuffixDecodingCache
        except ImportError:
            raise ConfigError("method 'suffix-ref' needs the arctic-inference package: "
                              + INSTALL_HINT) from None
        self._cache_class = SuffixDecodingCache
        self.caches: dict[str, object] = {}  # per tenant

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> None:
        super().start_request(request_id, prompt_ids, tenant)
        cfg = self.config
        if tenant not in self.caches:
            self.caches[tenant] = self._cache_class(max_tree_depth=cfg.max_depth,
                                                    max_cached_requests=cfg.max_cached_requests)
        self.cache = self.caches[tenant]
        if request_id in getattr(self.cache, "cached_requests", ()):  # a re-run: drop its old answer
            self.cache.evict_cached_response(request_id)
        self.cache.start_request(request_id, prompt_ids)

    def observe(self, verification: Verification) -> None:
        super().observe(verification)
        self.cache.add_active_response(self.request_id, verification.committed)

    def stop_request(self, request_id: str) -> None:
        self.cache.stop_request(request_id)
        super().stop_request(request_id)

    def propose(self, budget: int) -> DraftTree:
        cfg = self.config
        limit = budget - 1 if cfg.max_spec_tokens <= 0 else min(cfg.max_spec_tokens, budget - 1)
        tree = DraftTree.root(self.anchor)
        if limit < 1:
            return tree
        draft = self.cache.speculate(
            self.request_id, self.sequence[-cfg.max_depth:], max_spec_tokens=limit,
            max_spec_factor=cfg.max_spec_factor, max_spec_offset=cfg.max_spec_offset,
            min_token_prob=cfg.min_token_prob, use_tree_spec=cfg.use_tree)
        index = []  # draft position -> tree node
        for token, parent, prob in zip(draft.token_ids, draft.parents, draft.probs):
            node_parent = 0 if parent < 0 else index[parent]
            index.append(tree.add(node_parent, token, self.name, prob))
        return tree
