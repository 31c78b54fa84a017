"""`oilbird serve` over HTTP with the real `openai` client: lossless outputs, concurrency, bad
inputs, tenant isolation and the per-tenant metrics (servers: tests/serving/conftest.py)."""

from __future__ import annotations

import secrets
import threading
from concurrent.futures import ThreadPoolExecutor, wait

import httpx
import pytest
from http_client import (MAX_NEW, client, completion_ids, first_divergence, settled_metrics,
                         streamed_ids, tenant_delta, unchanged, vllm_metric)
from oilbird_servers import ALICE, ALICE_2, BOB, MAX_MODEL_LEN, MODEL

# ----------------------------------------------------------------------------------------------
# 1. Greedy outputs are lossless


PROMPTS = 3


@pytest.fixture(scope="module")
def greedy(smol, api_bank_prompts) -> list[list[int]]:
    """Our engine's greedy outputs (transformers' `generate`) for the first API-Bank prompts: what
    tests/conftest.py's `api_bank_references` holds, for the 3 prompts used here only."""
    import torch

    from oilbird.audit import greedy_reference

    # One thread: the servers start on the other cores meanwhile, and an oversubscribed torch
    # is several times slower than a single thread.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return [greedy_reference(smol.model, ids, MAX_NEW, smol.stop_ids).output_ids
                for ids in api_bank_prompts[:PROMPTS]]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("i", range(PROMPTS))
def test_greedy_output_equals_plain_vllm_and_our_engine(oilbird_server, plain_server,
                                                        api_bank_prompts, greedy, i):
    prompt, reference = api_bank_prompts[i], greedy[i]
    served = completion_ids(client(oilbird_server), prompt, MAX_NEW)
    streamed = streamed_ids(client(oilbird_server), prompt, MAX_NEW)  # now with a warm pool
    plain = completion_ids(client(plain_server), prompt, MAX_NEW)
    assert plain == reference, f"plain vLLM vs our engine's greedy: {first_divergence(plain, reference)}"
    assert served == reference, f"oilbird serve vs greedy: {first_divergence(served, reference)}"
    assert streamed == reference, f"oilbird serve streamed vs greedy: {first_divergence(streamed, reference)}"


# ----------------------------------------------------------------------------------------------
# 3. Concurrent clients get their own answers


def test_32_concurrent_clients_each_get_their_own_answer(oilbird_server):
    prompts = [f"Question {n}: name one thing that is {color} and explain why in a sentence."
               for n, color in enumerate(["red", "blue", "green", "white"] * 8)]
    keys = [ALICE if n % 2 == 0 else BOB for n in range(len(prompts))]  # both tenants in each batch
    clients = {k: client(oilbird_server, k) for k in set(keys)}
    start = threading.Barrier(len(prompts))

    def ask(n: int) -> list[int]:
        start.wait(timeout=60)
        return completion_ids(clients[keys[n]], prompts[n], 16)

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(ask, n) for n in range(len(prompts))]
        done, pending = wait(futures, timeout=300)
    assert not pending, f"{len(pending)} of {len(prompts)} concurrent requests did not answer in 300 s"
    together = [f.result() for f in futures]
    oilbird_server.alive()
    alone = [completion_ids(clients[keys[n]], prompts[n], 16) for n in range(len(prompts))]
    wrong = [f"#{n}: {first_divergence(together[n], alone[n])}"
             for n in range(len(prompts)) if together[n] != alone[n]]
    assert not wrong, "concurrent answers differ from the same prompts sent alone:\n" + "\n".join(wrong)
    assert all(len(ids) > 0 for ids in together)


