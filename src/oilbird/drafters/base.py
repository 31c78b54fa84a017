"""The drafter protocol shared by every method.

A drafter lives as long as a benchmark (or a long-running process) and serves requests one at a time:

    drafter.attach(loaded_target)                     # once: drafters with a model of their own load it
    drafter.start_request(request_id, prompt_ids, tenant)  # a new request begins
    loop:
        tree = drafter.propose(budget)                # a DraftTree rooted at the anchor, <= budget nodes
        drafter.observe(verification)                 # what was committed + what the forward computed
    drafter.stop_request(request_id)                  # the request ended (its text may join a pool)

Cross-request drafters keep one pool per *tenant* (a name chosen by the caller; the benchmark uses
one per dataset) in a `TenantMap` (oilbird/tenants.py), never let one tenant's traffic reach
another's drafts, bound each tenant's state by a cap in their config, and forget a tenant on
`drop_tenant(tenant)`.

The drafter keeps its own copy of the committed sequence (prompt + output); `propose` roots its
tree at the last committed token, the anchor. `observe` receives the full `Verification`: the
committed tokens and, for every node of the verified tree (rejected ones included), the target's
argmax, top-k ids and hidden state. A drafter may only use what was committed before the moment
it proposes; the harness never shows it anything else.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification


class Drafter:
    """Base class: holds the request's committed sequence; subclasses override `propose`.

    Subclasses set `name`, `Config` (a dataclass with the paper's defaults) and may override
    `start_request`, `observe` and `stop_request`, calling `super()` to keep `self.sequence`.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = type("NoConfig", (), {})
    needs_prefill: ClassVar[bool] = False
    """True when the drafter harvests the prefill (top-k and hidden state at every prompt position)."""
    needs_target: ClassVar[bool] = False
    """True when the drafter runs a model of its own and cannot draft before `attach(target)`."""
    prefill_topk: ClassVar[bool] = True
    """With `needs_prefill`: whether the prefill's top-k is wanted (it costs an LM-head pass over the prompt)."""

    def __init__(self, config=None) -> None:
        self.config = config if config is not None else self.Config()
        self.sequence: list[int] = []
        self.request_id: str | None = None
        self.tenant = "default"

    @property
    def anchor(self) -> int:
        """The last committed token: the root of the next tree."""
        return self.sequence[-1]

    def attach(self, target, models: dict | None = None) -> None:
        """Meet the target model (a `LoadedModel`) before the first request.

        The harness calls this once per drafter; drafters that run a model of their own (the
        'draft' method) load or build it here and check that it shares the target's vocabulary.
        The rest ignore it. `models` is the harness's per-run memo of loaded models (spec ->
        model), so several drafters of one run share one copy of the weights.

        Raises:
            ModelError: if the drafter cannot work with this target.
        """

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> None:
        """Begin serving a request of `tenant` whose prompt is `prompt_ids` (already committed)."""
        self.request_id = request_id
        self.tenant = tenant
        self.sequence = list(prompt_ids)

    def observe_prefill(self, observation: PrefillObservation) -> None:
        """Harvest the prefill; called right after `start_request` when `needs_prefill` is set."""

    def propose(self, budget: int) -> DraftTree:
        """A draft tree rooted at the anchor with at most `budget` nodes, root included."""
        raise NotImplementedError

    def observe(self, verification: Verification) -> None:
        """Record what the last forward committed and computed."""
        self.sequence.extend(verification.committed)

    def stop_request(self, request_id: str) -> None:
        """The request ended; release per-request state."""
        self.request_id = None

    def request_stats(self) -> dict:
        """Drafter-specific measurements of the request being served (e.g. retrieval seconds)."""
        return {}

    def memory_bytes(self) -> int:
        """Approximate bytes held across requests: the sum over the drafter's `TenantMap`s.

        0 for drafters that keep nothing across requests.
        """
        return sum(m.memory_bytes() for m in self._tenant_maps())

    def drop_tenant(self, tenant: str) -> None:
        """Forget everything kept for `tenant` across requests (its pools, tables and stores).

        Covers every `TenantMap` attribute of the drafter (override to drop more, e.g. a host
        drafter's). A request of that tenant in flight keeps drafting from what it already holds;
        the tenant starts empty at its next request. Unknown tenants are ignored.
        """
        for tenant_map in self._tenant_maps():
            tenant_map.drop(tenant)

    def _tenant_maps(self) -> list[TenantMap]:
        return [value for value in vars(self).values() if isinstance(value, TenantMap)]

    def describe(self) -> dict:
        """Name and config, for benchmark records."""
        config = dataclasses.asdict(self.config) if dataclasses.is_dataclass(self.config) else {}
        return {"name": self.name, "config": config}
