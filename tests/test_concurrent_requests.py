"""One drafter instance serving several requests at once, interleaved, on hand-built traffic.

Every registered drafter that runs no model of its own serves two requests of tenant A and two
of tenant B on one instance: all four start, then take turns proposing and observing. Each
request draws its tokens from a range of its own, and the fake verifications only ever name
tokens of that range, so a draft is easy to trace back to the request it came from.
"""

import importlib.util

import pytest
import torch

import oilbird.drafters  # noqa: F401  (import registers every drafter)
from oilbird.drafters.registry import DRAFTERS, make_drafter
from oilbird.errors import ConfigError
from oilbird.verifier import PrefillObservation, Verification

HIDDEN = 8
BUDGET = 32
STEPS = 12
OPTIONAL = {"suffix-ref": "arctic_inference"}
METHODS = [pytest.param(m, marks=pytest.mark.skipif(
               m in OPTIONAL and importlib.util.find_spec(OPTIONAL[m]) is None,
               reason=f"optional peer: {OPTIONAL.get(m)} is not installed"))
           # 'draft' runs a model of its own (tests/test_draft_model.py serves it).
           for m in sorted(DRAFTERS) if m != "draft" and not DRAFTERS[m].needs_target]
NO_CROSS_REQUEST_STATE = ["ar", "pld"]

# request id -> (tenant, first token of its range); each range holds 6 tokens.
REQUESTS = {"a0": ("A", 1000), "b0": ("B", 2000), "a1": ("A", 1100), "b1": ("B", 2100)}


def tokens_of(base: int, n: int, shift: int = 0) -> list[int]:
    """A repetitive run over the range [base, base + 6), so lexical drafters find matches."""
    return [base + (i + shift) % 6 for i in range(n)]


def prompt_of(rid: str) -> list[int]:
    return tokens_of(REQUESTS[rid][1], 20)


def output_of(rid: str) -> list[int]:
    return tokens_of(REQUESTS[rid][1], STEPS + 8, shift=20)


def seed_of(rid: str, step: int) -> int:
    return REQUESTS[rid][1] * 100 + step


def fake_verification(rid: str, step: int, tree, token: int) -> Verification:
    """A verification that commits `token`, with top-k and hidden states from the request's range
    (deterministic in the request and step, so two runs see the same observations)."""
    n, base = len(tree), REQUESTS[rid][1]
    gen = torch.Generator().manual_seed(seed_of(rid, step))
    topk = base + torch.randint(0, 6, (n, 10), generator=gen)
    return Verification(tree=tree, prefix_len=0, argmax=topk[:, 0], topk_ids=topk,
                        topk_logits=torch.linspace(5, 0, 10).repeat(n, 1),
                        hidden=torch.randn(n, HIDDEN, generator=gen), path=[],
                        committed=[token], finished=False)


def start(drafter, rid: str) -> None:
    """Start request `rid` (and hand it its prefill when the drafter harvests one)."""
    tenant, base = REQUESTS[rid]
    prompt = prompt_of(rid)
    drafter.start_request(rid, prompt, tenant)
    if drafter.needs_prefill:
        p = len(prompt) - 1
        gen = torch.Generator().manual_seed(seed_of(rid, -1))
        drafter.observe_prefill(rid, PrefillObservation(
            prompt[:-1], base + torch.randint(0, 6, (p, 10), generator=gen),
            torch.linspace(5, 0, 10).repeat(p, 1), torch.randn(p, HIDDEN, generator=gen)))


def step(drafter, rid: str, i: int, trees: dict) -> None:
    """Cycle `i` of request `rid`: propose, check the root is the request's anchor, observe."""
    tree = drafter.propose(rid, BUDGET)
    anchor = (prompt_of(rid) + output_of(rid)[:i])[-1]
    assert tree.tokens[0] == anchor, f"{rid} cycle {i}: rooted at {tree.tokens[0]}, not its anchor {anchor}"
    trees.setdefault(rid, []).append((list(tree.tokens), list(tree.parents), list(tree.scores)))
    drafter.observe(rid, fake_verification(rid, i, tree, output_of(rid)[i]))


def serve_interleaved(drafter, rids: list[str], steps: range, trees: dict) -> None:
    for i in steps:
        for rid in rids:
            step(drafter, rid, i, trees)


def drafted_tokens(trees: dict, rids) -> set[int]:
    return {t for rid in rids for tokens, _, _ in trees.get(rid, []) for t in tokens[1:]}


@pytest.mark.parametrize("method", METHODS)
def test_interleaved_requests_draft_at_their_own_anchors(method):
    drafter = make_drafter(method)
    for rid in REQUESTS:
        start(drafter, rid)
    trees: dict = {}
    serve_interleaved(drafter, list(REQUESTS), range(STEPS // 2), trees)
    assert drafter.stop_request("a0") is not None
    with pytest.raises(ConfigError):
        drafter.propose("a0", BUDGET)  # stopped: no longer in flight
    serve_interleaved(drafter, ["b0", "a1", "b1"], range(STEPS // 2, STEPS), trees)
    for rid in ["b0", "a1", "b1"]:
        assert len(trees[rid]) == STEPS and drafter.state(rid).sequence == \
            prompt_of(rid) + output_of(rid)[:STEPS]
    # Concurrent tenants stay isolated: no tenant drafts the other's ranges.
    assert not {t for t in drafted_tokens(trees, ["b0", "b1"]) if 1000 <= t < 1200}
    assert not {t for t in drafted_tokens(trees, ["a0", "a1"]) if 2000 <= t < 2200}
    for rid in ["b0", "a1", "b1"]:
        drafter.stop_request(rid)
    assert not drafter.requests


@pytest.mark.parametrize("method", METHODS)
def test_request_ids_are_checked(method):
    drafter = make_drafter(method)
    start(drafter, "a0")
    with pytest.raises(ConfigError, match="already in flight"):
        drafter.start_request("a0", prompt_of("b0"), "B")  # a duplicate id, even of another tenant
    with pytest.raises(ConfigError, match="not in flight"):
        drafter.propose("never-started", BUDGET)
    assert drafter.stop_request("never-started") is None  # ignored
    trees: dict = {}
    step(drafter, "a0", 0, trees)  # the refused duplicate left the request intact
    drafter.stop_request("a0")
    drafter.stop_request("a0")  # a second stop is ignored too


@pytest.mark.parametrize("method", NO_CROSS_REQUEST_STATE)
def test_interleaving_changes_nothing_without_cross_request_state(method):
    interleaved: dict = {}
    drafter = make_drafter(method)
    for rid in REQUESTS:
        start(drafter, rid)
    serve_interleaved(drafter, list(REQUESTS), range(STEPS), interleaved)
    one_at_a_time: dict = {}
    drafter = make_drafter(method)
    for rid in REQUESTS:
        start(drafter, rid)
        serve_interleaved(drafter, [rid], range(STEPS), one_at_a_time)
        drafter.stop_request(rid)
    assert interleaved == one_at_a_time
    if method == "pld":
        assert drafted_tokens(interleaved, REQUESTS), "pld drafted nothing: the test would prove nothing"
