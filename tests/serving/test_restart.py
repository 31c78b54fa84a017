"""Pools survive restarts of `oilbird serve --state-dir` (oilbird/pool_state.py), over HTTP.

One story, three servers on one state directory:
1. alice sends two requests; SIGTERM: the server logs both and snapshots alice's semantic keys.
2. A new server holds alice's pool before any request; alice's repeat of an old
   prompt drafts from it, while bob, whose pool is empty, drafts far less on the same prompt;
   alice sends a new prompt; then `kill -9`, so no snapshot is written.
3. A third server: every request is still in the log, alice's snapshot is the one of step 1 (only
   the semantic records since it are lost), and alice's repeat of the prompt of step 2 drafts
   from the text the log kept.
"""

from __future__ import annotations

import json
import sqlite3
import sys

import pytest
from http_client import client, completion_ids, settled_metrics, tenant_delta
from oilbird_servers import ALICE, BOB, KEYS, METHOD, MODEL, VLLM_OPTIONS, Server, start

from oilbird.pool_state import LOG_NAME, SNAPSHOT_DIR

MAX_TOKENS = 40
PROMPTS = ["A short story about a lighthouse keeper who finds a message in a bottle:",
           "Three reasons why bees matter to farmers, explained simply:",
           "A recipe for a quick tomato soup, step by step:"]


def serve(state_dir, keys, log, n: int) -> Server:
    return start(f"oilbird serve #{n}",
                 [sys.executable, "-m", "oilbird.cli", "serve", "--model", MODEL, "--method", METHOD,
                  "--api-keys", str(keys), "--state-dir", str(state_dir), "--snapshot-every", "1000",
                  *VLLM_OPTIONS],
                 log, {}).wait_healthy()


def accepted(server: Server, key: str, tenant: str, prompt: str) -> tuple[float, int]:
    """(draft tokens accepted, tokens generated) for one greedy completion of `prompt`."""
    before = settled_metrics(server)
    out = completion_ids(client(server, key), prompt, MAX_TOKENS)
    delta = tenant_delta(before, settled_metrics(server), tenant)
    return delta["accepted_tokens_total"], len(out)


def pool_bytes(server: Server, tenant: str) -> float:
    return settled_metrics(server).get(("oilbird_pool_bytes", tenant), 0.0)


def logged(state_dir) -> list[str]:
    db = sqlite3.connect(str(state_dir / LOG_NAME))
    try:
        return [t for (t,) in db.execute("SELECT tenant FROM requests ORDER BY id")]
    finally:
        db.close()


@pytest.fixture(scope="module")
def state(tmp_path_factory):
    root = tmp_path_factory.mktemp("restart")
    keys = root / "keys.json"
    keys.write_text(json.dumps(KEYS))
    servers: list[Server] = []
    yield root, keys, servers
    for server in servers:
        server.stop()


def test_sigterm_keeps_the_pools_and_kill_9_loses_only_what_came_after_the_last_snapshot(state):
    root, keys, servers = state
    state_dir = root / "state"
    snapshot = state_dir / SNAPSHOT_DIR / f"{'alice'.encode().hex()}.safetensors"

    # 1. Two requests of alice, then SIGTERM.
    first = serve(state_dir, keys, root / "serve-1.log", 1)
    servers.append(first)
    for prompt in PROMPTS[:2]:
        completion_ids(client(first, ALICE), prompt, MAX_TOKENS)
    assert pool_bytes(first, "alice") > 0
    first.stop()
    assert first.process.returncode is not None
    assert logged(state_dir) == ["alice", "alice"]
    assert snapshot.is_file(), f"no snapshot of alice after SIGTERM; log tail:\n{first.log_tail()}"
    snapshot_bytes = snapshot.read_bytes()

    # 2. Restarted: alice's pool is back before any request, and her old prompt drafts from it.
    second = serve(state_dir, keys, root / "serve-2.log", 2)
    servers.append(second)
    assert pool_bytes(second, "alice") > 0, "alice's pool was not restored"
    alice_acc, alice_len = accepted(second, ALICE, "alice", PROMPTS[0])
    bob_acc, bob_len = accepted(second, BOB, "bob", PROMPTS[0])
    assert alice_len == bob_len  # greedy: the same text for both
    assert alice_acc >= alice_len / 2, f"alice's repeat accepted {alice_acc} of {alice_len} drafts"
    assert alice_acc >= bob_acc + 10, f"alice (old traffic) {alice_acc} vs bob (none) {bob_acc}"
    completion_ids(client(second, ALICE), PROMPTS[2], MAX_TOKENS)
    settled_metrics(second)  # the finished request is logged by the worker a step later
    second.kill()  # every process of the server at once: no shutdown, no snapshot

    # 3. Nothing logged is lost; the semantic keys are those of the last snapshot (step 1).
    assert logged(state_dir) == ["alice", "alice", "alice", "bob", "alice"]
    assert snapshot.read_bytes() == snapshot_bytes, "a snapshot was written although the server was killed"
    third = serve(state_dir, keys, root / "serve-3.log", 3)
    servers.append(third)
    assert pool_bytes(third, "bob") > 0, "bob's text (logged, never snapshotted) was not replayed"
    acc, length = accepted(third, ALICE, "alice", PROMPTS[2])
    assert acc >= length / 2, f"alice's prompt of the killed server accepted {acc} of {length}"
