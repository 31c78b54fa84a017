"""Pools that survive restarts (oilbird/pool_state.py): the request log, its replay, snapshots."""

from __future__ import annotations

import os
import sqlite3

import pytest
import torch

from oilbird.drafters import make_drafter
from oilbird.pool_state import PoolState, RequestLog, replay

PROMPT = [1, 2, 3]
OUTPUT = [40, 41, 42, 43, 44, 45, 46, 47]


def drafted(drafter, tenant: str, prompt: list[int]) -> list[int]:
    """The tokens of the drafter's tree for a fresh request of `tenant` with `prompt`."""
    drafter.start_request("probe", prompt, tenant)
    try:
        return drafter.propose("probe", 16).tokens[1:]
    finally:
        drafter.stop_request("probe")


def test_the_log_keeps_every_request_in_order_across_reopenings(tmp_path):
    log = RequestLog(tmp_path / "log.sqlite")
    assert log.append("a", PROMPT, OUTPUT) == 1 and log.append("b", [9], []) == 2
    log.close()
    again = RequestLog(tmp_path / "log.sqlite")
    assert list(again.rows()) == [(1, "a", PROMPT, OUTPUT), (2, "b", [9], [])] and len(again) == 2


@pytest.mark.parametrize("method", ["suffix", "sam", "goose", "tr"])
def test_a_restart_rebuilds_the_lexical_pools_from_the_log(tmp_path, method):
    before = PoolState(tmp_path, make_drafter(method), snapshot_every=100)
    replay(before.drafter, "r1", "alice", PROMPT, OUTPUT)  # as served
    before.record("alice", PROMPT, OUTPUT)
    expected = drafted(before.drafter, "alice", [7, 40, 41])
    assert 42 in expected  # the drafter learned the old traffic
    before.close()

    after = PoolState(tmp_path, make_drafter(method), snapshot_every=100)
    assert after.restore() == {"alice": 1}
    assert drafted(after.drafter, "alice", [7, 40, 41]) == expected
    assert 42 not in drafted(after.drafter, "bob", [7, 40, 41])  # tenants stay apart


def test_a_snapshot_is_written_every_n_requests_and_atomically(tmp_path):
    drafter = make_drafter("oilbird")
    state = PoolState(tmp_path, drafter, snapshot_every=2)
    hidden = torch.randn(len(OUTPUT), 8)
    serve_with_hidden(drafter, "alice", hidden)
    state.record("alice", PROMPT, OUTPUT)
    assert not list((tmp_path / "snapshots").iterdir())
    serve_with_hidden(drafter, "alice", hidden, rid="r2")
    state.record("alice", PROMPT, OUTPUT)
    files = list((tmp_path / "snapshots").iterdir())
    assert [f.suffix for f in files] == [".safetensors"]  # no temporary file left behind


def test_a_corrupt_snapshot_is_reported_and_the_tenant_rebuilt_from_the_log(tmp_path):
    drafter = make_drafter("oilbird")
    state = PoolState(tmp_path, drafter, snapshot_every=1)
    serve_with_hidden(drafter, "alice", torch.randn(len(OUTPUT), 8))
    state.record("alice", PROMPT, OUTPUT)
    (snapshot,) = (tmp_path / "snapshots").iterdir()
    snapshot.write_bytes(b"garbage" * 10)
    messages = []
    after = PoolState(tmp_path, make_drafter("oilbird"), log=messages.append)
    assert after.restore() == {"alice": 1}
    assert "unreadable" in messages[0] and "'alice'" in messages[0]
    assert 42 in drafted(after.drafter, "alice", [7, 40, 41])  # the host's pool came from the log


def test_a_snapshot_restores_the_semantic_records(tmp_path):
    drafter = make_drafter("oilbird")
    state = PoolState(tmp_path, drafter, snapshot_every=1)
    serve_with_hidden(drafter, "alice", torch.randn(len(OUTPUT), 8))
    state.record("alice", PROMPT, OUTPUT)
    before = drafter.tenant_snapshot("alice")
    after = PoolState(tmp_path, make_drafter("oilbird"))
    after.restore()
    restored = after.drafter.tenant_snapshot("alice")
    assert before.keys() == restored.keys()
    assert all(torch.equal(before[k], restored[k]) for k in before)


def serve_with_hidden(drafter, tenant, hidden, rid="r1"):
    """Serve PROMPT -> OUTPUT as one verified chain with hidden states (as an engine would)."""
    from oilbird.tree import DraftTree
    from oilbird.verifier import Verification

    drafter.start_request(rid, PROMPT, tenant)
    tree = DraftTree.chain(PROMPT[-1], OUTPUT[:-1], "x")
    argmax = torch.tensor(OUTPUT)
    drafter.observe(rid, Verification(tree=tree, prefix_len=2, argmax=argmax, topk_ids=argmax[:, None],
                                      topk_logits=torch.zeros(len(OUTPUT), 1),
                                      path=list(range(1, len(OUTPUT))), committed=OUTPUT,
                                      finished=False, hidden=hidden))
    drafter.stop_request(rid)
