"""SAM-Decoding-style drafter: suffix automata over the tenant's pool and the request itself (§4).

Two automata answer "what followed the longest suffix of the text so far?":
- the *pool* automaton of the tenant's past requests (prompts and outputs; `oilbird.pool`), kept
  across requests (capped, see below); a request joins it only when it ends (strictly online);
- a *local* automaton over each request's committed text (kept in its `SAMState`), extended
  token by token with its cursor advanced before each extension, so the text never matches its
  own newest position.
The longer match drafts a chain of `min(max_predicts, 1 + floor(alpha * match_len))` tokens from
its first occurrence, or its most recent one with `occurrence='recent'` (ties go to the local
automaton). When that chain is shorter than the budget
allows, the drafter backs off: the other distinct next tokens after the matched suffix, then after
shorter suffixes, each start one more chain under the root, until `max_candidates` chains or the
budget is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.registry import register
from oilbird.pool import Pool, PoolConfig, TokenStore
from oilbird.suffix_automaton import SuffixAutomaton
from oilbird.tree import DraftTree
from oilbird.verifier import Verification


@dataclass
class SAMConfig:
    """SAM-only drafting (SAM-Decoding's defaults for the variant without an auxiliary drafter)."""

    max_predicts: int = 60
    """Longest chain drafted from one match."""
    alpha: float = 4.0
    """Chain length grows with the match: 1 + floor(alpha * match_length)."""
    min_match: int = 1
    """Shortest suffix match that may draft."""
    max_candidates: int = 8
    """Chains under the root after back-off (1 = the single best match only)."""
    pool_max_tokens: int = 4_000_000
    """Cap on each tenant's pool in tokens; the oldest requests (by the time they ended) are
    evicted beyond it."""
    occurrence: str = "first"
    """Which occurrence of the matched suffix a chain is copied from: 'first' (SAM-Decoding: the
    earliest, with the longest tail) or 'recent' (the latest; repetitive traffic tends to repeat
    its latest turn. The automata then also track latest ends: about 25% more build time)."""

    def __post_init__(self) -> None:
        if self.occurrence not in ("first", "recent"):
            raise ValueError(f"occurrence must be 'first' or 'recent', got {self.occurrence!r}")
        if self.max_predicts < 1 or self.min_match < 1 or self.max_candidates < 1:
            raise ValueError("max_predicts, min_match and max_candidates must be >= 1")
        if self.alpha <= 0:
            raise ValueError(f"alpha must be > 0, got {self.alpha}")


def chain_length(match_length: int, alpha: float, max_predicts: int) -> int:
    """SAM-Decoding's length rule: longer matches earn longer drafts."""
    return min(max_predicts, 1 + math.floor(alpha * match_length))


class _Cursor:
    """A match cursor into one automaton."""

    def __init__(self, sam: SuffixAutomaton) -> None:
        self.sam, self.state, self.length = sam, 0, 0

    def advance(self, token: int) -> None:
        self.state, self.length = self.sam.advance(self.state, self.length, token)


def _advance_local(state: SAMState, token: int) -> None:
    state.local_cursor.advance(token)  # before extending: never match the newest position
    state.local.extend(token)


@dataclass
class SAMState(RequestState):
    """A SAM request: its tenant's store, its local automaton and the two match cursors.

    The pool cursor follows `store.sam` as of `pool_version`; `propose` re-matches it when the
    store changed (another request of the tenant ended) since.
    """

    store: TokenStore | None = None
    """The tenant's pool store, kept for the whole request (a drop_tenant orphans it)."""
    local: SuffixAutomaton | None = None
    """Automaton over this request's committed text."""
    local_cursor: _Cursor | None = None
    pool_cursor: _Cursor | None = None
    pool_version: int = -1
    """`store.version` when `pool_cursor` was last matched."""


@register
class SAMDrafter(Drafter):
    """Suffix-automaton drafter over the cross-request pool and each request's own text."""

    name = "sam"
    Config = SAMConfig
    State = SAMState

    def __init__(self, config: SAMConfig | None = None) -> None:
        super().__init__(config)
        self.recent = self.config.occurrence == "recent"
        self.pool = Pool(PoolConfig(self.config.pool_max_tokens, track_recent=self.recent))

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> SAMState:
        state = super().start_request(request_id, prompt_ids, tenant)
        # The request keeps its store: a drop_tenant while it runs orphans it (its text is then
        # lost with it), and nothing re-creates the tenant before its next request.
        state.store = self.pool.get(tenant)
        state.local = SuffixAutomaton(self.recent)
        state.local_cursor = _Cursor(state.local)
        self._sync_pool_cursor(state)
        for token in prompt_ids:
            _advance_local(state, token)
        return state

    def _sync_pool_cursor(self, state: SAMState) -> None:
        # The pool changes only when a request ends; re-match when it did (a concurrent request
        # finished) rather than keep a cursor into a rebuilt automaton.
        state.pool_cursor = _Cursor(state.store.sam)
        state.pool_version = state.store.version
        for token in state.sequence[-self.config.max_predicts:]:
            state.pool_cursor.advance(token)

    def observe(self, request_id: str, verification: Verification) -> SAMState:
        state = super().observe(request_id, verification)
        for token in verification.committed:
            _advance_local(state, token)
            state.pool_cursor.advance(token)
        return state

    def stop_request(self, request_id: str) -> SAMState | None:
        """End the request; its text joins its tenant's pool only now (unknown ids are ignored)."""
        state = super().stop_request(request_id)
        if state is not None:
            state.store.add_request(request_id, state.sequence)  # only now may others draft from it
        return state

    def longest_match(self, request_id: str, max_tokens: int) -> tuple[list[int], int]:
        """The chain the longest match drafts (at most `max_tokens`, SAM's length rule) and the
        match's length; ([], length) when the match is shorter than `min_match`. For drafters that
        use SAM as a lexical source (GOOSE's `spine='pool'`)."""
        state = self.state(request_id)
        if state.store.version != state.pool_version:
            self._sync_pool_cursor(state)
        best = max((state.local_cursor, state.pool_cursor), key=lambda c: c.length)  # local wins ties
        if best.length < self.config.min_match or max_tokens < 1:
            return [], best.length
        want = min(chain_length(best.length, self.config.alpha, self.config.max_predicts), max_tokens)
        return best.sam.continuation(best.state, want, self.recent), best.length

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        if state.store.version != state.pool_version:
            self._sync_pool_cursor(state)
        tree = DraftTree.root(state.anchor)
        cfg = self.config
        cursors = sorted((state.local_cursor, state.pool_cursor), key=lambda c: -c.length)
        best = cursors[0]  # stable sort: the local automaton wins ties
        if best.length < cfg.min_match or budget < 2:
            return tree
        want = chain_length(best.length, cfg.alpha, cfg.max_predicts)
        tree.add_chain(0, best.sam.continuation(best.state, min(want, budget - 1), self.recent), self.name)
        chains = 1
        # Back-off: other next tokens after the matched suffix (and shorter ones), one chain each.
        for cursor in cursors:
            if chains >= cfg.max_candidates or len(tree) >= budget:
                break
            if cursor.length < cfg.min_match:
                continue
            for token, nxt, length in cursor.sam.candidates(cursor.state, cursor.length,
                                                             cfg.max_candidates, cfg.min_match):
                if chains >= cfg.max_candidates or len(tree) >= budget:
                    break
                if tree.child(0, token) is not None:
                    continue
                room = budget - len(tree)  # >= 1 here
                want = min(chain_length(length, cfg.alpha, cfg.max_predicts), room)
                chain = [token] + cursor.sam.continuation(nxt, want - 1, self.recent)
                score = length / best.length  # shorter matches are less trustworthy
                tree.add_chain(0, chain, self.name, [score] * len(chain))
                chains += 1
        return tree
