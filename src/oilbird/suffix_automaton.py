"""Suffix automaton over a growing token stream (ALGORITHMS.md §4), the lexical key of the pool.

Contract:
- `extend(token)` appends one token in amortized O(1) (the classic online construction); the
  automaton then recognizes every substring of the stream.
- Each state remembers `first_end`, the end index of the *first* occurrence of its strings, so a
  match's continuation is read from the earliest occurrence (the one with the longest tail, as
  every prompt-lookup reference does). With `track_recent`, states also remember `last_end`, the
  end of the *most recent* occurrence (`continuation(..., recent=True)`): repetitive traffic
  (tool calls, templates) tends to repeat what it did last. Keeping it costs a walk up the suffix
  links at every `extend` (every suffix of the stream gains the new end), so it is opt-in.
- With `track_counts`, states also count their occurrences (`count`, the size of their end-position
  set), by the same walk up the suffix links. A match then knows how often each next token
  followed it: `frequent_continuation` follows the most frequent one (SuffixDecoding's choice)
  and `path_probs` scores any continuation by the product of count ratios along it.
- A cursor `(state, length)` tracks the longest suffix of some query text that occurs in the
  stream. `advance` moves it by one token; callers advance *before* extending with the same
  token, so the text never matches its own newest position.
- Document boundaries: `end_document()` appends a fresh negative separator id, so no match and no
  continuation crosses from one document (request) into another.
"""

from __future__ import annotations

from typing import Iterable, Sequence


