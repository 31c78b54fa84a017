"""SAM drafter on hand-built token lists: pool reuse, local matches, back-off, isolation, leakage."""

import random

import pytest
import torch

from oilbird.drafters import make_drafter
from oilbird.drafters.sam import SAMConfig, chain_length
from oilbird.tree import DraftTree
from oilbird.verifier import Verification


def commit(drafter, rid, tokens):
    """Feed committed tokens of request `rid` to the drafter as a verification of a root-only tree would."""
    tree = DraftTree.root(drafter.state(rid).anchor)
    n = len(tree)
    drafter.observe(rid, Verification(
        tree=tree, prefix_len=0, argmax=torch.zeros(n, dtype=torch.long),
        topk_ids=torch.zeros(n, 1, dtype=torch.long), topk_logits=torch.zeros(n, 1),
        path=[], committed=list(tokens), finished=False))


def serve(drafter, rid, prompt, output, tenant="t"):
    drafter.start_request(rid, prompt, tenant)
    commit(drafter, rid, output)
    drafter.stop_request(rid)


def test_length_rule():
    assert chain_length(1, 4.0, 60) == 5 and chain_length(20, 4.0, 60) == 60


def test_drafts_from_past_request_of_same_tenant():
    drafter = make_drafter("sam", SAMConfig(max_candidates=1))
    serve(drafter, "r1", [1, 2, 3], [4, 5, 6, 7])
    drafter.start_request("r2", [9, 2, 3, 4], "t")
    tree = drafter.propose("r2", budget=10)
    assert tree.tokens[0] == 4 and tree.tokens[1:4] == [5, 6, 7]  # "2 3 4" matched in r1


def test_occurrence_recent_copies_the_latest_past_request_and_own_text():
    drafters = {occ: make_drafter("sam", SAMConfig(max_candidates=1, occurrence=occ)) for occ in ("first", "recent")}
    for drafter in drafters.values():
        serve(drafter, "r1", [1, 2, 3], [4, 5, 6])
        serve(drafter, "r2", [1, 2, 3], [4, 7, 8])
        drafter.start_request("r3", [9, 3, 4], "t")
    assert drafters["first"].propose("r3", budget=3).tokens[1:] == [5, 6]
    assert drafters["recent"].propose("r3", budget=3).tokens[1:] == [7, 8]
    # Its own text: the latest occurrence before the newest position, never the newest itself.
    drafter = drafters["recent"]
    drafter.start_request("r4", [20, 21, 22, 20, 21, 23, 20, 21], "u")
    assert drafter.propose("r4", budget=3).tokens[1:] == [23, 20]


def test_occurrence_frequent_follows_the_pools_majority_and_scores_its_nodes():
    drafters = {name: make_drafter("sam", SAMConfig(max_candidates=1, **kw))
                for name, kw in (("first", {}), ("scored", dict(count_scores=True)),
                                 ("frequent", dict(occurrence="frequent", count_scores=True)),
                                 ("unscored", dict(occurrence="frequent")))}
    for drafter in drafters.values():
        serve(drafter, "r1", [1, 2, 3], [4, 5, 6])
        serve(drafter, "r2", [1, 2, 3], [4, 7, 8])
        serve(drafter, "r3", [1, 2, 3], [4, 7, 9])
        drafter.start_request("r4", [9, 3, 4], "t")
    first = drafters["first"].propose("r4", budget=3)
    assert first.tokens[1:] == [5, 6] and first.scores[1:] == [1.0, 1.0]  # unscored: all 1
    scored = drafters["scored"].propose("r4", budget=3)
    # The same chain, each node scored by how often its path followed "3 4": 5 once in three.
    assert scored.tokens[1:] == [5, 6] and scored.scores[1:] == pytest.approx([1 / 3, 1 / 3])
    frequent = drafters["frequent"].propose("r4", budget=3)
    # "3 4" is followed by 7 twice; "3 4 7" by 8 and 9 once each: the earlier (r2's) wins.
    assert frequent.tokens[1:] == [7, 8] and frequent.scores[1:] == pytest.approx([2 / 3, 1 / 3])
    unscored = drafters["unscored"].propose("r4", budget=3)
    assert unscored.tokens[1:] == [7, 8] and unscored.scores[1:] == [1.0, 1.0]
    chain, length, probs = drafters["frequent"].longest_match("r4", 2)
    assert (chain, length) == ([7, 8], 2) and probs == pytest.approx([2 / 3, 1 / 3])
    assert drafters["first"].longest_match("r4", 2) == ([5, 6], 2, None)


def test_count_scores_read_the_requests_own_text_too():
    # Its own text: "5 6" occurred twice before the newest position, followed by 7 and by 8;
    # the newest occurrence, the query itself, has no continuation and counts for nothing.
    drafter = make_drafter("sam", SAMConfig(max_candidates=1, occurrence="frequent", count_scores=True))
    drafter.start_request("r", [5, 6, 7, 5, 6, 8, 5, 6], "t")
    tree = drafter.propose("r", budget=3)
    assert tree.tokens[1:] == [7, 5] and tree.scores[1:] == pytest.approx([0.5, 0.5])
    for token in (7, 5, 6):  # the counts follow the text as it grows
        commit(drafter, "r", [token])
    tree = drafter.propose("r", budget=2)  # the longest match, "5 6 7 5 6", was followed by 8 alone
    assert tree.tokens[1:] == [8] and tree.scores[1:] == [1.0]


