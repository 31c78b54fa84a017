"""Every registered drafter: tenant isolation and no leakage, on hand-built traffic.

Each tenant's traffic uses its own token range, and the fake verifications only ever report
top-k ids from the same range, so any token of another range in a draft is a leak.
"""

import importlib.util

import pytest
import torch

from oilbird.drafters import DRAFTERS, make_drafter
from oilbird.verifier import PrefillObservation, Verification

HIDDEN = 8


def tokens_of(base: int, n: int = 24) -> list[int]:
    # Repetitive within a tenant so lexical drafters have something to match.
    return [base + (i % 6) for i in range(n)]


def fake_verification(tree, committed, token_range):
    n = len(tree)
    gen = torch.Generator().manual_seed(len(committed) + n)
    topk = token_range[0] + torch.randint(0, token_range[1] - token_range[0], (n, 10), generator=gen)
    hidden = torch.randn(n, HIDDEN, generator=gen)
    return Verification(tree=tree, prefix_len=0, argmax=topk[:, 0], topk_ids=topk,
                        topk_logits=torch.linspace(5, 0, 10).repeat(n, 1),
                        hidden_states=(hidden,), path=[],
                        committed=committed, finished=False)


def serve(drafter, request_id, prompt, output, tenant, token_range, seen_drafts):
    drafter.start_request(request_id, prompt, tenant)
    if drafter.needs_prefill:
        p = len(prompt) - 1
        topk = token_range[0] + torch.arange(p * 10).reshape(p, 10) % (token_range[1] - token_range[0])
        hidden = torch.randn(p, HIDDEN)
        drafter.observe_prefill(PrefillObservation(prompt[:-1], topk,
                                                   torch.linspace(5, 0, 10).repeat(p, 1),
                                                   (hidden,)))
    for token in output:
        tree = drafter.propose(budget=32)
        seen_drafts.update(tree.tokens[1:])
        drafter.observe(fake_verification(tree, [token], token_range))
    drafter.stop_request(request_id)


# Optional peers run only where their package is installed.
OPTIONAL = {"suffix-ref": "arctic_inference"}
METHODS = [pytest.param(m, marks=pytest.mark.skipif(
               m in OPTIONAL and importlib.util.find_spec(OPTIONAL[m]) is None,
               reason=f"optional peer: {OPTIONAL.get(m)} is not installed"))
           # 'draft' runs a model of its own and keeps nothing across requests: its isolation
           # test serves real requests (tests/test_draft_model.py).
           for m in sorted(DRAFTERS) if m != "ar" and not DRAFTERS[m].needs_target]


@pytest.mark.parametrize("method", METHODS)
def test_tenant_b_never_drafts_tenant_a_tokens(method):
    drafter = make_drafter(method)
    a_range, b_range = (1000, 1006), (2000, 2006)
    for i in range(3):
        serve(drafter, f"a{i}", tokens_of(1000), tokens_of(1000, 12), "A", a_range, set())
    drafts_b: set[int] = set()
    for i in range(3):
        serve(drafter, f"b{i}", tokens_of(2000), tokens_of(2000, 12), "B", b_range, drafts_b)
    assert drafts_b, f"{method} drafted nothing for tenant B: the test would prove nothing"
    assert not {t for t in drafts_b if 1000 <= t < 1006}


@pytest.mark.parametrize("method", METHODS)
def test_no_state_shared_between_drafter_instances(method):
    """A request served by another instance (another process's future) must not reach this one."""
    other, drafter = make_drafter(method), make_drafter(method)
    for i in range(3):
        serve(other, f"x{i}", tokens_of(3000), tokens_of(3000, 12), "t", (3000, 3006), set())
    drafts: set[int] = set()
    serve(drafter, "r", tokens_of(4000), tokens_of(4000, 12), "t", (4000, 4006), drafts)
    assert not {t for t in drafts if 3000 <= t < 3006}


@pytest.mark.parametrize("method", METHODS)
def test_no_draft_from_the_current_requests_future(method):
    drafter = make_drafter(method)
    prompt = tokens_of(5000, 12)
    future = list(range(6000, 6012))  # committed one at a time below; unique tokens
    drafter.start_request("r", prompt, "t")
    if drafter.needs_prefill:
        p = len(prompt) - 1
        hidden = torch.randn(p, HIDDEN)
        drafter.observe_prefill(PrefillObservation(prompt[:-1], torch.full((p, 10), 5000),
                                                   torch.zeros(p, 10), (hidden,)))
    for i, token in enumerate(future):
        tree = drafter.propose(budget=32)
        assert not set(tree.tokens[1:]) & set(future[i:]), f"{method} drafted an uncommitted token"
        drafter.observe(fake_verification(tree, [token], (5000, 5006)))
    drafter.stop_request("r")
