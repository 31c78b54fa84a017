"""`oilbird serve`'s server: vLLM's OpenAI-compatible app with tenants and Oilbird's metrics.

This builds the app from vLLM's own launcher functions, as `vllm serve` does
(vllm/entrypoints/launchers/api_server/entry.py), and adds two things: the `TenantMiddleware`
(API key -> tenant, oilbird/tenant_keys.py; vLLM installs it from `--middleware`, we hand it the
keys in `app.state`) and, through FastAPI's public API, a route
`/oilbird/metrics` with per-tenant drafting counters and pool bytes, read from the workers by
vLLM's collective RPC (`OilbirdWorkerMixin.oilbird_stats`). When the server stops (SIGTERM,
Ctrl-C) each worker snapshots its pools as vLLM shuts it down (`OilbirdWorkerMixin.shutdown`).
"""

from __future__ import annotations

import argparse
import logging

from fastapi import FastAPI
from fastapi.responses import PlainTextResponse
from vllm.entrypoints.launchers.api_server.app_state import init_app_state
from vllm.entrypoints.launchers.api_server.entry import build_async_engine_client
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.launcher import serve_http, setup_server

from oilbird.integrations.vllm.metrics import prometheus_text

log = logging.getLogger("oilbird.serve")


async def run(args: argparse.Namespace, keys: dict[str, str] | None) -> None:
    """Serve until stopped. `args` are vLLM's parsed serve arguments (Oilbird's already set in them)."""
    listen_address, sock = setup_server(args, reuse_port=False)
    try:
        async with build_async_engine_client(args) as engine:
            tasks = await engine.get_supported_tasks()
            app = build_app(args, tasks, engine.model_config)
            app.state.oilbird_keys = keys  # read by TenantMiddleware (see oilbird/tenant_keys.py)
            _add_metrics_route(app, engine)
            await init_app_state(engine, app.state, args, tasks)
            log.info("Oilbird: serving on %s (%s)", listen_address,
                     "open: one tenant, no API keys" if keys is None else f"{len(set(keys.values()))} tenants")
            shutdown = await serve_http(app, sock=sock, host=args.host, port=args.port,
                                        log_level=args.uvicorn_log_level,
                                        access_log=not args.disable_uvicorn_access_log)
        await shutdown
    finally:
        sock.close()


def _add_metrics_route(app: FastAPI, engine) -> None:
    async def oilbird_metrics() -> PlainTextResponse:
        stats = await engine.collective_rpc("oilbird_stats", timeout=30)
        return PlainTextResponse(prometheus_text([s for s in stats if s]),
                                 media_type="text/plain; version=0.0.4")
    app.add_api_route("/oilbird/metrics", oilbird_metrics, methods=["GET"])
