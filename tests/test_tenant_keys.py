"""API keys -> tenants, and the ASGI middleware that stamps requests (oilbird/tenant_keys.py)."""

from __future__ import annotations

import asyncio
import json

import pytest

from oilbird.errors import ConfigError
from oilbird.tenant_keys import TenantMiddleware, cache_salt, load_keys


def test_load_keys_reads_a_json_object_and_names_every_mistake(tmp_path):
    good = tmp_path / "keys.json"
    good.write_text(json.dumps({"k1": "alice", "k2": "alice", "k3": "bob"}))
    assert load_keys(good) == {"k1": "alice", "k2": "alice", "k3": "bob"}
    for text, match in [("[1]", "JSON object"), ("{}", "JSON object"), ("{nope", "not JSON"),
                        ('{"k": ""}', "non-empty tenant"), ('{"k": 3}', "non-empty tenant")]:
        bad = tmp_path / "bad.json"
        bad.write_text(text)
        with pytest.raises(ConfigError, match=match):
            load_keys(bad)
    with pytest.raises(ConfigError, match="cannot read"):
        load_keys(tmp_path / "missing.json")


class Recorder:
    """An ASGI app that records the scope and body it received and answers 200."""

    def __init__(self):
        self.calls = []

    async def __call__(self, scope, receive, send):
        message = await receive()
        self.calls.append((scope, message.get("body", b"")))
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def call(app, path, body=b"", key=None, method="POST"):
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if key is not None:
        headers.append((b"authorization", f"Bearer {key}".encode()))
    scope = {"type": "http", "path": path, "method": method, "headers": headers}
    sent = []

    async def receive():
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message):
        sent.append(message)

    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], b"".join(m.get("body", b"") for m in sent[1:])


def test_a_missing_or_unknown_key_gets_401_and_reaches_no_model():
    inner = Recorder()
    app = TenantMiddleware(inner, keys={"k1": "alice"})
    for key in (None, "wrong"):
        status, body = call(app, "/v1/chat/completions", b"{}", key=key)
        assert status == 401 and b"API key" in body
    assert inner.calls == []
    assert call(app, "/health", method="GET")[0] == 200  # outside /v1/: open (health checks, metrics)


def test_the_body_is_stamped_with_the_keys_tenant_whatever_the_client_sent():
    inner = Recorder()
    app = TenantMiddleware(inner, keys={"k1": "alice"})
    body = json.dumps({"model": "m", "messages": [], "vllm_xargs": {"oilbird_tenant": "bob", "x": 1},
                       "cache_salt": "mine"}).encode()
    assert call(app, "/v1/chat/completions", body, key="k1")[0] == 200
    scope, received = inner.calls[0]
    request = json.loads(received)
    assert request["vllm_xargs"] == {"oilbird_tenant": "alice", "x": 1}
    assert request["cache_salt"] == cache_salt("alice") != cache_salt("bob")
    assert dict(scope["headers"])[b"content-length"] == str(len(received)).encode()


def test_malformed_json_passes_unchanged_for_the_server_to_refuse():
    inner = Recorder()
    app = TenantMiddleware(inner, keys=None)
    assert call(app, "/v1/completions", b"{not json")[0] == 200
    assert inner.calls[0][1] == b"{not json"


def test_without_keys_every_request_is_the_open_tenant():
    inner = Recorder()
    call(TenantMiddleware(inner), "/v1/completions", b'{"prompt": "x"}')
    assert json.loads(inner.calls[0][1])["vllm_xargs"] == {"oilbird_tenant": "default"}
