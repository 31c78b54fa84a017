"""Pools that survive restarts: a request log in SQLite and atomic snapshots of what text can't rebuild.

A server's pools are built from its past traffic. `PoolState` keeps, in a state directory:

- `requests.sqlite`: every finished request (tenant, prompt ids, output ids, time), appended and
  committed as it finishes, so a crash (even `kill -9`) loses none that finished. At start the
  log is replayed into the drafter in order: the lexical pools (suffix trees, automata, n-gram and
  successor tables) are rebuilt from text alone.
- `snapshots/<tenant>.safetensors`: what text alone cannot rebuild, the semantic source's keys
  (the verifier's hidden states), written every `snapshot_every` finished requests and at
  shutdown, atomically (a temporary file, then a rename), so a snapshot is either the old one or
  the new one. A snapshot that cannot be read is reported and skipped: that tenant restarts with
  its lexical pools from the log and an empty semantic store, never a crash. After `kill -9`, the
  semantic records of requests finished since the last snapshot are lost; their text is not.

The drafter's side is `Drafter.tenant_snapshot` / `restore_tenant_snapshot` (tensors per tenant)
and the protocol itself for the replay (a logged request is observed as one verified chain with
no hidden states, so drafters harvest only its text).
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
import torch

from oilbird.drafters.base import Drafter
from oilbird.tree import DraftTree
from oilbird.verifier import Verification

LOG_NAME = "requests.sqlite"
SNAPSHOT_DIR = "snapshots"


class RequestLog:
    """An append-only SQLite log of finished requests."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(str(path), check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")  # appends do not block readers; crash-safe
        self.db.execute("CREATE TABLE IF NOT EXISTS requests (id INTEGER PRIMARY KEY, tenant TEXT "
                        "NOT NULL, prompt BLOB NOT NULL, output BLOB NOT NULL, time REAL NOT NULL)")
        self.db.commit()

    def append(self, tenant: str, prompt_ids: list[int], output_ids: list[int]) -> int:
        """Log one finished request (committed at once); returns its id."""
        cursor = self.db.execute("INSERT INTO requests (tenant, prompt, output, time) VALUES (?, ?, ?, ?)",
                                 (tenant, _pack(prompt_ids), _pack(output_ids), time.time()))
        self.db.commit()
        return int(cursor.lastrowid)

    def rows(self) -> Iterator[tuple[int, str, list[int], list[int]]]:
        """(id, tenant, prompt ids, output ids) of every logged request, oldest first."""
        for rid, tenant, prompt, output in self.db.execute(
                "SELECT id, tenant, prompt, output FROM requests ORDER BY id"):
            yield rid, tenant, _unpack(prompt), _unpack(output)

    def __len__(self) -> int:
        return self.db.execute("SELECT COUNT(*) FROM requests").fetchone()[0]

    def close(self) -> None:
        self.db.close()


def _pack(ids: list[int]) -> bytes:
    return np.asarray(ids, dtype="<i4").tobytes()


def _unpack(blob: bytes) -> list[int]:
    return np.frombuffer(blob, dtype="<i4").tolist()


def replay(drafter: Drafter, request_id: str, tenant: str, prompt_ids: list[int], output_ids: list[int]) -> None:
    """Feed one past request to `drafter` through its protocol: start, one verified chain, stop.

    The chain anchor -> output is observed as accepted in full, each node's argmax (and top-1) the
    token that followed it; there are no hidden states, so only text is harvested.
    """
    drafter.start_request(request_id, prompt_ids, tenant)
    try:
        if output_ids and prompt_ids:
            tree = DraftTree.chain(prompt_ids[-1], output_ids[:-1], "log")
            argmax = torch.tensor(output_ids, dtype=torch.long)  # [N]: node j was followed by output j
            drafter.observe(request_id, Verification(
                tree=tree, prefix_len=len(prompt_ids) - 1, argmax=argmax, topk_ids=argmax[:, None],
                topk_logits=torch.zeros(len(output_ids), 1), path=list(range(1, len(output_ids))),
                committed=list(output_ids), finished=False, hidden=None))
    finally:
        drafter.stop_request(request_id)


class PoolState:
    """The request log and snapshots of one drafter's pools in `state_dir`.

    Args:
        state_dir: created if missing.
        drafter: the drafter whose pools these are.
        snapshot_every: snapshot after this many finished requests.
        log: receives what the restore found (e.g. an unreadable snapshot).
    """

    def __init__(self, state_dir: Path, drafter: Drafter, snapshot_every: int = 64,
                 log: Callable[[str], None] = print) -> None:
        self.dir = Path(state_dir)
        (self.dir / SNAPSHOT_DIR).mkdir(parents=True, exist_ok=True)
        self.drafter = drafter
        self.snapshot_every = snapshot_every
        self.log = log
        self.requests = RequestLog(self.dir / LOG_NAME)
        self.since_snapshot = 0

    def restore(self) -> dict[str, int]:
        """Rebuild the pools: replay the log, then load each tenant's snapshot.

        Returns:
            Requests replayed per tenant.
        """
        replayed: dict[str, int] = {}
        for rid, tenant, prompt, output in self.requests.rows():
            replay(self.drafter, f"log-{rid}", tenant, prompt, output)
            replayed[tenant] = replayed.get(tenant, 0) + 1
        for path in sorted((self.dir / SNAPSHOT_DIR).glob("*.safetensors")):
            self._load_snapshot(path)
        return replayed

    def _load_snapshot(self, path: Path) -> None:
        from safetensors.torch import load_file

        tenant = _tenant_of(path)
        try:
            self.drafter.restore_tenant_snapshot(tenant, load_file(str(path)))
        except Exception as e:  # noqa: BLE001 - any damage: report it, rebuild from the log
            self.log(f"oilbird: snapshot {path} is unreadable ({type(e).__name__}: {e}); tenant "
                     f"{tenant!r} restarts from the request log (its semantic records are lost)")

    def record(self, tenant: str, prompt_ids: list[int], output_ids: list[int]) -> None:
        """Log a finished request; snapshot every `snapshot_every` of them."""
        self.requests.append(tenant, prompt_ids, output_ids)
        self.since_snapshot += 1
        if self.since_snapshot >= self.snapshot_every:
            self.snapshot()

    def snapshot(self) -> list[Path]:
        """Write every tenant's snapshot now, atomically; returns the files written."""
        from safetensors.torch import save_file

        written = []
        for tenant in self.drafter.snapshot_tenants():
            tensors = self.drafter.tenant_snapshot(tenant)
            if not tensors:
                continue
            path = self.dir / SNAPSHOT_DIR / f"{tenant.encode().hex()}.safetensors"
            tmp = path.with_suffix(".tmp")
            save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp))
            os.replace(tmp, path)  # atomic: readers see the old snapshot or the new one
            written.append(path)
        self.since_snapshot = 0
        return written

    def close(self) -> None:
        self.requests.close()


def _tenant_of(path: Path) -> str:
    try:
        return bytes.fromhex(path.stem).decode()
    except ValueError:
        return path.stem