# ----------------------------------------------------------------------------------------------
# 4. Bad inputs: a 4xx with a reason, nothing reaches the drafter, the server keeps serving

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "hi"}]
BAD_INPUTS = {
    "malformed JSON": (CHAT, ALICE, b'{"model": "smollm2-135m", "messages": [', 400),
    "empty messages": (CHAT, ALICE, {"model": MODEL, "messages": [], "max_tokens": 4}, 400),
    "max_tokens 0": (CHAT, ALICE, {"model": MODEL, "messages": HI, "max_tokens": 0}, 400),
    "max_tokens -1": (CHAT, ALICE, {"model": MODEL, "messages": HI, "max_tokens": -1}, 400),
    "over-long chat prompt": (CHAT, ALICE, {"model": MODEL, "max_tokens": 4,
                                            "messages": [{"role": "user", "content": "hi " * 3000}]}, 400),
    "over-long token prompt": ("/v1/completions", ALICE,
                               {"model": MODEL, "prompt": list(range(100, 100 + MAX_MODEL_LEN + 10)),
                                "max_tokens": 4}, 400),
    "unknown model": (CHAT, ALICE, {"model": "no-such-model", "messages": HI, "max_tokens": 4}, 404),
    "missing key": (CHAT, None, {"model": MODEL, "messages": HI, "max_tokens": 4}, 401),
    "unknown key": (CHAT, "key-nobody", {"model": MODEL, "messages": HI, "max_tokens": 4}, 401),
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_gets_a_4xx_with_a_reason_and_the_server_keeps_serving(oilbird_server, case):
    path, key, body, expected = BAD_INPUTS[case]
    headers = {"content-type": "application/json"}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    before = settled_metrics(oilbird_server)
    r = httpx.post(f"{oilbird_server.url}{path}", headers=headers, timeout=120,
                   **({"content": body} if isinstance(body, bytes) else {"json": body}))
    oilbird_server.alive()
    assert r.status_code == expected, (f"{case}: expected {expected}, got {r.status_code}: "
                                       f"{r.text[:500]}\nserver log tail:\n{oilbird_server.log_tail(30)}")
    message = r.json()["error"]["message"]
    assert isinstance(message, str) and len(message) > 10, f"{case}: no reason given: {r.text[:300]}"
    assert settled_metrics(oilbird_server) == before, f"{case}: a rejected request reached the drafter"
    assert httpx.get(f"{oilbird_server.url}/health", timeout=30).status_code == 200
    answer = client(oilbird_server).chat.completions.create(model=MODEL, messages=HI, max_tokens=2,
                                                            temperature=0)
    assert answer.choices[0].finish_reason in ("length", "stop")


# ----------------------------------------------------------------------------------------------
# 5. Tenant isolation


def _chat_delta(server, key: str, messages, **kw):
    """Send one greedy chat request; its text and every tenant's counter changes."""
    before = settled_metrics(server)
    answer = client(server, key).chat.completions.create(model=MODEL, messages=messages,
                                                         max_tokens=MAX_NEW, temperature=0, **kw)
    after = settled_metrics(server)
    return answer.choices[0].message.content, before, after


@pytest.mark.parametrize("spoof", [False, True], ids=["plain", "vllm_xargs-spoofing-tenant-a"])
def test_tenant_b_never_drafts_from_or_counts_as_tenant_a(oilbird_server, spoof):
    secret = "-".join(secrets.token_hex(3) for _ in range(3))
    ask = (f"Write a limerick about a spy whose password is {secret}." if spoof else
           f"Repeat the code {secret} three times, then write a short poem about the code {secret}.")
    messages = [{"role": "user", "content": ask}]
    # Tenant A, twice: the second time its pool holds the first answer (the control: it drafts it).
    a1_text, before, after = _chat_delta(oilbird_server, ALICE, messages)
    a1 = tenant_delta(before, after, "alice")
    assert a1["requests_total"] == 1 and a1["pool_bytes"] > 0, a1
    assert unchanged(before, after, "bob"), f"A's request changed B's counters: {tenant_delta(before, after, 'bob')}"
    a2_text, before, after = _chat_delta(oilbird_server, ALICE, messages)
    a2 = tenant_delta(before, after, "alice")
    assert a2_text == a1_text and a2["requests_total"] == 1
    assert unchanged(before, after, "bob")
    assert a2["forwards_total"] < a1["forwards_total"], (
        f"control failed: tenant A's drafter did not use its own pool (forwards {a1} then {a2}), so "
        "this test cannot tell whether B drafts from A's pool")

    # Tenant B, the same prompt (it would profit from A's pool); maybe claiming to be A.
    extra = {"extra_body": {"vllm_xargs": {"oilbird_tenant": "alice"}}} if spoof else {}
    b_text, before, after = _chat_delta(oilbird_server, BOB, messages, **extra)
    b = tenant_delta(before, after, "bob")
    assert b_text == a1_text
    assert unchanged(before, after, "alice"), (
        f"B's request changed A's counters or pool: {tenant_delta(before, after, 'alice')}")
    assert b["requests_total"] == 1 and b["pool_bytes"] > 0, b
    assert b["forwards_total"] > a2["forwards_total"], (
        f"B drafted as well as A did with A's pool: B {b}, A's second request {a2}")
    assert {t for _, t in after} <= {"alice", "bob"}, f"unexpected tenants: {sorted({t for _, t in after})}"


# ----------------------------------------------------------------------------------------------
# 6. Counters


def test_requests_are_counted_per_tenant_and_vllm_counts_drafts(oilbird_server):
    c_alice, c_alice_2 = client(oilbird_server, ALICE), client(oilbird_server, ALICE_2)
    before = settled_metrics(oilbird_server)
    drafts_before = vllm_metric(oilbird_server, "vllm:spec_decode_num_draft_tokens_total")
    accepted_before = vllm_metric(oilbird_server, "vllm:spec_decode_num_accepted_tokens_total")
    for n, c in enumerate([c_alice, c_alice_2, c_alice]):  # two keys of one tenant
        completion_ids(c, f"List {n + 3} colors of the rainbow:", 24)
    after = settled_metrics(oilbird_server)
    alice = tenant_delta(before, after, "alice")
    assert alice["requests_total"] == 3, alice
    assert alice["forwards_total"] >= 3 and alice["committed_tokens_total"] >= 3, alice
    assert 0 <= alice["accepted_tokens_total"] <= alice["draft_tokens_total"], alice
    assert unchanged(before, after, "bob"), tenant_delta(before, after, "bob")
    assert ("oilbird_pool_bytes", "alice") in after and ("oilbird_pool_bytes", "bob") in after
    for name in ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
                 "vllm:spec_decode_num_accepted_tokens_total"):
        vllm_metric(oilbird_server, name)
    drafts = vllm_metric(oilbird_server, "vllm:spec_decode_num_draft_tokens_total") - drafts_before
    accepted = vllm_metric(oilbird_server, "vllm:spec_decode_num_accepted_tokens_total") - accepted_before
    assert drafts > 0, "vLLM verified no draft tokens"
    assert (drafts, accepted) == (alice["draft_tokens_total"], alice["accepted_tokens_total"]), (
        f"vLLM counted {drafts} drafts / {accepted} accepted, Oilbird {alice}")


