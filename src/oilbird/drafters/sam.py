"""SAM-Decoding-style drafter: suffix automata over the tenant's pool and the request itself (§4).

Two automata answer "what followed the longest suffix of the text so far?":
- the *pool* automaton of the tenant's past requests (prompts and outputs; `oilbird.pool`), kept
  across requests (capped, see below); a request joins it only when it ends (strictly online);
- a *local* automaton over each request's committed text (kept in its `SAMState`), extended
  token by token with its cursor advanced before each extension, so the text never matches its
  own newest position.
With `live`, the local automata of the tenant's *other requests in flight* are matched too (their
committed text so far, as SuffixDecoding's global tree holds active responses): in an engine that
batches requests, a request then drafts from the answers its neighbors are writing, not only from
those that ended. One request at a time (our decode loop) sees no difference.
The longest match drafts a chain of `min(max_predicts, 1 + floor(alpha * match_len))` tokens from
its first occurrence, or its most recent one with `occurrence='recent'`, or token by token the
one that most often followed the text matched so far with `occurrence='frequent'` (ties go to
the local automaton, then the pool's). With `count_scores` each
chain node is scored by the estimated probability of its path, the product of count ratios
along it, as SuffixDecoding scores its tree; otherwise the chain's nodes all score 1. When that
chain is shorter than the budget allows, the drafter backs off: the other distinct next tokens
after the matched suffix, then after shorter suffixes, each start one more chain under the root,
until `max_candidates` chains or the budget is spent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

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
    earliest, with the longest tail), 'recent' (the latest; repetitive traffic tends to repeat
    its latest turn. The automata then also track latest ends: about 25% more build time) or
    'frequent' (token by token the most frequent follower of the text matched so far, as
    SuffixDecoding drafts; the automata then count occurrences, a walk per token as 'recent')."""
    count_scores: bool = False
    """Score the main chain's nodes by the estimated probability of their path (the product of
    count ratios along it) instead of 1: the 'fit' budget's estimates are keyed by score bins, so
    it can then tell a continuation the pool agrees on from one it saw once."""
    live: bool = False
    """Also match the committed text of the tenant's other requests in flight (see the module
    docstring). Off for `sam` (SAM-Decoding matches its pool and the request only); Oilbird's
    spine turns it on (`GooseConfig.spine_live`)."""

    def __post_init__(self) -> None:
        if self.occurrence not in ("first", "recent", "frequent"):
            raise ValueError(f"occurrence must be 'first', 'recent' or 'frequent', got {self.occurrence!r}")
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

    def refresh(self) -> None:
        """Re-seat the cursor after its automaton grew. An extension may split the matched
        state, the shorter strings moving to a clone on its suffix-link path: walk up to the
        state whose strings have the matched length. (New occurrences further on are not looked
        for: the match stays valid, if not always the longest.)"""
        link, lengths = self.sam.link, self.sam.length
        while self.state > 0 and self.length <= lengths[link[self.state]]:
            self.state = link[self.state]

    def continues(self) -> bool:
        """Whether the match has a continuation to copy: it does unless its only occurrence ends
        the stream (a request in flight whose newest text this match is)."""
        return self.length > 0 and self.sam.first_end[self.state] < len(self.sam.tokens) - 1


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
    live: dict[str, _Cursor] = field(default_factory=dict)
    """`live`: other request id -> a cursor into that request's local automaton."""


