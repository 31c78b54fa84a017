"""Oilbird and the transplants (oilbird.drafters.oilbird): online, per tenant, lossless."""

import pytest
import torch

from oilbird.drafters import make_drafter
from oilbird.drafters.oilbird import OilbirdConfig
from oilbird.drafters.oilbird_transplants import OilbirdPLDConfig, OilbirdSuffixConfig, OilbirdTRConfig
from oilbird.errors import ConfigError
from oilbird.semantic_store import RejectedPool, TraceStore, normalize
from oilbird.tree import DraftTree
from oilbird.verifier import PrefillObservation, Verification

DIM = 8
STATE = torch.ones(DIM)  # every position has the same state: every record is a perfect neighbor


def verification(tree: DraftTree, committed: list[int]) -> Verification:
    n = len(tree)
    states = STATE.repeat(n, 1)  # [n, DIM]
    return Verification(tree=tree, prefix_len=0, argmax=torch.zeros(n, dtype=torch.long),
                        topk_ids=torch.zeros(n, 10, dtype=torch.long), topk_logits=torch.zeros(n, 10),
                        hidden=states, path=[], committed=committed,
                        finished=False)


def serve(drafter, request_id, prompt, output, tenant):
    """Commit `output` one token per cycle; return every tree proposed."""
    drafter.start_request(request_id, prompt, tenant)
    states = STATE.repeat(len(prompt) - 1, 1)
    drafter.observe_prefill(request_id, PrefillObservation(prompt[:-1], torch.zeros(len(prompt) - 1, 0),
                                                           torch.zeros(len(prompt) - 1, 0), states))
    trees = []
    for token in output:
        trees.append(drafter.propose(request_id, budget=40))
        drafter.observe(request_id, verification(trees[-1], [token]))
    drafter.stop_request(request_id)
    return trees


def semantic_tokens(trees):
    return {t.tokens[n] for t in trees for n in range(1, len(t)) if "sem" in t.sources[n]}


def new_drafter(**overrides):
    # PLD host: a repetitive prompt gives it a lexical match every cycle, so the key may extend it.
    config = OilbirdPLDConfig(**dict(dict(sem_self_calibrate=False, sem_rejected_pool=False,
                                          sem_index_prompt=False), **overrides))
    return make_drafter("oilbird-pld", config)


PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]


def output(base: int, n: int = 4) -> list[int]:
    """[3, 1, 2, base, 3, 1, 2, base + 1, ...]: the prompt's pattern keeps PLD matching."""
    return [t for i in range(n) for t in (3, 1, 2, base + i)]


def test_semantic_source_drafts_only_committed_records_of_its_own_tenant():
    drafter = new_drafter()
    serve(drafter, "a1", PROMPT, output(100), "A")
    trees_b = serve(drafter, "b1", PROMPT, output(200), "B")
    drafted_b = semantic_tokens(trees_b)
    assert {t for t in drafted_b if t >= 200}, "the key never fired for tenant B: the test would prove nothing"
    assert not {t for t in drafted_b if 100 <= t < 110}, "tenant A's tokens reached tenant B"
    future = output(300)
    trees_a = serve(drafter, "a2", PROMPT, future, "A")
    assert {t for t in semantic_tokens(trees_a) if 100 <= t < 110}, "same tenant: A's past should be found"
    for i, tree in enumerate(trees_a):  # nothing of this request's future, ever
        unseen = {t for t in future[i:] if t >= 300}
        assert not set(tree.tokens[1:]) & unseen, f"cycle {i} drafted an uncommitted token"


def test_the_cycle_just_committed_is_not_searchable():
    drafter = new_drafter()
    drafter.start_request("r", PROMPT, "t")
    states = STATE.repeat(len(PROMPT) - 1, 1)
    drafter.observe_prefill("r", PrefillObservation(PROMPT[:-1], torch.zeros(7, 0), torch.zeros(7, 0),
                                                    states))
    tree = drafter.propose("r", budget=40)
    drafter.observe("r", verification(tree, [50]))
    state = drafter.state("r")
    assert state.watermark.trace == state.memory.store.next_id - 1  # the record of 50 waits one cycle
    assert not semantic_tokens([drafter.propose("r", budget=40)])  # its only record has no value yet


