"""The per-tenant container (oilbird.tenants) and every drafter's `drop_tenant`, on hand-built traffic."""

import importlib.util

import pytest
import torch

from oilbird.drafters import DRAFTERS, make_drafter
from oilbird.errors import ConfigError
from oilbird.tenants import TenantMap
from oilbird.verifier import PrefillObservation, Verification

HIDDEN = 8


class Box:
    def __init__(self) -> None:
        self.items: list[int] = []

    def memory_bytes(self) -> int:
        return 8 * len(self.items)


def test_get_builds_once_peek_never_builds_drop_forgets():
    built = []
    tenants = TenantMap(lambda: built.append(1) or Box())
    assert tenants.peek("a") is None and not built
    box = tenants.get("a")
    assert tenants.get("a") is box and len(built) == 1
    box.items += [1, 2]
    tenants.get("b").items.append(3)
    assert tenants.memory_bytes() == 24 and tenants.tenants() == ["a", "b"]
    assert tenants.drop("a") and not tenants.drop("a")
    assert "a" not in tenants and tenants.memory_bytes() == 8
    assert tenants.get("a") is not box and tenants.get("a").items == []  # a fresh, empty state


@pytest.mark.parametrize("name", ["", None, 3])
def test_a_tenant_needs_a_name(name):
    with pytest.raises(ConfigError, match="tenant name"):
        TenantMap(Box).get(name)


# --- every drafter ------------------------------------------------------------------------------

OPTIONAL = {"suffix-ref": "arctic_inference"}
STATELESS = {"ar", "pld", "draft"}  # keep nothing across requests
STATEFUL = [pytest.param(m, marks=pytest.mark.skipif(
                m in OPTIONAL and importlib.util.find_spec(OPTIONAL[m]) is None,
                reason=f"optional peer: {OPTIONAL.get(m)} is not installed"))
            for m in sorted(DRAFTERS) if m not in STATELESS]


def tokens_of(base: int, n: int = 24) -> list[int]:
    return [base + (i % 6) for i in range(n)]


def serve(drafter, request_id, prompt, output, tenant, seen):
    """One request on fake verifications whose top-k only name tokens of the request's own range."""
    base = prompt[0]
    drafter.start_request(request_id, prompt, tenant)
    if drafter.needs_prefill:
        p = len(prompt) - 1
        hidden = torch.randn(p, HIDDEN)
        drafter.observe_prefill(request_id, PrefillObservation(
            prompt[:-1], base + torch.arange(p * 10).reshape(p, 10) % 6,
            torch.linspace(5, 0, 10).repeat(p, 1), hidden))
    for token in output:
        tree = drafter.propose(request_id, budget=32)
        seen.update(tree.tokens[1:])
        n = len(tree)
        topk = base + torch.arange(n * 10).reshape(n, 10) % 6
        hidden = torch.randn(n, HIDDEN)
        drafter.observe(request_id, Verification(
            tree=tree, prefix_len=0, argmax=topk[:, 0], topk_ids=topk,
            topk_logits=torch.linspace(5, 0, 10).repeat(n, 1),
            hidden=hidden, path=[], committed=[token], finished=False))
    drafter.stop_request(request_id)


@pytest.mark.parametrize("method", STATEFUL)
def test_drop_tenant_forgets_its_traffic_and_frees_its_memory(method):
    drafter = make_drafter(method)
    for i in range(3):
        serve(drafter, f"a{i}", tokens_of(1000), tokens_of(1000, 12), "A", set())
    serve(drafter, "b0", tokens_of(3000), tokens_of(3000, 12), "B", set())
    held = drafter.memory_bytes()
    assert held > 0, f"{method} reports no memory after serving: the drop would prove nothing"
    drafter.drop_tenant("A")
    assert 0 < drafter.memory_bytes() < held  # B's state stays
    drafter.drop_tenant("B")
    drafter.drop_tenant("never-seen")  # unknown tenants are ignored
    assert drafter.memory_bytes() == 0
    # A comes back with other traffic: nothing of its old requests may be drafted.
    drafts: set[int] = set()
    for i in range(2):
        serve(drafter, f"a-again{i}", tokens_of(2000), tokens_of(2000, 12), "A", drafts)
    assert drafts, f"{method} drafted nothing after the drop: the test would prove nothing"
    assert not {t for t in drafts if 1000 <= t < 1006}


@pytest.mark.parametrize("method", STATEFUL)
def test_dropping_the_tenant_in_flight_keeps_the_request_going(method):
    drafter = make_drafter(method)
    serve(drafter, "a0", tokens_of(1000), tokens_of(1000, 12), "A", set())
    prompt = tokens_of(1000)
    drafter.start_request("a1", prompt, "A")
    if drafter.needs_prefill:
        p = len(prompt) - 1
        hidden = torch.randn(p, HIDDEN)
        drafter.observe_prefill("a1", PrefillObservation(prompt[:-1], torch.full((p, 10), 1000),
                                                   torch.linspace(5, 0, 10).repeat(p, 1), hidden))
    drafter.drop_tenant("A")
    tree = drafter.propose("a1", budget=32)  # still drafts from what the request holds; no error
    n = len(tree)
    hidden = torch.randn(n, HIDDEN)
    drafter.observe("a1", Verification(tree=tree, prefix_len=0, argmax=torch.full((n,), 1000),
                                       topk_ids=torch.full((n, 10), 1000),
                                       topk_logits=torch.zeros(n, 10), hidden=hidden,
                                       path=[], committed=[1000], finished=False))
    drafter.stop_request("a1")
    assert drafter.memory_bytes() == 0  # the finished request did not bring the tenant back
