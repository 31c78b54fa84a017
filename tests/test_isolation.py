"""Every registered drafter: tenant isolation and no leakage.

The first two tests use hand-built traffic: each tenant's traffic uses its own token range, and
the fake verifications only ever report top-k ids from the same range, so any token of another
range in a draft is a leak.

The rest serve real requests on the real model (SmolLM2-135M) through `decode`, with the drafter
wrapped in `Audited`: a proxy that keeps an oracle of everything the drafter may legitimately know
when it proposes (the tenant's finished requests, this request's committed tokens, and every id
the verifier handed it), and flags any drafted token outside it. Another instance of the same
method serves the whole stream first, so the future (this request's output, and a later request
planted with rare words) exists in the process while the audited instance drafts. Negative
controls hand a drafter that future behind the oracle's back and check that it is flagged.
"""

import importlib.util
from dataclasses import dataclass

import pytest
import torch

from oilbird.decode import DecodeConfig, decode
from oilbird.drafters import DRAFTERS, Drafter, make_drafter
from oilbird.drafters.base import RequestState
from oilbird.verifier import PrefillObservation, TreeVerifier, Verification

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
                        hidden=hidden, path=[],
                        committed=committed, finished=False)


def serve(drafter, request_id, prompt, output, tenant, token_range, seen_drafts):
    drafter.start_request(request_id, prompt, tenant)
    if drafter.needs_prefill:
        p = len(prompt) - 1
        topk = token_range[0] + torch.arange(p * 10).reshape(p, 10) % (token_range[1] - token_range[0])
        hidden = torch.randn(p, HIDDEN)
        drafter.observe_prefill(request_id, PrefillObservation(prompt[:-1], topk,
                                                               torch.linspace(5, 0, 10).repeat(p, 1),
                                                               hidden))
    for token in output:
        tree = drafter.propose(request_id, budget=32)
        seen_drafts.update(tree.tokens[1:])
        drafter.observe(request_id, fake_verification(tree, [token], token_range))
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


# --- No future, on the real model ------------------------------------------------------------

# A short stream of one tenant. The last request is planted with rare words: their token ids
# appear nowhere earlier in the stream (checked below), so drafting one before that request
# starts can only come from the future.
PLANTED = "zygomorphic quokka xylophagous kumquat syzygy"
STREAM = [
    "Write a JSON object describing a book with the fields title, author, year and genres, "
    "then a second JSON object with the same fields for another book.",
    "Repeat the following sentence twice, exactly: "
    "The quick brown fox jumps over the lazy dog near the river bank.",
    f"Repeat exactly, three times: {PLANTED}.",
]
TENANT = "t"
MAX_NEW = 24
# Lexical copy drafters: every root-to-leaf path of their trees, anchor included, is copied text.
LEXICAL = {"pld", "sam", "suffix"}


@dataclass
class Violation:
    request_id: str
    cycle: int
    kind: str
    """'id': drafted tokens the drafter could not know; 'path': a root-to-leaf copy of text it
    could not know."""
    tokens: list[int]


@dataclass
class AuditedState(RequestState):
    cycle: int = 0
    """Proposals made so far for this request."""


