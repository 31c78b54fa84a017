"""Tenant-affinity routing across Oilbird replicas with Ray Serve (needs Ray Serve 2.60's alpha
request-router API: `pip install --no-deps -r requirements/ray-serve.txt` into .venv-vllm).

Contract: each replica keeps its drafter's cross-request pools keyed by tenant, so every request
of one tenant must reach the same replica, or its pool is split and its drafts get worse.
`TenantAffinityRouter` reads the tenant from a keyword argument of the handle call (`tenant=`,
name configurable; a call without it counts as tenant "default"; a tenant passed positionally is
not seen) and ranks the live replicas by rendezvous (highest-random-weight) hashing of the tenant
over the replicas' ids: the same tenant, the same home, in every process that routes. Affinity
comes first: the home replica is tried first, the others one by one in ranked order only when
the home rejects the request (it is at `max_ongoing_requests`), so spill-over, which splits the
tenant's pool, happens only under saturation. Removing a replica moves only its own tenants.

`OilbirdReplica` is the deployment body (wrap it with `serve.deployment(...,
request_router_config=tenant_affinity_config())`); `import oilbird` never imports this module.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
import uuid
from collections.abc import Iterable, Sequence

import torch

try:
    from ray import serve
    from ray.serve.config import RequestRouterConfig
    from ray.serve.exceptions import RayServeException
    from ray.serve.request_router import PendingRequest, RequestRouter, RunningReplica
except ImportError as err:  # the engine's .venv has no Ray
    raise ImportError("oilbird.integrations.ray_serve needs Ray Serve: pip install --no-deps "
                      "-r requirements/ray-serve.txt") from err

from oilbird import DecodeConfig, TreeVerifier, decode, load_model
from oilbird.methods import build_drafter
from oilbird.model_fetch import DEFAULT_MODEL

DEFAULT_TENANT = "default"


def rendezvous_rank(tenant: str, replica_ids: Iterable[str]) -> list[str]:
    """Replica ids ranked for `tenant`, home first: descending sha256 weight of (tenant, id).

    Args:
        tenant: the routing key.
        replica_ids: the live replicas' ids (order does not matter).
    Returns:
        every id once, by descending weight (ties by id).
    """
    def weight(replica_id: str) -> int:
        digest = hashlib.sha256(f"{tenant}\x00{replica_id}".encode()).digest()
        return int.from_bytes(digest[:8], "big")

    return sorted(set(replica_ids), key=lambda r: (-weight(r), r))


class TenantAffinityRouter(RequestRouter):
    """Ranks replicas by `rendezvous_rank` of the call's tenant, one replica per rank.

    Deliberately not a `FIFOMixin` router: FIFO hands a free replica to the oldest pending request,
    whichever tenant it belongs to; the base class fulfills exactly the request that was routed.
    """

    tenant_kwarg = "tenant"
    """The keyword argument of handle calls that names the tenant (set by `initialize_state`)."""

    def initialize_state(self, tenant_kwarg: str = "tenant") -> None:
        """Set the keyword argument that names the tenant (Serve passes `request_router_kwargs`)."""
        self.tenant_kwarg = tenant_kwarg

    def tenant_of(self, request: PendingRequest | None) -> str:
        """The request's tenant: its `tenant_kwarg` keyword argument, or "default" when absent."""
        value = request.kwargs.get(self.tenant_kwarg) if request else None
        return DEFAULT_TENANT if value in (None, "") else str(value)

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Rank `candidate_replicas` for the request's tenant.

        Returns:
            [[home], [second], ...]: Serve tries each rank in turn; all candidates in one rank
            when there is no request (Serve's idle probing); [] without candidates.
        """
        if not candidate_replicas or pending_request is None:
            return [candidate_replicas] if candidate_replicas else []
        pending_request.routing_context.should_backoff = True  # all full: back off, do not spin
        by_id = {replica.replica_id.unique_id: replica for replica in candidate_replicas}
        return [[by_id[i]] for i in rendezvous_rank(self.tenant_of(pending_request), by_id)]


def tenant_affinity_config(tenant_kwarg: str = "tenant") -> RequestRouterConfig:
    """The `request_router_config` of a deployment routed by `TenantAffinityRouter`.

    Args:
        tenant_kwarg: the keyword argument of handle calls that names the tenant.
    Returns:
        a `ray.serve.config.RequestRouterConfig`.
    """
    return RequestRouterConfig(request_router_class=TenantAffinityRouter,
                               request_router_kwargs={"tenant_kwarg": tenant_kwarg})


class OilbirdReplica:
    """One replica: a model, one drafter with per-tenant pools, our greedy decode loop.

    Requests are decoded one at a time (Serve runs sync methods in threads; a lock serializes
    them, since a drafter and a model are shared by the replica's requests).

    Args:
        method: a method spec (`oilbird bench --methods`), e.g. "sam" or "oilbird[sem_theta=0.6]".
        model: a model spec for `oilbird.models.load_model` (default: the embedded default model).
        node_budget: most tree nodes per verification forward.
        torch_threads: torch's intra-op threads in this replica; None leaves torch's choice.
    Raises:
        ConfigError, ModelError: a bad method spec or model spec.
    """

    def __init__(self, method: str = "sam", model: str = DEFAULT_MODEL, node_budget: int = 64,
                 torch_threads: int | None = None) -> None:
        if torch_threads:
            torch.set_num_threads(torch_threads)
        self.loaded = load_model(model)
        self.drafter = build_drafter(method, {}, self.loaded)
        self.verifier = TreeVerifier(self.loaded.tree_model(), self.loaded.stop_ids)
        self.node_budget = node_budget
        try:
            self.replica_id = serve.get_replica_context().replica_id.unique_id
        except RayServeException:  # not inside Serve (a plain instance): any unique name will do
            self.replica_id = uuid.uuid4().hex[:8]
        self._lock = threading.Lock()
        self._serial = itertools.count()

    def generate(self, prompt: str, tenant: str = DEFAULT_TENANT, max_new_tokens: int = 64) -> dict:
        """Answer one chat turn greedily, drafting from (and then joining) `tenant`'s pool.

        Returns:
            {"replica", "request_id", "tenant", "output_ids", "text", "finish_reason", "tau",
            "pool_bytes"}: `pool_bytes` is the tenant's pool on this replica after the request.
        Raises:
            PromptError: an empty prompt or one too long for the model.
        """
        ids = self.loaded.encode_chat([{"role": "user", "content": prompt}])
        with self._lock:
            request_id = f"{self.replica_id}-{next(self._serial)}"
            result = decode(self.verifier, self.drafter, ids, DecodeConfig(max_new_tokens, self.node_budget),
                            max_context=self.loaded.max_context, request_id=request_id, tenant=tenant)
            pool = self.drafter.tenant_bytes(tenant)
        return {"replica": self.replica_id, "request_id": request_id, "tenant": tenant,
                "output_ids": result.output_ids, "text": self.loaded.decode(result.output_ids),
                "finish_reason": result.finish_reason, "tau": result.tau, "pool_bytes": pool}

    def pool_bytes(self, tenant: str = DEFAULT_TENANT, others: Sequence[str] = ()) -> dict:
        """Pool bytes on this replica; routed like `generate`, so `tenant` picks the replica.

        Returns:
            {"replica": this replica's id, "pool_bytes": {name: bytes} for `tenant` and `others`}.
        """
        with self._lock:
            return {"replica": self.replica_id,
                    "pool_bytes": {t: self.drafter.tenant_bytes(t) for t in (tenant, *others)}}
