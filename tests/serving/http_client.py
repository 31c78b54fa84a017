"""Talking to the servers of tests/serving: the `openai` client, completions as token ids, and
/oilbird/metrics and vLLM's /metrics parsed."""

from __future__ import annotations

import time

import httpx
import openai
import pytest
from oilbird_servers import ALICE, MODEL

MAX_NEW = 48
"""The greedy references' length (as tests/conftest.py's E2E_MAX_NEW)."""
GREEDY = dict(temperature=0, extra_body={"return_token_ids": True})


def client(server, key: str | None = ALICE) -> openai.OpenAI:
    # No retries: a 5xx must show as the 5xx, not as a later success.
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key=key or "unused", max_retries=0,
                         timeout=180)


def completion_ids(c: openai.OpenAI, prompt, max_tokens: int, **kw) -> list[int]:
    """The token ids of a non-streamed completion (vLLM's `return_token_ids`)."""
    choice = c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens, **GREEDY,
                                  **kw).choices[0]
    assert choice.token_ids is not None, "vLLM returned no token_ids"
    return list(choice.token_ids)


def streamed_ids(c: openai.OpenAI, prompt, max_tokens: int) -> list[int]:
    ids, finish = [], None
    for chunk in c.completions.create(model=MODEL, prompt=prompt, max_tokens=max_tokens,
                                      stream=True, **GREEDY):
        for choice in chunk.choices:
            ids += choice.token_ids or []
            finish = choice.finish_reason or finish
    assert finish in ("stop", "length"), f"stream ended without a finish reason ({finish})"
    return ids


def first_divergence(a: list[int], b: list[int]) -> str:
    i = next((j for j in range(min(len(a), len(b))) if a[j] != b[j]), min(len(a), len(b)))
    return f"first difference at token {i}: {a[i:i + 4]} vs {b[i:i + 4]} (lengths {len(a)}, {len(b)})"


def oilbird_metrics(server) -> dict[tuple[str, str], float]:
    """/oilbird/metrics as {(metric, tenant): value}."""
    r = httpx.get(f"{server.url}/oilbird/metrics", timeout=60)
    assert r.status_code == 200, f"/oilbird/metrics answered {r.status_code}: {r.text[:300]}"
    out = {}
    for line in r.text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, value = line.rsplit(" ", 1)
        name, _, labels = name_labels.partition("{")
        assert labels.startswith('tenant="') and labels.endswith('"}'), line
        out[(name, labels[len('tenant="'):-2])] = float(value)
    return out


def settled_metrics(server, timeout_s: float = 60) -> dict[tuple[str, str], float]:
    """/oilbird/metrics once two reads 0.5 s apart agree (finished requests are counted by the
    worker a step after the client got its answer)."""
    deadline = time.monotonic() + timeout_s
    last = oilbird_metrics(server)
    while time.monotonic() < deadline:
        time.sleep(0.5)
        now = oilbird_metrics(server)
        if now == last:
            return now
        last = now
    pytest.fail(f"/oilbird/metrics did not settle within {timeout_s} s")


def tenant_delta(before, after, tenant: str) -> dict[str, float]:
    """Per counter (without the oilbird_ prefix): after - before, for one tenant."""
    names = {name for name, t in before.keys() | after.keys() if t == tenant}
    return {name.removeprefix("oilbird_"): after.get((name, tenant), 0) - before.get((name, tenant), 0)
            for name in names}


def unchanged(before, after, tenant: str) -> bool:
    return all(v == 0 for v in tenant_delta(before, after, tenant).values())


def vllm_metric(server, name: str) -> float:
    """The sum of one of vLLM's own /metrics samples over its labels."""
    text = httpx.get(f"{server.url}/metrics", timeout=60).text
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    assert values, f"vLLM's /metrics has no {name}"
    return sum(values)
