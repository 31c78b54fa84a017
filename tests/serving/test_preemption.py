"""Preempted and aborted requests leave Oilbird's state consistent (a server with a tiny KV cache).

vLLM preempts running requests when its KV cache is full and later resumes them by recomputing
their prompt and output; the drafter keeps such a request's state (it is neither finished nor
restarted) and must go on drafting from where it was. A client that drops its stream aborts the
request; the drafter must stop it (it joins the pool with what it committed). Checked: outputs
under preemption equal vLLM's without speculation, vLLM really preempted, every request is
counted once, the committed tokens are the tokens the clients received, nothing stays in flight,
and the server goes on serving.
"""

from __future__ import annotations

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from http_client import client, settled_metrics, tenant_delta, vllm_metric
from oilbird_servers import ALICE, BOB, KEYS, METHOD, MODEL, start

CLIENTS = 6
MAX_TOKENS = 96
KV_BLOCKS = 6
"""128-token blocks on vLLM's CPU backend: 768 tokens of KV cache for 6 requests of ~230 tokens."""
PROMPT = ("Here is a list of everyday objects and what each one is used for. A kettle boils water "
          "for tea. A ladder helps you reach high shelves. A compass shows which way is north. "
          "An umbrella keeps the rain off. A stapler joins sheets of paper. Request {n}: continue "
          "the list with twenty more objects, one sentence each.")
EXTRA = {"ignore_eos": True, "return_token_ids": True}


@pytest.fixture(scope="module")
def small_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("small-kv")
    keys = root / "keys.json"
    keys.write_text(json.dumps(KEYS))
    server = start("oilbird serve (tiny KV cache)",
                   [sys.executable, "-m", "oilbird.cli", "serve", "--model", MODEL, "--method", METHOD,
                    "--api-keys", str(keys), "--max-num-seqs", str(CLIENTS), "--max-model-len", "512",
                    "--num-gpu-blocks-override", str(KV_BLOCKS), "--enforce-eager"],
                   root / "serve.log", {})
    try:
        yield server.wait_healthy()
    finally:
        server.stop()


def complete(server, key: str, n: int) -> list[int]:
    r = client(server, key).completions.create(model=MODEL, prompt=PROMPT.format(n=n),
                                               max_tokens=MAX_TOKENS, temperature=0, extra_body=EXTRA)
    return list(r.choices[0].token_ids)


def test_preempted_requests_resume_losslessly_and_are_counted_once(small_server, plain_server):
    before = settled_metrics(small_server)
    preempted_before = vllm_metric(small_server, "vllm:num_preemptions_total")
    with ThreadPoolExecutor(CLIENTS) as pool:
        outs = list(pool.map(lambda n: complete(small_server, ALICE, n), range(CLIENTS)))
    after = settled_metrics(small_server)
    assert vllm_metric(small_server, "vllm:num_preemptions_total") > preempted_before, (
        "vLLM preempted nothing: the test did not test preemption")
    # The baseline at the same concurrency: vLLM's fp32 CPU rows do not depend on the batch (the
    # concurrency test of test_serve.py compares batched outputs the same way), and six requests
    # in turn cost the suite a minute.
    with ThreadPoolExecutor(CLIENTS) as pool:
        plain = list(pool.map(lambda n: complete(plain_server, ALICE, n), range(CLIENTS)))
    for n, (ours, theirs) in enumerate(zip(outs, plain)):
        assert ours == theirs, f"request {n}: output under preemption differs from vLLM's without speculation"
    alice = tenant_delta(before, after, "alice")
    assert alice["requests_total"] == CLIENTS, alice
    assert alice["committed_tokens_total"] == sum(len(o) for o in outs), alice
    assert after[("oilbird_requests_in_flight", "alice")] == 0


def test_an_aborted_stream_stops_the_request_and_the_server_goes_on(small_server):
    before = settled_metrics(small_server)
    received = 0
    body = {"model": MODEL, "prompt": PROMPT.format(n="aborted"), "max_tokens": 400,
            "temperature": 0, "stream": True, **EXTRA}
    with httpx.stream("POST", f"{small_server.url}/v1/completions", json=body, timeout=120,
                      headers={"Authorization": f"Bearer {BOB}"}) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("data: {"):
                received += len(json.loads(line[6:])["choices"][0].get("token_ids") or [])
                if received >= 8:
                    break  # leaving the block closes the connection: vLLM aborts the request
    after = settled_metrics(small_server)
    bob = tenant_delta(before, after, "bob")
    assert bob["requests_total"] == 1, bob  # the aborted request was stopped (it joined the pool)
    assert received <= bob["committed_tokens_total"] < 400, bob
    assert after[("oilbird_requests_in_flight", "bob")] == 0
    assert len(complete(small_server, BOB, 99)) == MAX_TOKENS  # and the server goes on serving