class Audited(Drafter):
    """A real drafter behind a proxy that checks every tree against what it may know.

    The oracle, per tenant (the stream uses one): every token of the tenant's requests that
    ended before now, this request's prompt and committed tokens, and every id the verifier
    handed the drafter (the top-k and argmax of each prefill and verification observation so
    far; Token Recycling and GOOSE legitimately draft from them). A drafted token outside that
    set is an 'id' violation. With `lexical`, every root-to-leaf path must also occur contiguously
    in one finished request or in this request's committed text ('path'), which catches a copy
    from the future even when its ids happen to be known.
    """

    State = AuditedState

    def __init__(self, inner: Drafter, lexical: bool = False) -> None:
        super().__init__()
        self.inner, self.lexical = inner, lexical
        self.needs_prefill = inner.needs_prefill
        self.prefill_topk = inner.prefill_topk
        self.hidden_layer = inner.hidden_layer
        self.known: set[int] = set()
        self.finished: list[list[int]] = []
        self.known_at_start: dict[str, frozenset[int]] = {}
        self.violations: list[Violation] = []
        self.trees: list[tuple[str, list[int], list[int]]] = []  # (request, tokens, parents)
        self.drafted = 0

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> AuditedState:
        assert tenant == TENANT, "the oracle is kept for one tenant"
        state = super().start_request(request_id, prompt_ids, tenant)
        self.inner.start_request(request_id, prompt_ids, tenant)
        self.known_at_start[request_id] = frozenset(self.known)
        self.known.update(int(t) for t in prompt_ids)
        return state

    def observe_prefill(self, request_id: str, observation: PrefillObservation) -> None:
        self.inner.observe_prefill(request_id, observation)
        self.known.update(int(t) for t in observation.tokens)
        self.known.update(observation.topk_ids.reshape(-1).tolist())

    def propose(self, request_id: str, budget: int):
        state = self.state(request_id)
        tree = self.inner.propose(request_id, budget)
        where = (request_id, state.cycle)
        state.cycle += 1
        self.trees.append((request_id, list(tree.tokens), list(tree.parents)))
        self.drafted += len(tree) - 1
        unknown = [t for t in tree.tokens[1:] if t not in self.known]
        if unknown:
            self.violations.append(Violation(*where, "id", unknown))
        if self.lexical:
            texts = self.finished + [state.sequence]
            for path in root_to_leaf_paths(tree.tokens, tree.parents):
                if not any(occurs_in(path, text) for text in texts):
                    self.violations.append(Violation(*where, "path", path))
        return tree

    def observe(self, request_id: str, verification: Verification) -> AuditedState:
        self.inner.observe(request_id, verification)
        state = super().observe(request_id, verification)
        self.known.update(int(t) for t in verification.committed)
        self.known.update(verification.argmax.reshape(-1).tolist())
        self.known.update(verification.topk_ids.reshape(-1).tolist())
        return state

    def stop_request(self, request_id: str) -> AuditedState | None:
        self.inner.stop_request(request_id)
        state = super().stop_request(request_id)
        if state is not None:
            self.finished.append(list(state.sequence))
        return state

    def request_stats(self, request_id: str) -> dict:
        return self.inner.request_stats(request_id)


def root_to_leaf_paths(tokens: list[int], parents: list[int]) -> list[list[int]]:
    """Each leaf's tokens from the root (the anchor) down; none for a root-only tree."""
    has_child = set(parents[1:])
    paths = []
    for leaf in range(1, len(tokens)):
        if leaf in has_child:
            continue
        path, node = [], leaf
        while node != -1:
            path.append(tokens[node])
            node = parents[node]
        paths.append(path[::-1])
    return paths


def occurs_in(path: list[int], text: list[int]) -> bool:
    """Whether `path` is a contiguous run of `text`."""
    n = len(path)
    return any(text[i] == path[0] and text[i:i + n] == path for i in range(len(text) - n + 1))


@pytest.fixture(scope="module")
def stream(smol):
    """The stream's chat-formatted prompts, and the planted words' token ids that occur nowhere
    in the earlier prompts."""
    prompts = [smol.encode_chat([{"role": "user", "content": text}]) for text in STREAM]
    earlier = {t for ids in prompts[:-1] for t in ids}
    planted = set(smol.encode_chat([{"role": "user", "content": PLANTED}])) - earlier
    assert len(planted) >= 5, "the planted words must bring ids of their own"
    return prompts, frozenset(planted)


@pytest.fixture(scope="module")
def verifier(smol):
    return TreeVerifier(smol.tree_model(), smol.stop_ids)


def serve_stream(smol, verifier, drafter, prompts) -> list[list[int]]:
    """Serve `prompts` in order as requests r0, r1, ... of one tenant; their outputs."""
    return [decode(verifier, drafter, ids, DecodeConfig(max_new_tokens=MAX_NEW),
                   max_context=smol.max_context, request_id=f"r{i}", tenant=TENANT).output_ids
            for i, ids in enumerate(prompts)]


