"""The identifiability-gap diagnosis (seed paper §3; ALGORITHMS.md §7, "Diagnosis"): pure parts.

A benchmark is replayed request by request with the model's greedy outputs; at every generated
position t (the next token is x_{t+1}) the *pool* is everything in the earlier requests (prompts
and outputs; the current request's own text is not in it). Per position:
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
    """Candidate next tokens of the oracle, and neighbours of the semantic key."""


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
    """One of the top-k hidden-state neighbours' tokens is the next token (None: not computed)."""
    static_hit: bool | None = None
    """The same with the static input embedding as the key."""
    neighbour_run: int | None = None
    """Of the true continuation, how many tokens the best hidden-state neighbour offers verbatim."""

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
    presence test use what is left (a shorter continuation cannot be 'present' as 2 tokens).
    """
    text = list(prompt)
    out = []
    for t, token in enumerate(output):
        ahead = list(output[t:])
        candidates, length = oracle_candidates(sam, text, config)
        out.append(Position(
            present=len(ahead) >= config.presence_tokens and occurs(sam, ahead[:config.presence_tokens]),
            present_control=len(ahead) >= config.control_tokens and occurs(sam, ahead[:config.control_tokens]),
            oracle_hit=int(token) in candidates, match_length=length, run=verbatim_run(sam, ahead)))
        text.append(int(token))
    return out


def neighbour_hits(queries: torch.Tensor, keys: torch.Tensor, key_tokens: torch.Tensor,
                   targets: Sequence[int], k: int = 8) -> list[bool]:
    """Semantic reach: does a top-k neighbour (cosine) of each query carry its target token?

    Args:
        queries: [n, d] states that predict each target.
        keys: [m, d] the pool's keys (the state that predicted each record's token).
        key_tokens: [m] each record's token.
        targets: n true next tokens.
        k: neighbours per query.
    """
    if keys.shape[0] == 0:
        return [False] * len(targets)
    q = torch.nn.functional.normalize(queries.float(), dim=-1)  # [n, d]
    kk = torch.nn.functional.normalize(keys.float(), dim=-1)  # [m, d]
    top = (q @ kk.T).topk(min(k, kk.shape[0]), dim=-1).indices  # [n, k]
    found = key_tokens[top]  # [n, k]
    return (found == torch.tensor(list(targets))[:, None]).any(dim=-1).tolist()


def neighbour_runs(queries: torch.Tensor, keys: torch.Tensor, key_tokens: torch.Tensor,
                   segment_ends: torch.Tensor, continuations: Sequence[Sequence[int]], k: int = 8) -> list[int]:
    """How much of the true continuation the best top-k neighbour matches, token for token.

    A neighbour r offers its token and what followed it in its request: key_tokens[r], r+1, ...
    (up to segment_ends[r]). For each query, the longest agreement of a neighbour's offer with
    the true continuation (0: no neighbour carries the next token).

    Args:
        queries: [n, d]; keys: [m, d]; key_tokens: [m] the records' tokens in pool order;
        segment_ends: [m] one past the last record of each record's request;
        continuations: n true continuations (the next token first).
    """
    if keys.shape[0] == 0:
        return [0] * len(continuations)
    q = torch.nn.functional.normalize(queries.float(), dim=-1)  # [n, d]
    kk = torch.nn.functional.normalize(keys.float(), dim=-1)  # [m, d]
    top = (q @ kk.T).topk(min(k, kk.shape[0]), dim=-1).indices.tolist()  # [n, k]
    tokens, ends = key_tokens.tolist(), segment_ends.tolist()
    out = []
    for neighbours, ahead in zip(top, continuations):
        best = 0
        for r in neighbours:
            m = 0
            while m < len(ahead) and r + m < ends[r] and tokens[r + m] == ahead[m]:
                m += 1
            best = max(best, m)
        out.append(best)
    return out
