"""The identifiability-gap measures (seed paper §3; ALGORITHMS.md §7, "Diagnosis"): pure functions.

`gap_replay.py` feeds them a real model's replay; `gap_report.py` pools what they return.

A benchmark is replayed request by request with the model's greedy outputs; at every generated
position t (the next token is x_{t+1}) the *pool* is everything in the earlier requests (prompts
and outputs). The current request's own text is not in it unless `within_request` is set; then
the pool also holds what that request has committed so far (its prompt and x_1..x_t), never
anything later. Per position:
- presence: the next 2 tokens (x_{t+1}, x_{t+2}) occur verbatim somewhere in the pool (4 as the
  control);
- the exact-match oracle: take the longest suffix of the context, up to 16 tokens, that occurs in
  the pool; gather the distinct tokens that followed its occurrences, backing off to shorter
  suffixes (down to 2 tokens) until there are 8; a hit if one of them is x_{t+1};
- the gap: present and an oracle miss: the continuation is in the pool, but no exact key reaches it;
- the verbatim run behind a position: how many of x_{t+1}, x_{t+2}, ... occur verbatim in a row;
- semantic reach: the tokens of the top-8 records by cosine similarity of the hidden state that
  predicts x_{t+1}, against the pool's records (each keyed by the state that predicted its token);
  a hit if one of them is x_{t+1}.

The suffix automaton of `oilbird.suffix_automaton` answers every lexical question: a string
occurs in the pool iff it can be walked from the root; the longest occurring suffix of the context
is where a match cursor stops; the oracle's candidates are its transitions, then its suffix
links' (shorter suffixes).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from oilbird.suffix_automaton import SuffixAutomaton


@dataclass
class DiagnosisConfig:
    """The diagnosis's parameters (the paper's values)."""

    presence_tokens: int = 2
    """Presence test: the next N tokens occur verbatim in the pool."""
    control_tokens: int = 4
    """The stricter presence test reported beside it."""
    max_suffix: int = 16
    """The oracle's longest context suffix."""
    min_key: int = 2
    """The oracle backs off down to a suffix of this many tokens."""
    candidates: int = 8
    """Candidate next tokens of the oracle, and neighbors of the semantic key."""
    within_request: bool = False
    """Also count the current request's own committed text (its prompt and the output so far) as pool. Off is the paper's definition (earlier requests only); on is what prompt lookup sees on top of it."""


def occurs(sam: SuffixAutomaton, tokens: Sequence[int]) -> bool:
    """True when `tokens` occur contiguously in the automaton's stream (within one document)."""
    state = 0
    for token in tokens:
        state = sam.next[state].get(int(token))
        if state is None:
            return False
    return True


def verbatim_run(sam: SuffixAutomaton, tokens: Sequence[int]) -> int:
    """How many leading tokens of `tokens` occur verbatim, in a row, in the stream."""
    state = 0
    for i, token in enumerate(tokens):
        state = sam.next[state].get(int(token))
        if state is None:
            return i
    return len(tokens)


def oracle_candidates(sam: SuffixAutomaton, context: Sequence[int],
                      config: DiagnosisConfig = DiagnosisConfig()) -> tuple[list[int], int]:
    """The exact-match oracle's candidate next tokens, and the length of its longest match.

    Returns:
        (up to `config.candidates` distinct tokens, longest matched suffix length); no candidates
        when not even a `config.min_key`-token suffix occurs.
    """
    state, length = sam.match(list(context)[-config.max_suffix:])
    if length < config.min_key:
        return [], length
    found = sam.candidates(state, length, config.candidates, min_length=config.min_key)
    return [token for token, _, _ in found], length


def union_candidates(sams: Sequence[SuffixAutomaton], context: Sequence[int],
                     config: DiagnosisConfig = DiagnosisConfig()) -> tuple[list[int], int]:
    """The oracle over several streams at once: candidates longest match first, across streams.

    A stream may end with `context` itself (the current request's own text): its final
    occurrence has no next token, so only earlier recurrences give candidates there.

    Returns:
        (up to `config.candidates` distinct tokens, longest suffix that has a candidate).
    """
    found = []
    for sam in sams:
        state, length = sam.match(list(context)[-config.max_suffix:])
        if length >= config.min_key:
            found += [(token, n) for token, _, n in sam.candidates(state, length, config.candidates,
                                                                   min_length=config.min_key)]
    found.sort(key=lambda c: -c[1])  # stable: each stream's own order within a length
    tokens = list(dict.fromkeys(token for token, _ in found))[:config.candidates]
    return tokens, (found[0][1] if found else 0)


@dataclass
class Position:
    """The diagnosis of one generated position."""

    present: bool
    """The next `presence_tokens` tokens occur verbatim in the pool."""
    present_control: bool
    """The next `control_tokens` tokens do."""
    oracle_hit: bool
    """One of the oracle's candidates is the next token."""
    match_length: int
    """The oracle's longest matching context suffix."""
    run: int
    """Tokens from the next one on that occur verbatim, in a row, in the pool."""
    semantic_hit: bool | None = None
    """One of the top-k hidden-state neighbors' tokens is the next token (None: not computed)."""
    static_hit: bool | None = None
    """The same with the static input embedding as the key."""
    neighbor_run: int | None = None
    """Of the true continuation, how many tokens the best hidden-state neighbor offers verbatim."""

    @property
    def gap(self) -> bool:
        """Present in the pool but missed by every exact key."""
        return self.present and not self.oracle_hit

    @property
    def gap_control(self) -> bool:
        return self.present_control and not self.oracle_hit