def describe(smol, violations: list[Violation], limit: int = 6) -> str:
    return "; ".join(f"{v.request_id} cycle {v.cycle} {v.kind} {smol.decode(v.tokens)!r} {v.tokens}"
                     for v in violations[:limit]) + (f" (+{len(violations) - limit} more)"
                                                      if len(violations) > limit else "")


@pytest.mark.parametrize("method", METHODS)
def test_no_draft_from_the_future_on_the_real_model(method, smol, stream, verifier):
    """A drafter drafts only what it could know, although the future exists in the process.

    A twin (another instance of the method) serves the whole stream first, as another benchmark
    row or process would: this request's output and the planted later request are then in
    memory. The audited instance must draft only known tokens, and exactly the trees the twin
    drafted when nothing had been served before it.
    """
    prompts, planted = stream
    twin = Audited(make_drafter(method), lexical=method in LEXICAL)
    twin_outputs = serve_stream(smol, verifier, twin, prompts)
    audited = Audited(make_drafter(method), lexical=method in LEXICAL)
    outputs = serve_stream(smol, verifier, audited, prompts)

    assert audited.drafted, f"{method} drafted nothing: the test would prove nothing"
    unknown_until_planted = planted - audited.known_at_start[f"r{len(prompts) - 1}"]
    assert len(unknown_until_planted) >= 3, \
        "the planted ids were known before their request: the stream no longer tests the future"
    for drafter in (twin, audited):
        assert not drafter.violations, f"{method} drafted what it could not know: " \
                                       f"{describe(smol, drafter.violations)}"
    assert outputs == twin_outputs
    assert audited.trees == twin.trees, f"{method}: a fresh instance drafted differently after " \
                                        "another instance served the same stream (shared state)"


def test_the_oracle_flags_a_later_request_drafted_early(smol, stream, verifier):
    """Negative control: SAM serves the planted last request out of order, behind the oracle's
    back; then r0 and r1 draft its rare words, and the oracle must say so."""
    prompts, planted = stream
    sam = make_drafter("sam")
    decode(verifier, sam, prompts[-1], DecodeConfig(max_new_tokens=MAX_NEW),
           max_context=smol.max_context, request_id=f"r{len(prompts) - 1}", tenant=TENANT)
    audited = Audited(sam, lexical=True)
    serve_stream(smol, verifier, audited, prompts[:-1])
    leaked = {t for v in audited.violations if v.kind == "id" for t in v.tokens}
    assert leaked & planted, f"planted ids were not flagged: {describe(smol, audited.violations)}"
    assert any(v.kind == "path" for v in audited.violations)


# One lexical pool (both checks) and one top-k table (the id check). PLD holds nothing across
# requests, and SuffixDecoding evicts a request id's cached response when it runs again, so
# sharing leaks them little or nothing.
SHARING = ["sam", "tr"]


@pytest.mark.parametrize("method", SHARING)
def test_the_oracle_flags_a_twin_that_shares_state(method, smol, stream, verifier):
    """Negative control: the same as the main test, but the twin *is* the audited drafter, as if
    two instances shared their pools; the oracle must flag the audited pass."""
    prompts, planted = stream
    drafter = make_drafter(method)
    serve_stream(smol, verifier, drafter, prompts)
    audited = Audited(drafter, lexical=method in LEXICAL)
    serve_stream(smol, verifier, audited, prompts)
    # r0 is the first request the oracle sees: whatever is flagged there came from the future.
    assert any(v.kind == "id" and v.request_id == "r0" for v in audited.violations), \
        f"{method}: no leak flagged in r0: {describe(smol, audited.violations)}"
    if method in LEXICAL:
        assert any(v.kind == "path" and v.request_id == "r0" for v in audited.violations)
        leaked = {t for v in audited.violations if v.request_id != "r2" for t in v.tokens}
        assert leaked & planted, "the planted request was not flagged before it started"
