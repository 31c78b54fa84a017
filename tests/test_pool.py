"""Cross-request pool: online visibility, tenant isolation, eviction and rebuild."""

import pytest

from oilbird.errors import ConfigError
from oilbird.pool import Pool, PoolConfig, TokenStore
from oilbird.tenants import TenantMap


def test_request_enters_only_when_added():
    store = TokenStore()
    assert store.sam.match([1, 2])[1] == 0
    store.add_request("a", [1, 2, 3])
    state, length = store.sam.match([1, 2])
    assert length == 2 and store.sam.continuation(state, 5) == [3]


def test_tenants_are_isolated():
    pool = Pool()
    pool.get("A").add_request("a1", [10, 11, 12, 13])
    assert pool.get("B").sam.match([10, 11])[1] == 0
    assert pool.get("A").sam.match([10, 11])[1] == 2
    assert pool.tenants() == ["A", "B"]
    with pytest.raises(ConfigError):
        pool.get("")


def test_oldest_requests_are_evicted_and_automaton_rebuilt():
    store = TokenStore(PoolConfig(max_tokens=6))
    store.add_request("r1", [1, 2, 3])
    store.add_request("r2", [4, 5, 6])
    store.add_request("r3", [7, 8, 9])  # evicts r1
    assert [rid for rid, _ in store.requests] == ["r2", "r3"] and store.num_tokens == 6
    store.add_request("r4", [1, 1, 1])  # evicts r2; indexed 12 > 2*6 -> rebuild without r1, r2
    assert store.sam.match([2, 3])[1] == 0  # r1 and r2 are gone from the rebuilt automaton
    assert store.sam.match([5])[1] == 0
    assert store.sam.match([1, 1])[1] == 2
    assert store.sam.match([8, 9])[1] == 2
    assert store.evicted_requests == 2


def test_memory_grows_with_content():
    store = TokenStore()
    empty = store.memory_bytes()
    store.add_request("r", list(range(100)))
    assert store.memory_bytes() > empty


def test_pool_is_a_tenant_map_whose_drop_forgets_a_store():
    pool = Pool(PoolConfig(max_tokens=6))
    assert isinstance(pool, TenantMap)  # so Drafter.drop_tenant and memory_bytes cover it
    pool.get("A").add_request("a1", [1, 2, 3])
    pool.get("B").add_request("b1", [4, 5])
    assert pool.get("A").config.max_tokens == 6  # every store gets the pool's cap
    both = pool.memory_bytes()
    assert both == pool.get("A").memory_bytes() + pool.get("B").memory_bytes()
    assert pool.drop("A") and pool.tenants() == ["B"] and 0 < pool.memory_bytes() < both
    assert pool.get("A").sam.match([1, 2])[1] == 0  # A comes back empty


def test_the_cap_bounds_a_long_run_and_what_the_automaton_indexes():
    cap = 21
    store, uncapped = TokenStore(PoolConfig(max_tokens=cap)), TokenStore()
    for r in range(50):
        tokens = [100 * r + i for i in range(7)]
        store.add_request(f"r{r}", tokens)
        uncapped.add_request(f"r{r}", tokens)
        # The automaton indexes at most twice the cap (it is rebuilt once half is evicted).
        assert store.num_tokens <= cap and store._indexed_tokens <= 2 * cap
    assert [rid for rid, _ in store.requests] == ["r47", "r48", "r49"]  # oldest evicted first
    assert store.evicted_requests == 47
    assert store.memory_bytes() * 8 < uncapped.memory_bytes()  # 350 tokens held vs at most 42
