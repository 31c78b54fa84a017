"""Tenant-affinity routing across Oilbird replicas with Ray Serve (oilbird/integrations/ray_serve.py):
the rendezvous choice by hand, then two real replicas (SmolLM2-135M, method sam) behind the router."""

from __future__ import annotations

from collections import Counter

import pytest

# `make vllm` installs Ray Serve (requirements/ray-serve.txt); without it this import fails and says so.
from oilbird.integrations.ray_serve import OilbirdReplica, rendezvous_rank, tenant_affinity_config

# ----------------------------------------------------------------------------------------------
# 1. The rendezvous choice, by hand

IDS = ["r-a", "r-b", "r-c", "r-d"]
TENANTS = [f"tenant-{i}" for i in range(2000)]


def test_rendezvous_is_stable_across_calls_orders_and_processes():
    assert rendezvous_rank("alice", IDS) == rendezvous_rank("alice", reversed(IDS))
    assert sorted(rendezvous_rank("alice", IDS)) == IDS
    # sha256, not hash(): these hold in every process, whatever PYTHONHASHSEED says (computed once).
    assert rendezvous_rank("alice", IDS) == ["r-a", "r-d", "r-b", "r-c"]
    assert rendezvous_rank("default", IDS) == ["r-d", "r-c", "r-a", "r-b"]


def test_rendezvous_spreads_tenants_evenly():
    homes = Counter(rendezvous_rank(t, IDS)[0] for t in TENANTS)
    assert set(homes) == set(IDS)
    assert all(abs(n - len(TENANTS) / 4) < 0.1 * len(TENANTS) for n in homes.values()), homes


def test_removing_a_replica_moves_only_its_tenants_to_their_second_choice():
    before = {t: rendezvous_rank(t, IDS) for t in TENANTS}
    after = {t: rendezvous_rank(t, [i for i in IDS if i != "r-c"])[0] for t in TENANTS}
    moved = {t for t in TENANTS if after[t] != before[t][0]}
    assert moved == {t for t in TENANTS if before[t][0] == "r-c"}
    assert all(after[t] == before[t][1] for t in moved)


# ----------------------------------------------------------------------------------------------
# 2. Two real replicas behind the router

ROUNDS = 4
MAX_NEW = 12
TIMEOUT_S = 120
TOPICS = ["owls", "rivers", "tea", "bridges"]


@pytest.fixture(scope="module")
def handle(smol):
    """A DeploymentHandle to 2 replicas of OilbirdReplica(method="sam") routed by tenant; Serve and
    Ray are shut down after the module. (`smol` first: the converted model copy is cached before
    the two replicas load it at once.)"""
    import ray
    from ray import serve

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             object_store_memory=100 * 1024**2)
    try:
        serve.start(proxy_location="Disabled")
        deployment = serve.deployment(
            OilbirdReplica, name="oilbird", num_replicas=2, max_ongoing_requests=8,
            request_router_config=tenant_affinity_config(), ray_actor_options={"num_cpus": 0.5})
        yield serve.run(deployment.bind(method="sam", torch_threads=1), name="affinity",
                        route_prefix=None)
    finally:
        serve.shutdown()
        ray.shutdown()


def _replica_ids(handle) -> list[str]:
    """Both replicas' ids, learned from cheap `pool_bytes` calls of made-up tenants."""
    seen = set()
    for i in range(64):
        seen.add(handle.pool_bytes.remote(tenant=f"probe-{i}").result(timeout_s=TIMEOUT_S)["replica"])
        if len(seen) == 2:
            return sorted(seen)
    pytest.fail(f"64 tenants all went to {seen}: the router never used the second replica")


def _tenants_on_both(ids: list[str]) -> list[str]:
    """Four tenant names, two homed on each replica by the rendezvous choice (checked, not assumed)."""
    by_home: dict[str, list[str]] = {i: [] for i in ids}
    for n in range(1000):
        name = f"team-{n}"
        if len(by_home[home := rendezvous_rank(name, ids)[0]]) < 2:
            by_home[home].append(name)
    tenants = [t for pair in zip(*by_home.values()) for t in pair]
    assert len(tenants) == 4 and {rendezvous_rank(t, ids)[0] for t in tenants} == set(ids)
    return tenants


def test_each_tenant_stays_on_its_home_replica_and_its_pool_grows_there_only(handle):
    ids = _replica_ids(handle)
    tenants = _tenants_on_both(ids)
    responses: dict[str, list[dict]] = {t: [] for t in tenants}
    for round_ in range(ROUNDS):  # each round: one request per tenant, all four in flight at once
        calls = {t: handle.generate.remote(
                     prompt=f"{t} asks, round {round_}: write one sentence about {TOPICS[round_]}.",
                     tenant=t, max_new_tokens=MAX_NEW) for t in tenants}
        for t, call in calls.items():
            responses[t].append(call.result(timeout_s=TIMEOUT_S))

    homes = {t: {r["replica"] for r in rs} for t, rs in responses.items()}
    assert all(len(h) == 1 for h in homes.values()), f"a tenant was split across replicas: {homes}"
    homes = {t: h.pop() for t, h in homes.items()}
    assert set(homes.values()) == set(ids), f"one replica served every tenant: {homes}"
    assert homes == {t: rendezvous_rank(t, ids)[0] for t in tenants}
    request_ids = [(r["replica"], r["request_id"]) for rs in responses.values() for r in rs]
    assert len(set(request_ids)) == len(request_ids) == ROUNDS * len(tenants)
    assert all(r["output_ids"] and r["text"] for rs in responses.values() for r in rs)
    for t, rs in responses.items():
        grown = [r["pool_bytes"] for r in rs]
        assert 0 < grown[0] and all(a < b for a, b in zip(grown, grown[1:])), (t, grown)

    # Reach each replica through a tenant homed there; it reports every tenant's pool.
    for replica in ids:
        probe = next(t for t in tenants if homes[t] == replica)
        held = handle.pool_bytes.remote(tenant=probe, others=tenants).result(timeout_s=TIMEOUT_S)
        assert held["replica"] == replica
        for t in tenants:
            expected = responses[t][-1]["pool_bytes"] if homes[t] == replica else 0
            assert held["pool_bytes"][t] == expected, (replica, t, held["pool_bytes"])
