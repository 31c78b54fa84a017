"""The semantic memory on hand-built keys (oilbird.semantic_store): search, eviction, record ids."""

import pytest
import torch

from oilbird.semantic_index import FILE_BATCH, SYNC_ROWS_PER_SEARCH
from oilbird.semantic_store import KeyMatrix, RejectedPool, TraceStore, normalize


def basis(i: int, dim: int = 8) -> torch.Tensor:
    v = torch.zeros(dim)
    v[i] = 1.0
    return v


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_key_matrix_scores_are_cosines_and_survive_growth(dtype):
    keys = KeyMatrix(16, "cpu", dtype)
    gen = torch.Generator().manual_seed(0)
    raw = torch.randn(3000, 16, generator=gen)  # more than the initial capacity: forces a regrowth
    keys.append(normalize(raw))
    query = normalize(torch.randn(1, 16, generator=gen))[0]
    expected = normalize(raw) @ query
    assert torch.allclose(keys.scores(query, 3000), expected, atol=0.02)
    assert keys.bytes_per_row() == (32 if dtype == "float16" else 20)


def test_store_search_respects_visibility_and_values_stop_at_the_request_end():
    store = TraceStore(8, index="exact")
    store.begin_request()
    store.add([10, 11, 12], torch.stack([basis(0), basis(1), basis(2)]))
    store.begin_request()
    store.add([20, 21], torch.stack([basis(2), basis(3)]))
    sims, ids = store.search(basis(2), k=2, before_id=5)
    assert set(ids) == {2, 3} and sims[0] == pytest.approx(1.0, abs=1e-3)
    _, ids = store.search(basis(2), k=1, before_id=3)  # record 3 not visible yet
    assert ids == [2]
    assert store.value(0, 5, len(store)) == [11, 12]  # never runs into the next request
    assert store.value(3, 5, len(store)) == [21]
    assert store.value(3, 5, visible_end=4) == []  # nor past what is committed


def test_store_evicts_oldest_requests_first():
    store = TraceStore(8, max_records=10, index="exact")
    for r in range(4):
        store.begin_request()
        store.add([100 * r + i for i in range(4)], torch.stack([basis(i) for i in range(4)]))
    assert len(store) <= 10 and store.evicted_records >= 6
    assert store.tokens[0] % 100 == 0  # a whole request went
    assert store.value(0, 10, len(store)) == store.tokens[1:4]


@pytest.mark.parametrize("dtype", ["float16", "int8"])
def test_the_lists_find_every_stored_key_and_respect_visibility(dtype):
    # A stored key's nearest centroid is the list it was filed under, so querying it probes that
    # list first: the lists always find a record's own key, whatever else they miss.
    gen = torch.Generator().manual_seed(1)
    keys = normalize(torch.randn(900, 16, generator=gen))
    exact, lists = TraceStore(16, dtype=dtype, index="exact"), TraceStore(16, dtype=dtype, index="lists")
    for store in (exact, lists):
        store.add(list(range(900)), keys)
    for q in range(0, 900, 37):
        assert lists.search(keys[q], 1, 900)[1] == [q]
    _, ids = lists.search(keys[899], 3, before_id=899)
    assert 899 not in ids and len(ids) == 3  # invisible records never come back
    sims, _ = lists.search(keys[5], 8, 900)
    assert sims == sorted(sims, reverse=True)
    assert sims[0] == pytest.approx(exact.search(keys[5], 1, 900)[0][0], abs=1e-3)  # int8: float32 vs float16 sums


def test_the_lists_index_a_bounded_slice_per_search_and_the_rest_is_searched_exactly():
    gen = torch.Generator().manual_seed(2)
    n = 2 * SYNC_ROWS_PER_SEARCH + 17
    assert 17 < FILE_BATCH
    keys = normalize(torch.randn(n, 16, generator=gen))
    exact, lists = TraceStore(16, index="exact"), TraceStore(16, index="lists")
    for store in (exact, lists):
        store.add(list(range(n)), keys)
    probe = n - 5  # a record the first search cannot have indexed yet
    sims, ids = lists.search(keys[probe], 3, before_id=n)
    assert lists.ann.indexed_rows(0) == SYNC_ROWS_PER_SEARCH  # one slice, not the whole store
    assert ids[0] == probe and sims[0] == pytest.approx(1.0, abs=1e-3)  # found by the exact tail
    assert lists.search(keys[probe], 3, before_id=probe)[1][0] != probe  # visibility still holds
    for _ in range(3):
        lists.search(keys[0], 1, before_id=n)
    assert lists.ann.indexed_rows(0) == n - 17  # caught up; fewer than FILE_BATCH rows wait
    for q in range(0, n, 97):
        assert lists.search(keys[q], 1, before_id=n)[1] == [q]
    lists.add([0] * 3, keys[:3])  # new records: searched exactly until the next syncs index them
    assert lists.search(keys[1], 1, before_id=n + 3)[1][0] in (1, n + 1)