class SuffixAutomaton:
    """Online suffix automaton with first-occurrence end positions."""

    def __init__(self, track_recent: bool = False, track_counts: bool = False) -> None:
        self.track_recent = track_recent
        self.track_counts = track_counts
        self.count: list[int] = [0]
        """Occurrences of each state's strings in the stream (kept only with `track_counts`;
        the root's stays 0)."""
        self.last_end: list[int] = [-1]
        """Index in `tokens` where the most recent occurrence of the state's strings ends
        (kept only with `track_recent`)."""
        self.prev_end: list[int] = [-1]
        """Where the occurrence before that ends (-1: none): the latest occurrence with a
        continuation when the latest one ends the stream (a request's own newest text)."""
        self.next: list[dict[int, int]] = [{}]
        """Transitions of each state: token -> state."""
        self.link: list[int] = [-1]
        """Suffix link of each state (the root's is -1)."""
        self.length: list[int] = [0]
        """Length of the longest string of each state."""
        self.first_end: list[int] = [-1]
        """Index in `tokens` where the first occurrence of the state's strings ends."""
        self.tokens: list[int] = []
        """The stream itself, separators included."""
        self.last = 0
        self._separators = 0

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def num_states(self) -> int:
        return len(self.length)

    def _new_state(self, length: int, first_end: int, link: int = -1,
                   transitions: dict[int, int] | None = None, last_end: int | None = None) -> int:
        self.next.append(transitions if transitions is not None else {})
        self.link.append(link)
        self.length.append(length)
        self.first_end.append(first_end)
        if self.track_recent:  # untracked automata keep only [-1] for the root
            self.last_end.append(first_end if last_end is None else last_end)
            self.prev_end.append(-1)
        if self.track_counts:
            self.count.append(0)
        return len(self.length) - 1

    def extend(self, token: int) -> None:
        """Append one token (amortized O(1))."""
        token = int(token)
        self.tokens.append(token)
        cur = self._new_state(self.length[self.last] + 1, len(self.tokens) - 1)
        p = self.last
        while p != -1 and token not in self.next[p]:
            self.next[p][token] = cur
            p = self.link[p]
        if p == -1:
            self.link[cur] = 0
        else:
            q = self.next[p][token]
            if self.length[p] + 1 == self.length[q]:
                self.link[cur] = q
            else:  # split q: the clone keeps the shorter strings, with q's first occurrence
                clone = self._new_state(self.length[p] + 1, self.first_end[q], self.link[q],
                                        dict(self.next[q]), self.last_end[q] if self.track_recent else None)
                while p != -1 and self.next[p].get(token) == q:
                    self.next[p][token] = clone
                    p = self.link[p]
                if self.track_counts:  # the clone's strings occur wherever q's do
                    self.count[clone] = self.count[q]
                self.link[q] = self.link[cur] = clone
        self.last = cur
        if self.track_recent:  # every suffix of the stream now also ends here
            end, p = len(self.tokens) - 1, self.link[cur]
            while p > 0:
                self.prev_end[p], self.last_end[p] = self.last_end[p], end
                p = self.link[p]
        if self.track_counts:  # ... and occurs once more
            p = cur
            while p > 0:
                self.count[p] += 1
                p = self.link[p]

    def extend_many(self, tokens: Iterable[int]) -> None:
        for token in tokens:
            self.extend(token)

    def end_document(self) -> None:
        """Append a unique separator so nothing matches or continues across documents."""
        self._separators += 1
        self.extend(-self._separators)

    def advance(self, state: int, length: int, token: int) -> tuple[int, int]:
        """Move a match cursor by one token: the longest suffix of (matched text + token).

        Returns:
            The new `(state, length)`; `(0, 0)` when not even `token` alone occurs.
        """
        token = int(token)
        while state != 0 and token not in self.next[state]:
            state = self.link[state]
            length = self.length[state]
        nxt = self.next[state].get(token)
        if nxt is None:
            return 0, 0
        return nxt, length + 1

    def match(self, query: Sequence[int]) -> tuple[int, int]:
        """Cursor after feeding `query` from the root: its longest suffix found in the stream."""
        state, length = 0, 0
        for token in query:
            state, length = self.advance(state, length, token)
        return state, length

    def continuation(self, state: int, max_tokens: int, recent: bool = False) -> list[int]:
        """Up to `max_tokens` stream tokens after the first (or, with `recent`, the most recent
        one that has a continuation) occurrence of `state`'s strings. Stops at a document separator.

        Raises:
            ValueError: `recent` on an automaton built without `track_recent`.
        """
        if recent and not self.track_recent:
            raise ValueError("continuation(recent=True) needs SuffixAutomaton(track_recent=True)")
        end = self.first_end[state]
        if recent:
            end = self.last_end[state]
            if end == len(self.tokens) - 1:  # it ends the stream: take the one before
                end = self.prev_end[state] if self.prev_end[state] >= 0 else end
        start = end + 1
        out = []
        for token in self.tokens[start:start + max_tokens]:
            if token < 0:
                break
            out.append(token)
        return out

    def _followers(self, state: int) -> int:
        """Occurrences of `state`'s strings followed by a token (a separator included)."""
        count = self.count
        return sum(count[t] for t in self.next[state].values())

    def frequent_continuation(self, state: int, max_tokens: int) -> tuple[list[int], list[float]]:
        """Up to `max_tokens` tokens after `state`'s strings, each the token that most often
        followed the text matched so far (ties: the earliest occurrence), with the estimated
        probability of each token's whole path: the product of count ratios along it. Stops at a
        document separator, or where nothing follows.

        Raises:
            ValueError: on an automaton built without `track_counts`.
        """
        if not self.track_counts:
            raise ValueError("frequent_continuation needs SuffixAutomaton(track_counts=True)")
        tokens: list[int] = []
        probs: list[float] = []
        prob, count, first_end = 1.0, self.count, self.first_end
        while len(tokens) < max_tokens and state > 0:
            options = self.next[state]
            best, best_state = -1, -1
            for token, nxt in options.items():
                if token >= 0 and (best_state < 0 or count[nxt] > count[best_state]
                                   or (count[nxt] == count[best_state] and first_end[nxt] < first_end[best_state])):
                    best, best_state = token, nxt
            if best_state < 0:
                break
            prob *= count[best_state] / self._followers(state)
            tokens.append(best)
            probs.append(prob)
            state = best_state
        return tokens, probs

    def path_probs(self, state: int, tokens: Sequence[int]) -> list[float]:
        """The estimated probability of each token's path after `state`'s strings (the product
        of count ratios along it, as `frequent_continuation` gives), for a continuation copied
        from any occurrence; the list stops early where `tokens` leaves the stream's text.

        Raises:
            ValueError: on an automaton built without `track_counts`.
        """
        if not self.track_counts:
            raise ValueError("path_probs needs SuffixAutomaton(track_counts=True)")
        probs: list[float] = []
        prob = 1.0
        for token in tokens:
            nxt = self.next[state].get(int(token)) if state > 0 else None
            if nxt is None:
                break
            prob *= self.count[nxt] / self._followers(state)
            probs.append(prob)
            state = nxt
        return probs

    def candidates(self, state: int, length: int, count: int,
                   min_length: int = 1) -> list[tuple[int, int, int]]:
        """Distinct next tokens after the matched suffix, backing off to shorter suffixes.

        From the matched state, every outgoing transition is a candidate. While there are fewer
        than `count`, follow the suffix link (a shorter suffix, more occurrences) and add the new
        tokens, stopping once the match would be shorter than `min_length`.

        Returns:
            Up to `count` tuples `(token, next_state, match_length)`, longest match first.
        """
        seen: dict[int, tuple[int, int, int]] = {}
        while state != -1 and length >= min_length and len(seen) < count:
            for token, nxt in self.next[state].items():
                if token >= 0 and token not in seen and len(seen) < count:
                    seen[token] = (token, nxt, length)
            state = self.link[state]
            length = self.length[state] if state != -1 else 0
        return list(seen.values())