def test_entry_budget_zero_gives_exactly_the_host_tree():
    plain, host = new_drafter(sem_entry_budget=0), make_drafter("pld")
    for drafter in (plain, host):
        serve(drafter, "a", PROMPT, output(100), "A")
    trees = serve(plain, "b", PROMPT, output(100), "A")
    host.start_request("b", PROMPT, "A")
    for tree, token in zip(trees, output(100)):
        expected = host.propose("b", budget=40)
        assert tree.tokens == expected.tokens and tree.parents == expected.parents
        host.observe("b", verification(expected, [token]))


def test_node_budget_is_never_exceeded_and_the_key_never_opens_a_chain():
    drafter = new_drafter(sem_entry_budget=30, sem_entry_share=1.0)
    serve(drafter, "a", PROMPT, output(100), "A")
    drafter.start_request("b", [7, 8, 9], "A")  # no repetition: PLD finds nothing
    states = STATE.repeat(2, 1)
    drafter.observe_prefill("b", PrefillObservation([7, 8], torch.zeros(2, 0), torch.zeros(2, 0),
                                                    states))
    assert len(drafter.propose("b", budget=40)) == 1
    trees = serve(drafter, "c", PROMPT, output(100), "A")
    assert all(len(t) <= 40 for t in trees) and semantic_tokens(trees)


def test_config_errors_are_clear():
    with pytest.raises(ValueError, match="sem_granularity"):
        OilbirdConfig(sem_granularity="sentence")
    with pytest.raises(ValueError, match="'lists' is the approximate index now"):
        OilbirdConfig(sem_index="faiss")  # the index before stop 42
    with pytest.raises(ValueError, match="sem_index_probes <= sem_index_lists"):
        OilbirdConfig(sem_index_lists=4, sem_index_probes=8)
    drafter = make_drafter("oilbird")
    drafter.start_request("r", PROMPT, "t")
    with pytest.raises(ConfigError, match="hidden_layer=-1"):  # an engine that computed no state
        drafter.observe_prefill("r", PrefillObservation(PROMPT[:-1], torch.zeros(7, 10, dtype=torch.long),
                                                        torch.zeros(7, 10), None))


def test_a_layer_the_model_lacks_is_a_clear_error(smol, api_bank_prompts):
    from oilbird.decode import DecodeConfig, decode
    from oilbird.errors import ModelError
    from oilbird.verifier import TreeVerifier

    drafter = make_drafter("oilbird", OilbirdConfig(sem_layer=40))  # SmolLM2 has 31 states
    assert drafter.hidden_layer == 40
    with pytest.raises(ModelError, match="hidden layer 40 is out of range"):
        decode(TreeVerifier(smol.tree_model(), smol.stop_ids), drafter, api_bank_prompts[0],
               DecodeConfig(max_new_tokens=4), max_context=smol.max_context)


# --- end to end on the real model ----------------------------------------------------------

@pytest.mark.heavy(35)
@pytest.mark.parametrize("method", ["oilbird", "oilbird-pld", "oilbird-tr", "oilbird-suffix"])
def test_output_equals_greedy_on_api_bank(serve_api_bank, method):
    """One drafter across 5 API-Bank requests on SmolLM2: every output is the greedy one."""
    results, tau = serve_api_bank(make_drafter(method), node_budget=60)
    assert tau > 1.2
    assert sum(r.accepted_sources.get("sem", 0) for r in results) > 0, "the key never landed"
    stats = results[-1].drafter_stats
    assert stats["store_records"] > 0 and stats["bytes_per_record"] > 0 and stats["cycles"] > 0


@pytest.mark.parametrize("overrides", [dict(sem_layer=0), dict(sem_granularity="request"),
                                       dict(sem_key_dtype="int8", sem_index="lists")])
def test_ablations_stay_lossless(serve_api_bank, overrides):
    serve_api_bank(make_drafter("oilbird", OilbirdConfig(**overrides)), node_budget=32)


# --- visibility: when a harvested record becomes searchable --------------------------------

HIDDEN = 64  # random states in 64 dims are far apart: only a record's own key is ~1.0 from a query
MARK = 5000  # the target's argmax in forward g is MARK + g: a rejected record's value names its forward


