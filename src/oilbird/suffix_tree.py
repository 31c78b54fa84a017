"""Depth-limited suffix tree with occurrence counts: the core of SuffixDecoding (ALGORITHMS.md §3).

Contract:
- The tree stores token sequences, each under a caller-chosen hashable `seq_id`. Every suffix of
  every stored sequence is inserted to depth at most `max_depth` (D), so the tree spells every
  substring of length <= D, and each position counts the stored suffixes that pass through or end
  at it (`count`). A position's estimated next-token probability is count(child) / count(node).
- `append(seq_id, token)` extends a sequence by one token in O(D): each sequence keeps the nodes
  where its last D suffixes end ("active" nodes) and steps each of them one token down.
- `remove(seq_id)` takes a whole sequence back out: counts are decremented along all its suffixes,
  emptied nodes are pruned, and the result is exactly the tree of the remaining sequences (FIFO
  eviction is a series of removals).
- `speculate(context, ...)` matches the context's suffixes from the root (m = 1, 2, ... tokens)
  and returns the best-scoring continuation as a path or a best-first tree (`Speculation`; the
  drafting below a matched position is `suffix_speculation.py`'s job).

Representation (path-compressed, canonical). A node is an edge of `length` tokens below its
parent; its tokens are read from a stored sequence: `seq[start : start + length]`, where
`(seq, start)` is an occurrence of the node's whole root-to-node string (so a node's parent's
tokens are the ones just before it in the same list). The tree is kept canonical: every stored
suffix ends exactly at a node boundary, and a non-root node exists only where a branch starts or
some suffix ends. Counts are therefore constant along an edge, and the shape depends only on the
multiset of stored suffixes, never on the order of appends and removals. Each node also records,
per sequence, where one of that sequence's suffixes ending at it ends (`ends`), so that removing
a sequence can re-point references into it at another occurrence.

Cost: at most two nodes per stored suffix, i.e. O(stored tokens) nodes, where an uncompressed trie
would need about tokens x D. A node is a __slots__ object plus two small dicts; measured on
phrase-like synthetic text, 10k stored tokens took about 12k nodes and 8 MB (~0.8 KB per token).
Appending costs O(D) per token; `speculate` O(D^2) in the worst case (each m re-matches from the
root), cut short when no longer match can win.
"""

from __future__ import annotations

import math
from typing import Hashable, Iterable, Sequence

from oilbird.suffix_speculation import Speculation, draft_path, draft_tree


class _Node:
    """One edge of the tree, identified by its bottom position (see the module docstring)."""

    __slots__ = ("count", "parent", "children", "length", "seq", "start", "ends")

    def __init__(self, parent: "_Node | None", seq: list[int], start: int, length: int,
                 count: int) -> None:
        self.count = count
        """Stored suffixes passing through or ending at this node (constant along the edge)."""
        self.parent = parent
        self.children: dict[int, _Node] = {}
        """First token of the child's edge -> child."""
        self.length = length
        """Tokens on the edge from the parent (0 only for the root)."""
        self.seq = seq
        """A stored token list holding an occurrence of this node's whole string."""
        self.start = start
        """Index in `seq` of the edge's first token."""
        self.ends: dict[Hashable, int] = {}
        """seq_id -> end index (exclusive) of one of that sequence's suffixes ending here."""