def lexical_positions(sam: SuffixAutomaton, prompt: Sequence[int], output: Sequence[int],
                      config: DiagnosisConfig = DiagnosisConfig()) -> list[Position]:
    """Presence, oracle and run for each generated position of one request against the pool.

    Position t predicts output[t] from prompt + output[:t]. Positions too close to the end for the
    presence test use what is left (a shorter continuation cannot be 'present' as 2 tokens). With
    `config.within_request` the request's committed text so far is a second stream of the pool.
    """
    text = list(prompt)
    own = SuffixAutomaton() if config.within_request else None  # committed text, grown per position
    if own is not None:
        own.extend_many(text)
    sams = [sam] if own is None else [sam, own]
    out = []
    for t, token in enumerate(output):
        ahead = list(output[t:])

        def present(n: int) -> bool:
            return len(ahead) >= n and any(occurs(s, ahead[:n]) for s in sams)

        if own is not None:
            candidates, length = union_candidates(sams, text, config)
        else:
            candidates, length = oracle_candidates(sam, text, config)
        out.append(Position(
            present=present(config.presence_tokens), present_control=present(config.control_tokens),
            oracle_hit=int(token) in candidates, match_length=length,
            run=max(verbatim_run(s, ahead) for s in sams)))
        text.append(int(token))
        if own is not None:
            own.extend(int(token))
    return out


def _top_neighbors(queries: torch.Tensor, keys: torch.Tensor, k: int,
                    visible: Sequence[int] | None) -> list[list[int]]:
    """Top-k records by cosine similarity per query, among the first visible[i] records only."""
    q = torch.nn.functional.normalize(queries.float(), dim=-1)  # [n, d]
    kk = torch.nn.functional.normalize(keys.float(), dim=-1)  # [m, d]
    scores = q @ kk.T  # [n, m]
    if visible is not None:
        hidden = torch.arange(kk.shape[0])[None, :] >= torch.tensor(list(visible))[:, None]  # [n, m]
        scores = scores.masked_fill(hidden, float("-inf"))
    top = scores.topk(min(k, kk.shape[0]), dim=-1)
    return [[r for r, v in zip(rows, vals) if v != float("-inf")]
            for rows, vals in zip(top.indices.tolist(), top.values.tolist())]


def neighbor_hits(queries: torch.Tensor, keys: torch.Tensor, key_tokens: torch.Tensor,
                   targets: Sequence[int], k: int = 8, visible: Sequence[int] | None = None) -> list[bool]:
    """Semantic reach: does a top-k neighbor (cosine) of each query carry its target token?

    Args:
        queries: [n, d] states that predict each target.
        keys: [m, d] the pool's keys (the state that predicted each record's token).
        key_tokens: [m] each record's token.
        targets: n true next tokens.
        k: neighbors per query.
        visible: per query, how many leading records it may see (None: all). Records of the
            current request sit at the end of the pool; this keeps each query to what was
            committed before it.
    """
    if keys.shape[0] == 0:
        return [False] * len(targets)
    tokens = key_tokens.tolist()
    return [any(tokens[r] == int(target) for r in rows)
            for rows, target in zip(_top_neighbors(queries, keys, k, visible), targets)]


def neighbor_runs(queries: torch.Tensor, keys: torch.Tensor, key_tokens: torch.Tensor,
                   segment_ends: torch.Tensor, continuations: Sequence[Sequence[int]], k: int = 8,
                   visible: Sequence[int] | None = None) -> list[int]:
    """How much of the true continuation the best top-k neighbor matches, token for token.

    A neighbor r offers its token and what followed it in its request: key_tokens[r], r+1, ...
    (up to segment_ends[r]). For each query, the longest agreement of a neighbor's offer with
    the true continuation (0: no neighbor carries the next token).

    Args:
        queries: [n, d]; keys: [m, d]; key_tokens: [m] the records' tokens in pool order;
        segment_ends: [m] one past the last record of each record's request;
        continuations: n true continuations (the next token first);
        visible: per query, how many leading records it may see and read (None: all).
    """
    if keys.shape[0] == 0:
        return [0] * len(continuations)
    top = _top_neighbors(queries, keys, k, visible)  # [n][<= k]
    tokens, ends = key_tokens.tolist(), segment_ends.tolist()
    limits = list(visible) if visible is not None else [len(tokens)] * len(continuations)
    out = []
    for neighbors, ahead, limit in zip(top, continuations, limits):
        best = 0
        for r in neighbors:
            m = 0
            end = min(ends[r], limit)
            while m < len(ahead) and r + m < end and tokens[r + m] == ahead[m]:
                m += 1
            best = max(best, m)
        out.append(best)
    return out