class Harness:
    """Drives a drafter on fake forwards with random states, logging which harvest added each record.

    The host is replaced by a tree whose node 1 drafts the next token right (it is accepted), so
    every forward commits two tokens: node 1's and the bonus (unique, or always `bonus` when set).
    With `rejected`, node 2 drafts `bonus` under the root: a rejected node whose token is the
    anchor of every later proposal, so each forward leaves a rejected record the pool may answer.
    Several requests may be in flight: `cycle` names the request it drives.
    """

    def __init__(self, drafter, bonus: int | None = None, rejected: bool = False, seed: int = 0) -> None:
        self.drafter, self.bonus, self.rejected = drafter, bonus, rejected
        self.gen = torch.Generator().manual_seed(seed)
        self.next_token, self.forwards = 1000, 0
        self.harvest_of: dict[int, object] = {}  # unique token -> "prompt", "anchor" or its forward
        self.request_of: dict[int, str] = {}  # unique token -> the request that committed it
        self.last_keys: dict[str, torch.Tensor] = {}  # request -> [m, d] unit keys of its last harvest
        self.current = ""  # the request of the last `start`
        drafter.host.propose = self.host_tree

    def host_tree(self, request_id: str, budget: int) -> DraftTree:
        tree = DraftTree.chain(self.drafter.state(request_id).anchor, [self.next_token], "pld")
        if self.rejected:
            tree.add(0, self.bonus, "pld")
        return tree

    def take(self, n: int) -> list[int]:
        self.next_token += n
        return list(range(self.next_token - n, self.next_token))

    def start(self, request_id: str, prompt_len: int = 6, tenant: str = "t") -> None:
        prompt = self.take(prompt_len)
        if self.bonus is not None:
            prompt[-1] = self.bonus  # every anchor is the bonus: the pool may answer every proposal
        self.harvest_of.update({t: "prompt" for t in prompt[1:-1]} | {prompt[-1]: "anchor"})
        self.request_of.update({t: request_id for t in prompt})
        self.drafter.start_request(request_id, prompt, tenant)
        p = prompt_len - 1
        states = torch.randn(p, HIDDEN, generator=self.gen)  # [p, d]
        self.drafter.observe_prefill(request_id, PrefillObservation(prompt[:-1], torch.zeros(p, 0),
                                                                    torch.zeros(p, 0), states))
        self.last_keys[request_id] = normalize(states[-1:])  # the anchor's own record: the first query
        self.current = request_id

    def cycle(self, cycle: int, request_id: str | None = None) -> DraftTree:
        """Propose, then observe forward `cycle` (0-based) of `request_id` (default: the last started)."""
        request_id = request_id or self.current
        tree = self.drafter.propose(request_id, budget=40)
        n = len(tree)
        committed = self.take(1) + ([self.bonus] if self.bonus is not None else self.take(1))
        self.harvest_of.update({t: cycle for t in committed if t != self.bonus})
        self.request_of.update({t: request_id for t in committed if t != self.bonus})
        states = torch.randn(n, HIDDEN, generator=self.gen)  # [n, d]
        argmax = torch.full((n,), MARK + self.forwards)
        self.drafter.observe(request_id, Verification(
            tree=tree, prefix_len=0, argmax=argmax, topk_ids=argmax[:, None].repeat(1, 10),
            topk_logits=torch.zeros(n, 10), hidden=states, path=[1], committed=committed,
            finished=False))
        self.last_keys[request_id] = normalize(states[:2])  # committed token j was predicted by ([root] + path)[j]
        self.forwards += 1
        return tree


def spy_on(monkeypatch, cls, log: list, read) -> None:
    """Log `read(structure, ids)` for every `cls.search` answer, at the moment it is given (a later
    add may evict and renumber), while the search keeps working."""
    original = cls.search

    def search(self, *args, **kwargs):
        sims, ids = original(self, *args, **kwargs)
        log.append(read(self, list(ids)))
        return sims, ids

    monkeypatch.setattr(cls, "search", search)


def store_keys(store, ids) -> torch.Tensor:
    return torch.stack([store.keys.rows(i, i + 1)[0] for i in ids]) if ids else torch.empty(0, HIDDEN)  # [m, d]


def store_tokens(store, ids) -> set[int]:
    return {store.tokens[i] for i in ids}


def pool_forwards(pool, slots) -> set[int]:
    return {pool.values[s][0] - MARK for s in slots}  # the forward that harvested each record