def test_committed_tokens_are_the_tokens_clients_received(oilbird_server):
    # The same prompt again and again: from the second time on the pool drafts whole chains, and
    # the last step of a request may verify drafts past max_tokens.
    c = client(oilbird_server, BOB)
    before = settled_metrics(oilbird_server)
    received = 0
    for max_tokens in (32, 29, 30, 31):
        r = c.completions.create(model=MODEL, prompt="The history of the bicycle, in one paragraph:",
                                 max_tokens=max_tokens, temperature=0)
        received += r.usage.completion_tokens
    bob = tenant_delta(before, settled_metrics(oilbird_server), "bob")
    assert bob["requests_total"] == 4, bob
    assert bob["committed_tokens_total"] == received, (
        f"oilbird_committed_tokens_total grew by {bob['committed_tokens_total']:.0f}, the clients "
        f"received {received} tokens ({bob})")


# ----------------------------------------------------------------------------------------------
# 2. Sampling (T > 0)


def test_greedy_requests_stay_greedy_beside_sampled_ones(oilbird_server, api_bank_prompts, greedy):
    """A batch that mixes T=0 and T>0 requests verifies both with vLLM's random rejection sampler."""
    c = client(oilbird_server, BOB)
    start = threading.Barrier(2 * PROMPTS)

    def ask(i: int, temperature: float) -> list[int]:
        start.wait(timeout=60)
        choice = c.completions.create(model=MODEL, prompt=api_bank_prompts[i], max_tokens=MAX_NEW,
                                      temperature=temperature, seed=i,
                                      extra_body={"return_token_ids": True}).choices[0]
        return list(choice.token_ids)

    with ThreadPoolExecutor(2 * PROMPTS) as pool:
        greedy_runs = [pool.submit(ask, i, 0.0) for i in range(PROMPTS)]
        sampled_runs = [pool.submit(ask, i, 0.8) for i in range(PROMPTS)]
        done, pending = wait(greedy_runs + sampled_runs, timeout=300)
    assert not pending, "requests did not answer in 300 s"
    assert all(f.result() for f in sampled_runs)
    wrong = [f"#{i}: {first_divergence(f.result(), greedy[i])}"
             for i, f in enumerate(greedy_runs) if f.result() != greedy[i]]
    assert not wrong, "greedy requests batched with sampled ones lost their greedy output:\n" + "\n".join(wrong)


def test_seeded_sampling_runs_and_is_reproducible(oilbird_server, plain_server):
    messages = [{"role": "user", "content": "Tell me a very short story about a lighthouse."}]
    kw = dict(model=MODEL, messages=messages, max_tokens=24, temperature=0.8, top_p=0.95, seed=1234)
    plain = [client(plain_server).chat.completions.create(**kw).choices[0].message.content
             for _ in range(2)]
    assert plain[0] and plain[0] == plain[1], f"plain vLLM is not reproducible either: {plain}"
    served = [client(oilbird_server).chat.completions.create(**kw).choices[0].message.content
              for _ in range(3)]
    assert all(served), served
    assert served[0] == served[1] == served[2], (
        f"same seed, different texts from oilbird serve: {served} (plain vLLM: {plain[0]!r})")


def test_low_temperature_sampling_stays_with_the_greedy_text(oilbird_server, plain_server, smol,
                                                             api_bank_prompts, greedy):
    """At T=0.05 the model's top token has all but certain probability here: a sampled text far
    from the greedy one means the speculative sampler draws from the wrong distribution."""
    kw = dict(model=MODEL, prompt=api_bank_prompts[0], max_tokens=24, temperature=0.05, seed=7,
              extra_body={"return_token_ids": True})
    plain = list(client(plain_server).completions.create(**kw).choices[0].token_ids)
    assert plain == greedy[0][:24], f"plain vLLM at T=0.05 vs greedy: {first_divergence(plain, greedy[0])}"
    for key in (ALICE, BOB):
        served = list(client(oilbird_server, key).completions.create(**kw).choices[0].token_ids)
        assert served == greedy[0][:24], (
            f"oilbird serve at T=0.05 vs greedy: {first_divergence(served, greedy[0])}; sampled "
            f"{smol.tokenizer.decode(served)!r}, greedy {smol.tokenizer.decode(greedy[0][:24])!r}")
