"""Cross-request pool: online visibility, tenant isolation, eviction and rebuild."""

import pytest

from oilbird.errors import ConfigError
from oilbird.pool import Pool, PoolConfig, TokenStore


def test_request_enters_only_when_added():
    store = TokenStore()
    assert store.sam.match([1, 2])[1] == 0
    store.add_request("a", [1, 2, 3])
    state, length = store.sam.match([1, 2])
    assert length == 2 and store.sam.continuation(state, 5) == [3]


def test_tenants_are_isolated():
    pool = Pool()
    pool.store("A").add_request("a1", [10, 11, 12, 13])
    assert pool.store("B").sam.match([10, 11])[1] == 0
    assert pool.store("A").sam.match([10, 11])[1] == 2
    assert pool.tenants() == ["A", "B"]
    with pytest.raises(ConfigError):
        pool.store("")


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