def probe_drafter(**overrides):
    config = OilbirdPLDConfig(**dict(dict(sem_self_calibrate=False, sem_floor=False, sem_index="exact",
                                          sem_top_k=64, sem_rejected_pool=False), **overrides))
    return make_drafter("oilbird-pld", config)


@pytest.mark.parametrize("granularity", ["position", "request"])
def test_eviction_never_makes_the_cycle_just_committed_searchable(monkeypatch, granularity):
    """A store of 12 records evicts every other cycle; no search may return a record of the
    harvest just made, above all the query's own record (its similarity 1.0 would pass any floor)."""
    searches: list = []
    spy_on(monkeypatch, TraceStore, searches, store_keys)
    harness = Harness(probe_drafter(sem_max_records=12, sem_top_k=8, sem_granularity=granularity))
    checked = 0
    for r in range(3):
        harness.start(f"r{r}")
        for c in range(8):
            keys_before = harness.last_keys[f"r{r}"]
            n = len(searches)
            harness.cycle(c)
            for keys in searches[n:]:
                similarity = float((keys @ keys_before.T).max()) if len(keys) else 0.0  # [m, m'] -> max
                assert similarity < 0.9, f"request {r} cycle {c}: searched a record of the harvest just made"
                checked += 1
        harness.drafter.stop_request(f"r{r}")
    store = harness.drafter.memories.get("t").store
    assert checked and store.evicted_records > 20, "the store never evicted: the test would prove nothing"


def test_a_trace_record_is_searchable_from_the_second_proposal_after_its_harvest(monkeypatch):
    """Forward c's records skip proposal c + 1 and are searchable from proposal c + 2 on; prompt
    records from the first proposal, except the anchor's own (it is the query) from the second;
    every record of an earlier request from the next request's first proposal."""
    searches: list = []
    spy_on(monkeypatch, TraceStore, searches, store_tokens)
    harness = Harness(probe_drafter())
    earlier: set[int] = set()  # the records of earlier requests
    for r in range(2):
        harness.start(f"r{r}")
        for p in range(6):
            n = len(searches)
            harness.cycle(p)
            found = searches[n]
            expected = {t for t, h in harness.harvest_of.items()
                        if h == "prompt" or (h == "anchor" and p >= 1)
                        or (isinstance(h, int) and h <= p - 2)} | earlier
            assert found == expected, f"request {r}, proposal {p}"
        earlier |= set(harness.harvest_of)
        harness.harvest_of.clear()
        harness.drafter.stop_request(f"r{r}")


def test_a_rejected_record_is_searchable_from_the_second_proposal_after_its_harvest(monkeypatch):
    """The same rule for the rejected-branch pool: forward c's records skip proposal c + 1; every
    record of an earlier request is searchable from the next request's first proposal."""
    searches: list = []
    spy_on(monkeypatch, RejectedPool, searches, pool_forwards)
    harness = Harness(probe_drafter(sem_rejected_pool=True), bonus=7, rejected=True)
    first_forward = 0
    for r in range(2):
        harness.start(f"r{r}")
        for p in range(6):
            n = len(searches)
            harness.cycle(p)
            found = searches[n]  # forwards, counted over requests
            # Every forward of earlier requests, and this request's up to p - 2.
            expected = set(range(first_forward)) | set(range(first_forward, first_forward + p - 1))
            assert found == expected, f"request {r}, proposal {p}"
        first_forward = harness.forwards
        harness.drafter.stop_request(f"r{r}")


def test_a_tenant_dropped_before_its_first_states_is_not_built_again():
    """The store is built at the first hidden states; a drop before them leaves the request its
    own memory, and neither the prefill nor the forwards register it under the tenant again."""
    drafter = new_drafter()
    drafter.start_request("r", PROMPT, "A")
    drafter.drop_tenant("A")
    states = STATE.repeat(len(PROMPT) - 1, 1)
    drafter.observe_prefill("r", PrefillObservation(PROMPT[:-1], torch.zeros(7, 0), torch.zeros(7, 0), states))
    for token in output(100, 2):
        drafter.observe("r", verification(drafter.propose("r", budget=40), [token]))
    state = drafter.stop_request("r")
    assert "A" not in drafter.memories and drafter.memory_bytes() == 0
    assert len(state.memory.store) > 0  # the request kept harvesting into its orphaned memory