def test_the_lists_survive_eviction_without_a_rebuild():
    # HNSW could not delete, so every eviction threw the index away and each search then read the
    # whole store while it was rebuilt; the lists drop the evicted ids and go on.
    gen = torch.Generator().manual_seed(3)
    store = TraceStore(16, index="lists", max_records=600)
    first = normalize(torch.randn(500, 16, generator=gen))
    store.begin_request()
    store.add(list(range(500)), first)
    store.search(first[0], 1, before_id=500)  # trains and indexes all 500
    index = store.ann
    second = normalize(torch.randn(300, 16, generator=gen))
    store.begin_request()
    store.add(list(range(500, 800)), second)  # passes the cap: the first request goes
    assert store.evicted_records == 500 and len(store) == 300
    for q in range(0, 300, 23):
        sims, ids = store.search(second[q], 2, before_id=800)
        assert ids[0] == q and store.tokens[ids[0]] == 500 + q  # indices after the eviction
    assert store.ann is index  # the same lists, not a new index
    assert max(store.search(first[7], 5, before_id=800)[1]) < len(store)  # no evicted row comes back


def test_the_lists_are_retrained_on_a_grown_store_without_a_gap():
    gen = torch.Generator().manual_seed(4)
    store = TraceStore(16, index="lists")
    keys = normalize(torch.randn(4000, 16, generator=gen))
    store.add(list(range(500)), keys[:500])
    store.search(keys[0], 1, before_id=500)
    first = store.ann
    assert first.trained_rows == 500
    for n in range(500, 4000, 250):  # the store grows 8x; every stored key stays findable
        store.add(list(range(n, n + 250)), keys[n:n + 250])
        for q in (0, n, n + 249):
            assert store.search(keys[q], 1, before_id=n + 250)[1] == [q]
    assert store.ann is not first and store.ann.trained_rows >= 4 * 500  # retrained, and swapped in
    assert store.successor is None or store.successor.trained_rows >= 4 * store.ann.trained_rows


def test_rejected_pool_matches_the_anchor_token_and_the_watermark():
    pool = RejectedPool(capacity=4, dim=8)
    pool.add(torch.stack([basis(0), basis(0)]), [5, 6], [[7, 8], [9]])  # ids 0, 1
    assert pool.next_id == 2
    assert pool.search(basis(0), anchor=6, k=4, before_id=2)[1] == [1]
    assert pool.search(basis(0), anchor=6, k=4, before_id=1) == ([], [])  # id 1 is not below 1
    assert pool.search(basis(0), anchor=99, k=4, before_id=2) == ([], [])
    pool.add(torch.stack([basis(1)] * 3), [1, 2, 3], [[1], [2], [3]])  # ids 2-4: id 4 overwrites id 0
    assert pool.size == 4 and pool.next_id == 5
    assert pool.search(basis(0), anchor=5, k=4, before_id=5) == ([], [])
    _, slots = pool.search(basis(1), anchor=3, k=4, before_id=5)
    assert slots == [4 % 4] and pool.values[slots[0]] == [3]  # record id lives in slot id % capacity
    pool.add(torch.stack([basis(2)] * 6), list(range(10, 16)), [[t] for t in range(10, 16)])  # > capacity
    assert pool.next_id == 11 and sorted(pool.ids) == [7, 8, 9, 10]  # only the newest 4 kept


def test_record_ids_survive_eviction():
    store = TraceStore(8, max_records=10, index="exact")
    for r in range(3):
        store.begin_request()
        store.add([100 * r + i for i in range(4)], torch.stack([basis(i) for i in range(4)]))
    assert store.evicted_records > 0 and store.next_id == 12
    assert store.id_of(0) == store.evicted_records and store.index_of(store.id_of(3)) == 3
    assert store.index_of(0) < 0  # evicted
    newest = store.index_of(11)
    assert store.tokens[newest] == 203
    assert store.count_before(11) == newest and store.count_before(0) == 0 and store.count_before(99) == len(store)
    # A watermark taken before an add that evicts still hides exactly the added records.
    mark = store.next_id
    store.add([300, 301, 302], torch.stack([basis(5), basis(6), basis(7)]))
    _, ids = store.search(basis(7), k=20, before_id=mark)
    assert {store.tokens[i] for i in ids}.isdisjoint({300, 301, 302}) and len(ids) == store.count_before(mark)


