"""The servers of tests/serving: how they start, wait, stop (fixtures: tests/serving/conftest.py)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

MODEL = "smollm2-135m"
"""The default model's preset name, which `oilbird serve` serves it as."""
METHOD = "oilbird"
KEYS = {"key-alice": "alice", "key-alice-2": "alice", "key-bob": "bob"}
ALICE, ALICE_2, BOB = "key-alice", "key-alice-2", "key-bob"
VLLM_OPTIONS = ["--max-num-seqs", "8", "--max-model-len", "2048", "--enforce-eager"]
MAX_MODEL_LEN = 2048
STARTUP_TIMEOUT_S = float(os.environ.get("OILBIRD_VLLM_STARTUP_TIMEOUT", "420"))
"""A start takes 20-40 s on an idle 2-core machine; much longer when it is shared."""
LOG_TAIL_LINES = 80


@dataclass
class Server:
    """A server process of this session."""

    name: str
    url: str
    process: subprocess.Popen
    log: Path
    rpc_dir: Path
    """The server's temporary directory (TMPDIR) and where vLLM's processes put their ZeroMQ
    sockets (VLLM_RPC_BASE_PATH): vLLM leaves sockets and `vllm_dist_*` directories in the
    system's temporary directory otherwise, a few hundred after a few runs of this suite."""
    ready: bool = field(default=False)

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log.read_text(errors="replace")
        except OSError as e:
            return f"(no log: {e})"
        return "\n".join(text.splitlines()[-lines:])

    def wait_healthy(self, timeout_s: float = STARTUP_TIMEOUT_S) -> "Server":
        """Block until GET /health answers 200; fail with the log's tail if the server exits or stalls."""
        if self.ready:
            return self
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            rc = self.process.poll()
            if rc is not None:
                pytest.fail(f"{self.name} exited with rc={rc} while starting; log tail "
                            f"({self.log}):\n{self.log_tail()}", pytrace=False)
            try:
                if httpx.get(f"{self.url}/health", timeout=5).status_code == 200:
                    self.ready = True
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(1)
        pytest.fail(f"{self.name} did not answer /health within {timeout_s:.0f} s; log tail "
                    f"({self.log}):\n{self.log_tail()}", pytrace=False)

    def alive(self) -> None:
        """Fail (with the log's tail) if the server has died since it started."""
        rc = self.process.poll()
        if rc is not None:
            pytest.fail(f"{self.name} died (rc={rc}); log tail ({self.log}):\n{self.log_tail()}",
                        pytrace=False)

    def stop(self) -> None:
        """SIGTERM the process group (the server snapshots and shuts its engine down), then SIGKILL."""
        if self.process.poll() is not None:
            print(f"\n{self.name} had already exited (rc={self.process.returncode}); log tail:\n"
                  f"{self.log_tail()}", file=sys.stderr)
            _kill_group(self.process.pid, signal.SIGKILL)  # its engine processes, if any are left
            shutil.rmtree(self.rpc_dir, ignore_errors=True)
            return
        _kill_group(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        _kill_group(self.process.pid, signal.SIGKILL)  # stragglers of the group
        shutil.rmtree(self.rpc_dir, ignore_errors=True)

    def kill(self) -> None:
        """SIGKILL the whole process group at once, as a crash would: no shutdown code runs."""
        _kill_group(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)
        shutil.rmtree(self.rpc_dir, ignore_errors=True)


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(name: str, argv: list[str], log: Path, env: dict[str, str]) -> Server:
    port = _free_port()
    argv = argv + ["--host", "127.0.0.1", "--port", str(port)]
    # A short path of its own (a socket's path has at most 107 bytes): removed when it stops.
    rpc_dir = Path(tempfile.mkdtemp(prefix="oilbird-rpc-"))
    with open(log, "wb") as out:
        out.write(f"$ {' '.join(argv)}\n".encode())
        out.flush()
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1", "TMPDIR": str(rpc_dir),
                                        "VLLM_RPC_BASE_PATH": str(rpc_dir), **env},
                                   cwd=Path(__file__).resolve().parents[2], start_new_session=True)
    return Server(name, f"http://127.0.0.1:{port}", process, log, rpc_dir)