def test_two_interleaved_requests_of_one_tenant_keep_the_rule_and_their_own_values(monkeypatch):
    """Requests a and b of one tenant take turns (a's forward p, then b's forward p). Each skips
    its own newest harvest at its next proposal, above all its query's own record, but finds
    what the other request committed before its last harvest; no value crosses requests."""
    searches: list = []
    spy_on(monkeypatch, TraceStore, searches, lambda store, ids: (store_tokens(store, ids), store_keys(store, ids)))
    values: list = []
    original_value = TraceStore.value

    def value(self, record, length, visible_end):
        chain = original_value(self, record, length, visible_end)
        values.append((self.tokens[record], chain))
        return chain

    monkeypatch.setattr(TraceStore, "value", value)
    harness = Harness(probe_drafter())

    def records(request: str, upto_forward: int, anchor: bool = True) -> set[int]:
        return {t for t, h in harness.harvest_of.items() if harness.request_of[t] == request
                and (h == "prompt" or (h == "anchor" and anchor) or (isinstance(h, int) and h <= upto_forward))}

    harness.start("a")
    harness.start("b")
    for p in range(5):
        for request, other in (("a", "b"), ("b", "a")):
            own_keys, n = harness.last_keys[request], len(searches)
            harness.cycle(p, request)
            found, keys = searches[n]
            if p == 0:  # b prefilled after a: a's first proposal knows nothing of b
                expected = records(request, -1, anchor=False) | (records("a", -1) if request == "b" else set())
            else:  # the other's forward p - 1 came before b's harvest p - 1, after a's
                expected = records(request, p - 2) | records(other, p - 1 if request == "b" else p - 2)
            assert found == expected, f"request {request}, proposal {p}"
            assert not len(keys) or float((keys @ own_keys.T).max()) < 0.9, "found its own newest record"
    assert any(chain for _, chain in values), "no value was read: the test would prove nothing"
    for token, chain in values:
        assert {harness.request_of[t] for t in chain} <= {harness.request_of[token]}, "a value crossed requests"


def test_a_partial_prefill_gives_the_first_query_and_indexes_nothing():
    """An external engine (vLLM) gives only the last layer's state at the last prompt position;
    its top-k may be missing. That state is the first query; the prompt is not indexed."""
    drafter = new_drafter(sem_index_prompt=True)
    serve(drafter, "a1", PROMPT, output(100), "A")
    store = drafter.memories.get("A").store
    held = len(store)
    prompt = PROMPT + [3]  # the engine already sampled the first output token: it is the anchor
    state = drafter.start_request("a2", prompt, "A")
    drafter.observe_prefill("a2", PrefillObservation(PROMPT, None, None, STATE[None]))  # [1, d]
    assert len(store) == held and state.query is not None and state.watermark.trace == store.next_id
    trees = []
    for token in output(200, 2):
        trees.append(drafter.propose("a2", budget=40))
        ver = verification(trees[-1], [token])
        drafter.observe("a2", Verification(**dict(vars(ver), topk_ids=None, topk_logits=None)))
    assert {t for t in semantic_tokens(trees[:1]) if 100 <= t < 110}, "the partial query found nothing"
    assert len(store) == held + 8
    drafter.start_request("b1", prompt, "B")  # a tenant's first states may come from a partial prefill
    drafter.observe_prefill("b1", PrefillObservation(PROMPT, None, None, STATE[None]))
    assert len(drafter.memories.get("B").store) == 0 and drafter.state("b1").query is not None


def test_prompt_positions_a_prefix_cache_reused_are_not_indexed_twice():
    drafter = new_drafter(sem_index_prompt=True)
    serve(drafter, "a1", PROMPT, output(100), "A")
    store = drafter.memories.get("A").store
    held, ids = len(store), store.next_id
    prompt = PROMPT + [9, 9, 2]  # shares PROMPT[:-1] with a1: 7 positions came from its prefill
    drafter.start_request("a2", prompt, "A")
    p = len(prompt) - 1
    drafter.observe_prefill("a2", PrefillObservation(prompt[:-1], torch.zeros(p, 0), torch.zeros(p, 0),
                                                     STATE.repeat(p, 1), reused=7))
    assert len(store) == held + p - 7  # only the new positions, the anchor's record the newest
    assert store.tokens[store.index_of(ids):] == prompt[8:]
    drafter.start_request("a3", prompt, "A")
    drafter.observe_prefill("a3", PrefillObservation(prompt[:-1], torch.zeros(p, 0), torch.zeros(p, 0),
                                                     STATE.repeat(p, 1), reused=p))
    assert len(store) == held + p - 7 + 1  # all reused: still the anchor's record (the first query's)


