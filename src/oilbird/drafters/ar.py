"""Autoregressive decoding as a drafter: it drafts nothing, so every forward is one AR step."""

from __future__ import annotations

from oilbird.drafters.base import Drafter
from oilbird.drafters.registry import register
from oilbird.tree import DraftTree


@register
class Autoregressive(Drafter):
    """The baseline every speedup is measured against: a tree of the anchor alone."""

    name = "ar"

    def propose(self, request_id: str, budget: int) -> DraftTree:
        return DraftTree.root(self.state(request_id).anchor)
