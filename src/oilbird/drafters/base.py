"""The drafter protocol shared by every method: one drafter instance serves many requests at once.

A drafter lives as long as a benchmark or a server. Requests are keyed by id, so one instance
serves concurrent requests (vLLM batches many; our own decode loop serves one at a time through
the very same calls):

    drafter.attach(loaded_target)                             # once: drafters with a model load it
    drafter.start_request(request_id, prompt_ids, tenant)     # a new request begins
    drafter.use_sampling(request_id, sampling)                # only when the request is sampled
    drafter.observe_prefill(request_id, observation)          # only when `needs_prefill`
    loop:
        tree = drafter.propose(request_id, budget)            # a DraftTree at the anchor, <= budget nodes
        drafter.observe(request_id, verification)             # what was committed + what the forward computed
    stats = drafter.request_stats(request_id)
    drafter.stop_request(request_id)                          # the request ended (its text may join a pool)

Per-request state lives in a `RequestState` (a dataclass; each drafter subclasses it as its
`State`) held in `self.requests[request_id]`; nothing of one request is kept on the instance.
Cross-request drafters keep one pool per *tenant* (a name chosen by the caller; the benchmark uses
one per dataset) in a `TenantMap` (oilbird/tenants.py), never let one tenant's traffic reach
another's drafts, bound each tenant's state by a cap in their config, and forget a tenant on
`drop_tenant(tenant)`.

The state keeps the request's committed sequence (prompt + output); `propose` roots its tree at
the last committed token, the anchor. `observe` receives the `Verification`: the committed
tokens and, for every node of the verified tree (rejected ones included), the target's argmax
and, where the engine computes them, its top-k ids and the hidden state at `hidden_layer`. A drafter may only use
what was committed before the moment it proposes; the harness never shows it anything else.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import ClassVar

from oilbird.errors import ConfigError
from oilbird.sampling import SamplingConfig
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification


@dataclass
class RequestState:
    """What a drafter keeps for one request in flight; drafters subclass it with their fields
    (each with a default, filled in by their `start_request`)."""

    request_id: str
    tenant: str
    sequence: list[int]
    """The committed sequence: prompt, then every committed token."""

    @property
    def anchor(self) -> int:
        """The last committed token: the root of the next tree."""
        return self.sequence[-1]


class Drafter:
    """Base class: keeps each request's committed sequence; subclasses override `propose`.

    Subclasses set `name`, `Config` (a dataclass with the paper's defaults), `State` (a
    `RequestState` subclass) and may override `start_request`, `observe` and `stop_request`,
    calling `super()`, which returns the request's state.
    """

    name: ClassVar[str] = ""
    Config: ClassVar[type] = type("NoConfig", (), {})
    State: ClassVar[type[RequestState]] = RequestState
    needs_prefill: ClassVar[bool] = False
    """True when the drafter harvests the prefill (top-k and hidden state at every prompt position)."""
    needs_target: ClassVar[bool] = False
    """True when the drafter runs a model of its own and cannot draft before `attach(target)`."""
    prefill_topk: ClassVar[bool] = True
    """With `needs_prefill`: whether the prefill's top-k is wanted (it costs an LM-head pass over the prompt)."""
    uses_topk: bool = False
    """True when `observe` reads the verifier's top-k beyond the argmax. Our engine computes the
    top-k in its argmax pass anyway; an engine that must compute it apart (vLLM) skips it for
    drafters that would not read it."""
    hidden_layer: int | None = None
    """The hidden state the drafter reads from each forward (an index into transformers'
    `hidden_states`: 0 input embeddings, -1 after the final norm), or None for none; the
    verifier computes only what some drafter reads."""

    def __init__(self, config=None) -> None:
        self.config = config if config is not None else self.Config()
        self.requests: dict[str, RequestState] = {}
        """request id -> state, for every request in flight."""

    def attach(self, target, models: dict | None = None) -> None:
        """Meet the target model (a `LoadedModel`) before the first request.

        The harness calls this once per drafter; drafters that run a model of their own (the
        'draft' method) load or build it here and check that it shares the target's vocabulary.
        The rest ignore it. `models` is the harness's per-run memo of loaded models (spec ->
        model), so several drafters of one run share one copy of the weights.

        Raises:
            ModelError: if the drafter cannot work with this target.
        """

    def state(self, request_id: str) -> RequestState:
        """The state of request `request_id`.

        Raises:
            ConfigError: if no such request is in flight (never started, or already stopped).
        """
        try:
            return self.requests[request_id]
        except KeyError:
            raise ConfigError(f"{self.name}: request {request_id!r} is not in flight; "
                              "call start_request first") from None

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> RequestState:
        """Begin serving a request of `tenant` whose prompt is `prompt_ids` (already committed).

        Returns:
            The request's new state (subclasses fill in their fields).

        Raises:
            ConfigError: if a request with this id is already in flight.
        """
        if request_id in self.requests:
            raise ConfigError(f"{self.name}: request {request_id!r} is already in flight; "
                              "ids must be unique among running requests")
        state = self.State(request_id=request_id, tenant=tenant, sequence=list(prompt_ids))
        self.requests[request_id] = state
        return state

    def use_sampling(self, request_id: str, sampling: SamplingConfig) -> None:
        """The request is sampled with `sampling` (temperature > 0); called right after
        `start_request`. Deterministic drafters ignore it: the verifier's walk needs no draft
        probabilities. A drafter that samples its drafts (the draft model) does so here with the
        same settings and records each draft's distribution in the tree's `draft_probs`."""

    def observe_prefill(self, request_id: str, observation: PrefillObservation) -> None:
        """Harvest the prefill; called right after `start_request` when `needs_prefill` is set."""

    def propose(self, request_id: str, budget: int) -> DraftTree:
        """A draft tree rooted at the request's anchor with at most `budget` nodes, root included."""
        raise NotImplementedError

    def restrict_proposal(self, request_id: str, nodes: list[int]) -> None:
        """The engine will verify only `nodes` (ascending, root excluded, ancestor-closed) of the last
        proposed tree, as `tree.subtree(nodes)`: the next `observe` numbers them 1, 2, ... Drafters
        that remember node indices of their proposal renumber them here (vLLM verifies one chain;
        our engine's 'fit' budget prunes trees)."""

    def observe(self, request_id: str, verification: Verification) -> RequestState:
        """Record what the request's last forward committed and computed; returns its state."""
        state = self.state(request_id)
        state.sequence.extend(verification.committed)
        return state

    def stop_request(self, request_id: str) -> RequestState | None:
        """The request ended; release its state (returned; None for an unknown id, which is ignored,
        so that an engine may stop a request it never drafted for)."""
        return self.requests.pop(request_id, None)

    def request_stats(self, request_id: str) -> dict:
        """Drafter-specific measurements of a request in flight (e.g. retrieval seconds)."""
        return {}

    def memory_bytes(self) -> int:
        """Approximate bytes held across requests: the sum over the drafter's `TenantMap`s.

        0 for drafters that keep nothing across requests.
        """
        return sum(m.memory_bytes() for m in self._tenant_maps())

    def tenant_bytes(self, tenant: str) -> int:
        """Approximate bytes held for one tenant: its entries of every `TenantMap`, and of any
        drafter this one hosts."""
        held = [m.peek(tenant) for m in self._tenant_maps()]
        total = sum(entry.memory_bytes() for entry in held if entry is not None)
        return total + sum(d.tenant_bytes(tenant) for d in vars(self).values() if isinstance(d, Drafter))

    def snapshot_tenants(self) -> list[str]:
        """Tenants with state that text alone cannot rebuild (see `tenant_snapshot`); none by default."""
        return []

    def tenant_snapshot(self, tenant: str) -> dict:
        """The tensors of `tenant`'s state that a replay of its text cannot rebuild (the semantic
        source's keys), for `oilbird.pool_state`; {} for drafters whose pools are text only."""
        return {}

    def restore_tenant_snapshot(self, tenant: str, tensors: dict) -> None:
        """Load what `tenant_snapshot` returned (after the tenant's text was replayed).

        Raises:
            ValueError: the tensors are not a snapshot this drafter wrote.
        """
        if tensors:
            raise ValueError(f"{self.name} keeps no snapshot state; got {sorted(tensors)[:3]}")

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