def test_paid_semantic_nodes_are_counted_as_the_engine_verified_them():
    # An engine that prunes the proposal ('fit', vLLM's chain) renumbers the paid nodes; the
    # semantic source's paid count is of what was verified, not of what was proposed.
    drafter = new_drafter()
    serve(drafter, "a1", PROMPT, output(100), "A")
    for keep_semantic in (True, False):
        rid = f"r{keep_semantic}"
        drafter.start_request(rid, PROMPT, "A")
        n = len(PROMPT) - 1
        drafter.observe_prefill(rid, PrefillObservation(PROMPT[:-1], torch.zeros(n, 0), torch.zeros(n, 0),
                                                        STATE.repeat(n, 1)))
        fired = False
        for token in output(300):
            before = drafter.request_stats(rid)["sem_paid"]
            tree = drafter.propose(rid, budget=40)
            paid = [n for n in range(1, len(tree)) if "sem" in tree.sources[n]]
            keep = list(range(1, len(tree)))
            if paid and not fired:  # the first cycle where the key fired: the engine prunes
                fired = True
                keep = sorted({a for p in paid for a in tree.path_to(p)}) if keep_semantic else []
                drafter.restrict_proposal(rid, keep)
            drafter.observe(rid, verification(tree.subtree(keep), [token]))
            if paid and keep != list(range(1, len(tree))):
                counted = drafter.request_stats(rid)["sem_paid"] - before
                assert (counted >= 1) if keep_semantic else (counted == 0), counted
        drafter.stop_request(rid)
        assert fired, "the key never fired: the test would prove nothing"


@pytest.mark.parametrize("config_class, bad_host_field", [
    (OilbirdConfig, dict(top_k=0)), (OilbirdPLDConfig, dict(min_ngram=0)),
    (OilbirdTRConfig, dict(top_k=0)), (OilbirdSuffixConfig, dict(max_depth=0))])
def test_a_semantic_config_checks_its_hosts_fields_and_its_own(config_class, bad_host_field):
    """SemanticConfig's checks hand over to the host config's (next in the MRO): a bad value of
    either half is refused with its reason."""
    config_class()  # the defaults pass both
    with pytest.raises(ValueError, match=next(iter(bad_host_field))):
        config_class(**bad_host_field)
    with pytest.raises(ValueError, match="sem_theta"):
        config_class(sem_theta=1.5)


def _spine_after_traffic(config: OilbirdConfig) -> tuple[list[int], list[float]]:
    """The spine's tokens and scores for a request ending "3 4" after three past requests in
    which "3 4" was followed by 5 once and by 7 twice (text only: no hidden states)."""
    drafter = make_drafter("oilbird", config)
    for rid, out in (("r1", [4, 5, 6]), ("r2", [4, 7, 8]), ("r3", [4, 7, 8])):
        drafter.start_request(rid, [1, 2, 3], "t")
        drafter.observe(rid, Verification(tree=DraftTree.root(3), prefix_len=0,
                                          argmax=torch.zeros(1, dtype=torch.long), topk_ids=None,
                                          topk_logits=None, path=[], committed=out, finished=False))
        drafter.stop_request(rid)
    drafter.start_request("r4", [9, 3, 4], "t")
    tree = drafter.propose("r4", budget=20)
    spine = drafter.host.state("r4").spine_nodes
    return [tree.tokens[n] for n in spine], [tree.scores[n] for n in spine]


def test_oilbirds_spine_follows_the_pools_most_frequent_continuation_scored_by_its_counts():
    tokens, scores = _spine_after_traffic(OilbirdConfig())
    assert tokens == [7, 8]  # the majority, where SAM-Decoding's rule copies the first (5 6)
    first_tokens, first_scores = _spine_after_traffic(OilbirdConfig(spine_occurrence="first",
                                                                    spine_count_scores=False))
    assert first_tokens == [5, 6]
    # The match's confidence, scaled by each path's probability: 7 followed "3 4" twice in three
    # times, and "3 4 7" was always followed by 8.
    assert scores == pytest.approx([first_scores[0] * 2 / 3] * 2)