class SuffixTree:
    """A depth-limited, path-compressed suffix tree over several sequences.

    Args:
        max_depth: D, the most tokens of each suffix that are inserted.
    """

    def __init__(self, max_depth: int = 64) -> None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth = max_depth
        self.root = _Node(None, [], 0, 0, 0)
        self.num_nodes = 1
        """Nodes in the tree, the root included."""
        self._seqs: dict[Hashable, list[int]] = {}
        self._active: dict[Hashable, list[_Node]] = {}  # oldest (deepest) suffix first

    # --- sequences -------------------------------------------------------------------------

    def __contains__(self, seq_id: Hashable) -> bool:
        return seq_id in self._seqs

    def __len__(self) -> int:
        """Number of stored sequences."""
        return len(self._seqs)

    def sequence(self, seq_id: Hashable) -> list[int]:
        """The stored tokens of `seq_id` (do not modify)."""
        return self._seqs[seq_id]

    def extend(self, seq_id: Hashable, tokens: Iterable[int]) -> None:
        """Append `tokens` one by one to `seq_id` (created if new)."""
        for token in tokens:
            self.append(seq_id, token)

    def append(self, seq_id: Hashable, token: int) -> None:
        """Append one token to sequence `seq_id` (created if new); O(D).

        Args:
            seq_id: the sequence to grow.
            token: the token id to append.
        """
        seq = self._seqs.get(seq_id)
        if seq is None:
            seq = self._seqs[seq_id] = []
            self._active[seq_id] = []
        active = self._active[seq_id]
        root = self.root
        # A new suffix starts at the new token; the oldest one has reached depth D and stays put.
        active.append(root)
        root.count += 1
        if len(active) > self.max_depth:
            del active[0]
        seq.append(int(token))
        end = len(seq)
        # Oldest first: each suffix then moves to a depth no unprocessed suffix of this sequence
        # occupies, so the per-sequence `ends` entries never collide.
        for i, node in enumerate(active):
            active[i] = self._step(node, seq, seq_id, end)

    def _step(self, node: _Node, seq: list[int], seq_id: Hashable, end: int) -> _Node:
        """Extend the suffix of `seq_id` ending at `node` by `seq[end - 1]`; return its new end."""
        token = seq[end - 1]
        child = node.children.get(token)
        is_root = node is self.root
        if child is None:
            if node.count == 1 and not is_root:
                # Only this suffix reaches the node, so it is a leaf of its own: lengthen the edge.
                node.length += 1
                node.seq, node.start = seq, end - node.length
                node.ends[seq_id] = end
                return node
            new = _Node(node, seq, end - 1, 1, 1)
            new.ends[seq_id] = end
            node.children[token] = new
            self.num_nodes += 1
            if not is_root:
                del node.ends[seq_id]
            return new
        if not is_root and node.count == child.count + 1:
            # Nothing else ends here and everything else continues into `child`: once this suffix
            # continues too, the boundary at `node` is no longer needed (canonical form).
            if child.length == 1:  # fuse node into child
                parent = node.parent
                parent.children[node.seq[node.start]] = child
                child.parent = parent
                child.length += node.length
                child.count += 1
                child.seq, child.start = seq, end - child.length
                child.ends[seq_id] = end
                node.count = 0  # dead
                self.num_nodes -= 1
                return child
            # Shift the boundary one token down into the child's edge.
            del node.children[token]
            child.start += 1
            child.length -= 1
            node.children[child.seq[child.start]] = child
            node.length += 1
            node.seq, node.start = seq, end - node.length
            node.ends[seq_id] = end
            return node
        if not is_root:
            del node.ends[seq_id]
        if child.length == 1:
            child.count += 1
            child.seq, child.start = seq, end - 1  # keep references on recent sequences
            child.ends[seq_id] = end
            return child
        # The suffix must end at a boundary: split the child's edge after its first token.
        mid = _Node(node, seq, end - 1, 1, child.count + 1)
        mid.ends[seq_id] = end
        node.children[token] = mid
        child.start += 1
        child.length -= 1
        child.parent = mid
        mid.children[child.seq[child.start]] = child
        self.num_nodes += 1
        return mid

    def remove(self, seq_id: Hashable) -> None:
        """Remove sequence `seq_id` and all its suffixes; O(len x D).

        Raises:
            KeyError: if `seq_id` is not stored.
        """
        seq = self._seqs.pop(seq_id)
        del self._active[seq_id]
        root, depth = self.root, self.max_depth
        stale: list[_Node] = []  # surviving nodes whose tokens are read from `seq`
        for begin in range(len(seq)):
            stop = min(len(seq), begin + depth)
            root.count -= 1
            node = alive = root
            j = begin
            while j < stop:
                child = node.children[seq[j]]
                child.count -= 1
                if child.count == 0:
                    # Counts never grow downwards, so this suffix was all that remained below:
                    # detach the chain once and walk on only to zero its counts.
                    if node is alive:
                        del node.children[seq[j]]
                    self.num_nodes -= 1
                else:
                    alive = child
                    if child.seq is seq:
                        stale.append(child)
                j += child.length
                node = child
            if node is alive and node is not root:
                node.ends.pop(seq_id, None)
            self._merge_if_redundant(alive)
        for node in stale:
            if node.count > 0 and node.seq is seq:
                self._repoint(node)

    def _merge_if_redundant(self, node: _Node) -> None:
        """Fold `node` into its only child when no suffix ends at it (restores canonical form)."""
        if node is self.root or len(node.children) != 1:
            return
        (child,) = node.children.values()
        if child.count != node.count:
            return
        node.parent.children[node.seq[node.start]] = child
        child.parent = node.parent
        child.start -= node.length  # child's reference is an occurrence of the whole string
        child.length += node.length
        node.count = 0  # dead
        self.num_nodes -= 1

    def _repoint(self, node: _Node) -> None:
        """Read `node`'s tokens from another stored occurrence: one ending at or below it."""
        below, distance = node, 0
        while not below.ends:  # a node without ends has children (its count is positive)
            below = next(iter(below.children.values()))
            distance += below.length
        seq_id, end = next(iter(below.ends.items()))
        node.seq = self._seqs[seq_id]
        node.start = end - distance - node.length

    # --- speculation -----------------------------------------------------------------------

    def speculate(self, context: Sequence[int], max_spec_tokens: int, alpha: float = 1.0,
                  offset: float = 0.0, min_token_prob: float = 0.1,
                  use_tree: bool = True) -> Speculation:
        """The best continuation of `context` over all context-suffix matches (§3 "Speculate").

        For m = 1 .. len(ctx) - 1, with ctx the last D context tokens, the last m tokens are
        matched from the root (stopping at the first failure: longer suffixes cannot match
        either). Each match drafts at most min(max_spec_tokens, floor(alpha*m + offset)) tokens;
        the non-empty draft with the highest score wins, ties going to the longer match.

        Args:
            context: the committed tokens; the draft continues after its last token.
            max_spec_tokens: cap on drafted tokens.
            alpha: speculation tokens allowed per matched token.
            offset: speculation tokens allowed on top of alpha * m.
            min_token_prob: drafted tokens need an estimated probability at least this.
            use_tree: draft a best-first tree (True) or the single most frequent path (False).

        Returns:
            The winning `Speculation` (empty, score 0, match_len 0 when nothing can be drafted).
        """
        ctx = list(context[-self.max_depth:])
        best = Speculation()
        draft_fn = draft_tree if use_tree else draft_path
        for m in range(1, len(ctx)):
            # Each level of a draft adds at most 1 to its score, and at most D - m levels fit
            # below an m-token match; longer matches fit fewer, so none of them can win.
            if self.max_depth - m + 1e-9 < best.score:
                break
            found = self._match(ctx, len(ctx) - m)
            if found is None:
                break
            node, idx = found
            if node.count == 1 and idx == node.length and not node.children:
                # The only occurrence ends its sequence (typically the context itself): every
                # longer suffix occurs only there too, with nothing after it.
                break
            # The epsilon keeps e.g. 0.29 * 100 (28.999...) from flooring to 28.
            budget = min(max_spec_tokens, math.floor(alpha * m + offset + 1e-6))
            if budget < 1 or budget < best.score:  # every token adds at most 1 to the score
                continue
            draft = draft_fn(node, idx, budget, min_token_prob)
            if draft.token_ids and draft.score >= best.score:
                draft.match_len = m
                best = draft
        return best

    def _match(self, ctx: list[int], begin: int) -> tuple[_Node, int] | None:
        """Walk ctx[begin:] from the root; (node, tokens of its edge consumed) or None."""
        node, idx = self.root, 0
        for i in range(begin, len(ctx)):
            token = ctx[i]
            if idx == node.length:
                node = node.children.get(token)
                if node is None:
                    return None
                idx = 1
            elif node.seq[node.start + idx] == token:
                idx += 1
            else:
                return None
        return node, idx

    # --- inspection (tests, records) -------------------------------------------------------

    def path_counts(self) -> dict[tuple[int, ...], int]:
        """Uncompressed view: every non-empty string in the tree -> its count."""
        out: dict[tuple[int, ...], int] = {}
        stack = [(self.root, ())]
        while stack:
            node, prefix = stack.pop()
            for child in node.children.values():
                string = prefix
                for token in child.seq[child.start:child.start + child.length]:
                    string = string + (token,)
                    out[string] = child.count
                stack.append((child, string))
        return out

    def structure(self) -> tuple:
        """Compressed view: nested (edge tokens, count, children sorted by first token)."""
        def dump(node: _Node) -> tuple:
            kids = tuple(dump(node.children[t]) for t in sorted(node.children))
            return tuple(node.seq[node.start:node.start + node.length]), node.count, kids
        return dump(self.root)

    def check(self) -> None:
        """Verify the invariants of the module docstring; AssertionError names the first broken one."""
        live = {id(s) for s in self._seqs.values()}
        root = self.root
        assert root.count == sum(len(s) for s in self._seqs.values()), "root count != suffixes"
        depth_of: dict[int, int] = {}
        stack = [(root, ())]
        while stack:
            node, string = stack.pop()
            depth_of[id(node)] = len(string)
            below = sum(c.count for c in node.children.values())
            assert below <= node.count, f"children outweigh node at {string}"
            if node is not root:
                assert node.length >= 1 and node.count >= 1, f"empty node at {string}"
                assert len(string) <= self.max_depth, f"node deeper than D at {string}"
                assert id(node.seq) in live, f"node at {string} reads from a removed sequence"
                begin = node.start + node.length - len(string)
                assert begin >= 0 and node.seq[begin:node.start + node.length] == list(string), \
                    f"reference of {string} is not an occurrence"
                assert len(node.children) != 1 or below < node.count, f"redundant node at {string}"
                assert (below < node.count) == bool(node.ends), f"ends disagree with counts at {string}"
                for seq_id, end in node.ends.items():
                    seq = self._seqs[seq_id]
                    assert seq[end - len(string):end] == list(string), f"bad end of {seq_id} at {string}"
            for token, child in node.children.items():
                assert child.parent is node and child.seq[child.start] == token, f"bad link below {string}"
                stack.append((child, string + tuple(child.seq[child.start:child.start + child.length])))
        assert len(depth_of) == self.num_nodes, f"num_nodes {self.num_nodes} != {len(depth_of)} reachable"
        for seq_id, active in self._active.items():
            n = len(active)  # active[k] ends the suffix of the last n - k tokens
            for k, node in enumerate(active):
                assert depth_of.get(id(node)) == n - k, f"active node {k} of {seq_id} is stale"
                assert node is root or seq_id in node.ends, f"active node {k} of {seq_id} has no end"
