"""API keys to tenants, and the ASGI middleware that stamps each request with its tenant.

The key file is JSON, one entry per key: `{"sk-alice-...": "alice", "sk-bob-...": "bob"}` (several
keys may share a tenant). With a key file, every `/v1/...` request must carry
`Authorization: Bearer <key>` of a listed key; a missing or unknown key gets 401 and reaches no
model. Without a key file the server is open and every request belongs to the tenant `default`.

For completion and chat requests the middleware rewrites the JSON body: it sets the tenant in
`vllm_xargs` (vLLM hands it to the worker as `SamplingParams.extra_args`; a tenant the client put
there is overwritten, so no client can draft from another tenant's pool) and salts vLLM's prefix
cache per tenant (`cache_salt`), so that no tenant can time another's cached prompts. A body
that is not a JSON object passes unchanged: vLLM answers it with its own 400.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from oilbird.errors import ConfigError

OPEN_TENANT = "default"
_REWRITTEN = ("/v1/chat/completions", "/v1/completions")


def load_keys(path: Path | str) -> dict[str, str]:
    """The key -> tenant map of a key file.

    Raises:
        ConfigError: unreadable file, not a JSON object of non-empty strings, or no keys.
    """
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"cannot read the API key file {path}: {e}") from None
    except json.JSONDecodeError as e:
        raise ConfigError(f"the API key file {path} is not JSON ({e}); write "
                          '{"<key>": "<tenant>", ...}') from None
    if not isinstance(raw, dict) or not raw:
        raise ConfigError(f"the API key file {path} must be a non-empty JSON object "
                          '{"<key>": "<tenant>", ...}')
    for key, tenant in raw.items():
        if not (isinstance(tenant, str) and tenant and key):
            raise ConfigError(f"the API key file {path}: every key needs a non-empty tenant name "
                              f"(bad entry for a key starting {key[:4]!r})")
    return dict(raw)


def cache_salt(tenant: str) -> str:
    """The prefix-cache salt of a tenant (stable, and not the tenant's name itself)."""
    return hashlib.sha256(f"oilbird-tenant:{tenant}".encode()).hexdigest()[:32]


class TenantMiddleware:
    """ASGI middleware: authenticate `/v1/...` requests and stamp chat/completion bodies with the tenant.

    Args:
        app: the wrapped ASGI app.
        keys: key -> tenant. None: the keys the Starlette app holds in `app.state.oilbird_keys`
            (how `oilbird serve` hands them over, since vLLM builds its middleware from import
            paths without arguments), and open (every request is tenant `default`) if none.
    """

    def __init__(self, app, keys: dict[str, str] | None = None) -> None:
        self.app = app
        self.keys = keys

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        tenant = self._tenant(scope)
        if tenant is None:
            return await _reply(send, 401, "missing or unknown API key: send 'Authorization: Bearer "
                                "<key>' with a key the server's key file lists")
        if scope["method"] == "POST" and scope["path"] in _REWRITTEN:
            body = _stamped(await _read_body(receive), tenant)
            headers = [(k, v) for k, v in scope.get("headers", []) if k != b"content-length"]
            scope = dict(scope, headers=headers + [(b"content-length", str(len(body)).encode())])
            receive = _replay(body, receive)
        return await self.app(scope, receive, send)

    def _tenant(self, scope) -> str | None:
        keys = self.keys
        if keys is None and "app" in scope:
            keys = getattr(scope["app"].state, "oilbird_keys", None)
        if keys is None:
            return OPEN_TENANT
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1")
        scheme, _, key = auth.partition(" ")
        return keys.get(key.strip()) if scheme.lower() == "bearer" else None


def _stamped(body: bytes, tenant: str) -> bytes:
    try:
        request = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return body  # vLLM answers malformed JSON with its own 400
    if not isinstance(request, dict):
        return body
    xargs = request.get("vllm_xargs")
    request["vllm_xargs"] = {**(xargs if isinstance(xargs, dict) else {}), "oilbird_tenant": tenant}
    request["cache_salt"] = cache_salt(tenant)
    return json.dumps(request).encode()


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            break
    return b"".join(chunks)


def _replay(body: bytes, upstream):
    """A `receive` that yields the rewritten body once, then the client's own messages (so that a
    streaming response still learns when the client disconnects)."""
    sent = False

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await upstream()
    return receive


async def _reply(send, status: int, message: str) -> None:
    payload = json.dumps({"error": {"message": message, "type": "authentication_error",
                                    "code": status}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})