def test_interleaved_owners_never_splice_one_requests_continuation_onto_another():
    """Two requests of one tenant add in turns: each add by the other owner opens a segment, so a
    value stops where the other request's records begin (cut short, never spliced)."""
    store = TraceStore(8, index="exact")
    keys = torch.stack([basis(0), basis(1)])
    store.add([10, 11], keys, owner="a")  # indices 0-1
    store.add([20, 21], keys, owner="b")  # 2-3
    store.add([12, 13], keys, owner="a")  # 4-5
    store.add([14], keys[:1], owner="a")  # 6: a's newest segment continues
    store.add([22], keys[:1], owner="b")  # 7
    assert store.value(0, 10, len(store)) == [11]  # not 20: b's records intervene
    assert store.value(2, 10, len(store)) == [21]
    assert store.value(4, 10, len(store)) == [13, 14]
    assert store.value(6, 10, len(store)) == [] and store.value(7, 10, len(store)) == []
    assert [store.segment_end(i) for i in range(8)] == [2, 2, 4, 4, 7, 7, 7, 8]


def test_serial_requests_are_one_segment_each_and_a_reused_id_opens_a_new_one():
    store = TraceStore(8, index="exact")
    keys = torch.stack([basis(0), basis(1)])
    store.begin_request("r")  # what a drafter does at each start_request
    store.add([10, 11], keys, owner="r")
    store.add([12], keys[:1], owner="r")
    store.begin_request("r")  # a new request with the same id
    store.add([20, 21], keys, owner="r")
    assert store.value(0, 10, len(store)) == [11, 12]  # one request: one segment
    assert store.value(2, 10, len(store)) == [] and store.value(3, 10, len(store)) == [21]
    store.begin_request("s")
    store.begin_request("t")  # an empty segment changes hands instead of piling up
    store.add([30], keys[:1], owner="u")  # and passes to whoever adds first
    assert store.starts == [0, 3, 5] and store.owners == ["r", "r", "u"]


def test_eviction_keeps_each_segments_owner():
    store = TraceStore(8, max_records=10, index="exact")
    keys = torch.stack([basis(i) for i in range(3)])
    for turn in range(4):  # a, b, a, b, ...: 3 records per add, 24 in all
        for owner in ("a", "b"):
            store.add([100 * turn + (0 if owner == "a" else 50) + i for i in range(3)], keys, owner=owner)
    assert len(store) <= 10 and store.starts[0] == 0 and len(store.starts) == len(store.owners)
    for start, owner in zip(store.starts, store.owners):  # each segment's tokens are its owner's
        mine = {t % 100 < 50 for t in store.tokens[start:store.segment_end(start)]}
        assert mine == {owner == "a"}
    store.add([999], keys[:1], owner=store.owners[-1])  # the newest owner continues its segment
    assert store.value(len(store) - 2, 5, len(store)) == [999]


def test_rejected_pool_search_equals_a_scan_of_the_ring_after_many_overwrites():
    gen = torch.Generator().manual_seed(4)
    pool = RejectedPool(capacity=16, dim=8)
    for _ in range(40):  # 40 adds of 1-5 records: the ring is overwritten many times over
        m = int(torch.randint(1, 6, (1,), generator=gen))
        tokens = torch.randint(0, 4, (m,), generator=gen).tolist()
        pool.add(torch.randn(m, 8, generator=gen), tokens, [[t] for t in tokens])
        query = normalize(torch.randn(1, 8, generator=gen))[0]
        anchor = int(torch.randint(0, 4, (1,), generator=gen))
        before = pool.next_id - int(torch.randint(0, 3, (1,), generator=gen))
        held = [s for s in range(pool.size) if pool.tokens[s] == anchor and pool.ids[s] < before]
        expected = sorted(held, key=lambda s: -float(pool.keys[s].float() @ query))[:3]
        sims, slots = pool.search(query, anchor, k=3, before_id=before)
        assert sorted(slots) == sorted(expected)
        assert all(pool.tokens[s] == anchor for s in slots)
    assert sum(len(v) for v in pool.slots_of.values()) == pool.size  # each slot indexed once