@register
class SAMDrafter(Drafter):
    """Suffix-automaton drafter over the cross-request pool and each request's own text."""

    name = "sam"
    Config = SAMConfig
    State = SAMState

    def __init__(self, config: SAMConfig | None = None) -> None:
        super().__init__(config)
        self.recent = self.config.occurrence == "recent"
        self.frequent = self.config.occurrence == "frequent"
        self.counted = self.frequent or self.config.count_scores
        self.pool = Pool(PoolConfig(self.config.pool_max_tokens, track_recent=self.recent,
                                    track_counts=self.counted))

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> SAMState:
        state = super().start_request(request_id, prompt_ids, tenant)
        # The request keeps its store: a drop_tenant while it runs orphans it (its text is then
        # lost with it), and nothing re-creates the tenant before its next request.
        state.store = self.pool.get(tenant)
        state.local = SuffixAutomaton(self.recent, self.counted)
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

    def _cursors(self, state: SAMState) -> list[_Cursor]:
        """The request's match cursors, longest match first; the local automaton wins ties, then
        the pool, then (with `live`) the other requests in flight, in the order they started."""
        if state.store.version != state.pool_version:
            self._sync_pool_cursor(state)
        cursors = [state.local_cursor, state.pool_cursor]
        if self.config.live:
            cursors += self._live_cursors(state)
        return sorted(cursors, key=lambda c: -c.length)  # stable

    def _live_cursors(self, state: SAMState) -> list[_Cursor]:
        """Cursors into the local automata of the tenant's other requests in flight, each matched
        on this request's last `max_predicts` tokens when first needed, then advanced with its
        commits (`observe`); only those whose match has a continuation to copy."""
        others = {rid: other for rid, other in self.requests.items()
                  if other is not state and other.tenant == state.tenant}
        # Forget cursors into requests that ended (their text is in the pool now) or whose id
        # now names another request.
        gone = [rid for rid, c in state.live.items() if rid not in others or c.sam is not others[rid].local]
        for rid in gone:
            del state.live[rid]
        cursors = []
        for rid, other in others.items():
            cursor = state.live.get(rid)
            if cursor is None:
                cursor = state.live[rid] = _Cursor(other.local)
                for token in state.sequence[-self.config.max_predicts:]:
                    cursor.advance(token)
            cursor.refresh()
            if cursor.continues():
                cursors.append(cursor)
        return cursors

    def observe(self, request_id: str, verification: Verification) -> SAMState:
        state = super().observe(request_id, verification)
        for cursor in state.live.values():
            cursor.refresh()
        for token in verification.committed:
            _advance_local(state, token)
            state.pool_cursor.advance(token)
            for cursor in state.live.values():
                cursor.advance(token)
        return state

    def stop_request(self, request_id: str) -> SAMState | None:
        """End the request; its text joins its tenant's pool only now (unknown ids are ignored)."""
        state = super().stop_request(request_id)
        if state is not None:
            state.store.add_request(request_id, state.sequence)  # only now may others draft from it
        return state

    def _chain(self, cursor: _Cursor, want: int) -> tuple[list[int], list[float] | None]:
        """The chain `cursor`'s match drafts (at most `want` tokens) and, with `count_scores`,
        its nodes' path probabilities (else None)."""
        if not self.counted:
            return cursor.sam.continuation(cursor.state, want, self.recent), None
        cursor.refresh()  # an extension may have moved the matched strings to a clone
        if self.frequent:
            chain, probs = cursor.sam.frequent_continuation(cursor.state, want)
        else:
            chain = cursor.sam.continuation(cursor.state, want, self.recent)
            probs = cursor.sam.path_probs(cursor.state, chain)
            # A copied continuation is the stream's text, so every token has its count; if one
            # ever had none, its nodes keep the last known probability rather than vanish.
            probs += [probs[-1] if probs else 1.0] * (len(chain) - len(probs))
        return chain, probs if self.config.count_scores else None

    def longest_match(self, request_id: str, max_tokens: int) -> tuple[list[int], int, list[float] | None]:
        """The chain the longest match drafts (at most `max_tokens`, SAM's length rule), the
        match's length and the chain's path probabilities (None without `count_scores`); ([], length,
        None) when the match is shorter than `min_match`. For drafters that use SAM as a lexical
        source (GOOSE's `spine='pool'`)."""
        best = self._cursors(self.state(request_id))[0]
        if best.length < self.config.min_match or max_tokens < 1:
            return [], best.length, None
        want = min(chain_length(best.length, self.config.alpha, self.config.max_predicts), max_tokens)
        chain, probs = self._chain(best, want)
        return chain, best.length, probs

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        tree = DraftTree.root(state.anchor)
        cfg = self.config
        cursors = self._cursors(state)
        best = cursors[0]
        if best.length < cfg.min_match or budget < 2:
            return tree
        want = chain_length(best.length, cfg.alpha, cfg.max_predicts)
        chain, probs = self._chain(best, min(want, budget - 1))
        tree.add_chain(0, chain, self.name, probs)
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