def test_local_text_drafts_and_never_matches_itself():
    drafter = make_drafter("sam", SAMConfig(max_candidates=1))
    drafter.start_request("r", [5, 6, 7, 8, 5, 6], "t")
    tree = drafter.propose("r", budget=4)
    assert tree.tokens == [6, 7, 8, 5]  # "5 6" occurred at 0; budget 4 = root + 3
    drafter.start_request("s", [1, 2, 3], "t")
    assert len(drafter.propose("s", budget=10)) == 1  # nothing occurred before: no draft


def test_tenants_are_isolated():
    drafter = make_drafter("sam")
    serve(drafter, "a1", [1, 2, 3], [40, 41, 42], tenant="A")
    drafter.start_request("b1", [1, 2, 3], "B")
    tree = drafter.propose("b1", budget=20)
    assert not {40, 41, 42} & set(tree.tokens)


def test_no_leakage_of_the_current_request_into_the_pool():
    drafter = make_drafter("sam")
    drafter.start_request("r1", [1, 2, 3], "t")
    commit(drafter, "r1", [70, 71])
    # While r1 runs, another request of the tenant must not see r1's text.
    other = drafter.pool.get("t")
    assert other.sam.match([70])[1] == 0
    drafter.stop_request("r1")
    assert other.sam.match([70, 71])[1] == 2


def test_live_drafts_from_the_tenants_requests_in_flight_only_when_asked():
    drafts = {}
    for live in (False, True):
        drafter = make_drafter("sam", SAMConfig(max_candidates=1, live=live))
        drafter.start_request("a", [1, 2, 3], "t")
        commit(drafter, "a", [4, 5, 6, 7])  # a is still running
        drafter.start_request("x", [9, 2, 3], "u")
        commit(drafter, "x", [40, 41, 42])  # another tenant's, matching longer ("9 2 3")
        drafter.start_request("b", [9, 2, 3], "t")
        drafts[live] = drafter.propose("b", budget=5).tokens[1:]
    assert drafts == {False: [], True: [4, 5, 6, 7]}


def test_a_live_match_with_nothing_after_it_leaves_the_pool_match_in_place():
    drafter = make_drafter("sam", SAMConfig(max_candidates=1, live=True))
    serve(drafter, "old", [1, 2], [3, 4, 5])  # in the pool: "1 2 3 4 5"
    drafter.start_request("a", [7, 1, 2], "t")  # in flight: "7 1 2" ends its text
    drafter.start_request("b", [7, 1, 2], "t")
    assert drafter.propose("b", budget=4).tokens[1:] == [3, 4, 5]  # not a's empty continuation


def test_a_live_cursor_stays_on_its_string_while_the_other_request_grows():
    """Two requests over three tokens (many state splits): after every step, each live cursor
    sits on the state a fresh match of its string finds in the other request's automaton."""
    rng = random.Random(0)
    drafter = make_drafter("sam", SAMConfig(max_candidates=1, live=True))
    for rid in "ab":
        drafter.start_request(rid, [rng.randrange(3) for _ in range(5)], "t")
    checked = 0
    for _ in range(300):
        rid = rng.choice("ab")
        drafter.propose(rid, 4)  # makes and refreshes its live cursor
        commit(drafter, rid, [rng.randrange(3) for _ in range(rng.randint(1, 3))])
        for me, other in (("a", "b"), ("b", "a")):
            cursor = drafter.state(me).live.get(other)
            if cursor is None:
                continue
            cursor.refresh()
            text = drafter.state(me).sequence
            found = drafter.state(other).local.match(text[len(text) - cursor.length:])
            assert (cursor.state, cursor.length) == found
            checked += cursor.length > 0
    assert checked > 100


def test_back_off_adds_other_continuations_within_budget():
    drafter = make_drafter("sam", SAMConfig(max_candidates=3, alpha=1.0))
    serve(drafter, "r1", [1, 2], [3, 9])
    serve(drafter, "r2", [1, 2], [4, 9])
    serve(drafter, "r3", [5, 2], [6, 9])
    drafter.start_request("r4", [7, 1, 2], "t")
    tree = drafter.propose("r4", budget=8)
    first_level = {tree.tokens[c] for c in tree.children(0)}
    assert first_level == {3, 4, 6}  # "1 2" -> 3, 4; back-off to "2" adds 6
    assert len(drafter.propose("r4", budget=3)) <= 3


def test_pool_cap_evicts_the_oldest_requests_and_drop_tenant_forgets_the_pool():
    drafter = make_drafter("sam", SAMConfig(pool_max_tokens=10))
    for r in range(4):  # 5 tokens each: the store keeps the last two
        serve(drafter, f"r{r}", [100 * r, 100 * r + 1], [100 * r + 2, 100 * r + 3, 100 * r + 4])
    store = drafter.pool.get("t")
    assert [rid for rid, _ in store.requests] == ["r2", "r3"] and store.num_tokens == 10
    serve(drafter, "other", [7, 8], [9], tenant="u")
    both = drafter.memory_bytes()
    assert both == store.memory_bytes() + drafter.pool.get("u").memory_bytes()
    drafter.drop_tenant("t")
    assert drafter.pool.tenants() == ["u"] and 0 < drafter.memory_bytes() < both
    drafter.start_request("again", [9, 301, 302], "t")
    assert len(drafter.propose("again", budget=10)) == 1  # t's old pool is gone: nothing to draft


def test_sam_output_equals_greedy_on_api_bank(serve_api_bank):
    """End to end on the real model: one drafter across 5 API-Bank requests, each output greedy."""
    _, tau = serve_api_bank(make_drafter("sam"), node_budget=64)
    assert tau > 1.2
