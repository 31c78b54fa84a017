"""The draft tree: the one structure every drafter produces and the verifier reads.

A tree is a parent array. Node 0 is the root, which holds the *anchor*: the last committed token,
whose KV is not cached yet. Every other node is a drafted token whose parent comes earlier in the
arrays, so insertion order is already a valid flattening (parents before children). A chain is a
tree in which every node's parent is the node before it.

Each node carries the set of sources that proposed it (for per-source attribution) and a score
(the proposer's confidence; drafters use it to rank, the verifier ignores it). Siblings are
de-duplicated: adding a token under a parent that already has it tags the existing node instead,
so the greedy walk's accepted path is unique and shared prefixes are paid for once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Sequence

import torch


@dataclass
class DraftTree:
    """A draft tree as a parent array (see the module docstring).

    Build one with `DraftTree.root(anchor)` and `add` / `add_chain`; do not edit the lists directly.
    """

    tokens: list[int]
    """Token id of each node; tokens[0] is the anchor."""
    parents: list[int]
    """Parent index of each node; -1 for the root."""
    sources: list[set[str]]
    """Names of the sources that proposed each node (the root's set is empty)."""
    scores: list[float]
    """Proposer's confidence per node (the maximum over sources that proposed it)."""
    depths: list[int] = field(default_factory=list)
    """Depth of each node; the root has depth 0."""
    draft_probs: dict[int, torch.Tensor] = field(default_factory=dict)
    """node -> [V] the distribution its token was *sampled* from, for drafters that sample (the
    draft model at temperature > 0); the sampling walk verifies such a node by min(1, p/q) and it
    must be its parent's only child. Empty for deterministic drafts (every other drafter)."""
    _children: list[dict[int, int]] = field(default_factory=list, repr=False)

    @classmethod
    def root(cls, anchor: int) -> "DraftTree":
        """A tree holding only the anchor: verifying it is one autoregressive step."""
        return cls(tokens=[int(anchor)], parents=[-1], sources=[set()], scores=[1.0],
                   depths=[0], _children=[{}])

    @classmethod
    def chain(cls, anchor: int, tokens: Iterable[int], source: str,
              scores: Sequence[float] | None = None) -> "DraftTree":
        """A root followed by `tokens` as one chain."""
        tree = cls.root(anchor)
        tree.add_chain(0, tokens, source, scores)
        return tree

    def __len__(self) -> int:
        return len(self.tokens)

    def child(self, parent: int, token: int) -> int | None:
        """Index of `parent`'s child holding `token`, or None."""
        return self._children[parent].get(int(token))

    def children(self, parent: int) -> list[int]:
        """Indices of `parent`'s children, in insertion order."""
        return list(self._children[parent].values())

    def add(self, parent: int, token: int, source: str, score: float = 1.0) -> int:
        """Add `token` under `parent`, or tag the existing sibling holding it.

        Args:
            parent: index of an existing node.
            token: token id to draft after the parent.
            source: name of the proposing source (e.g. "pld").
            score: the source's confidence in this node.

        Returns:
            The index of the (new or existing) node.

        Raises:
            IndexError: if `parent` is not a node of this tree.
        """
        if not 0 <= parent < len(self.tokens):
            raise IndexError(f"parent {parent} is not a node of a {len(self)}-node tree")
        token = int(token)
        existing = self._children[parent].get(token)
        if existing is not None:
            self.sources[existing].add(source)
            self.scores[existing] = max(self.scores[existing], float(score))
            return existing
        index = len(self.tokens)
        self.tokens.append(token)
        self.parents.append(parent)
        self.sources.append({source})
        self.scores.append(float(score))
        self.depths.append(self.depths[parent] + 1)
        self._children.append({})
        self._children[parent][token] = index
        return index

    def add_chain(self, parent: int, tokens: Iterable[int], source: str,
                  scores: Sequence[float] | None = None) -> int:
        """Add `tokens` as a chain below `parent`; returns the index of its last node."""
        node = parent
        for i, token in enumerate(tokens):
            node = self.add(node, token, source, 1.0 if scores is None else scores[i])
        return node

    def truncated(self, max_nodes: int) -> "DraftTree":
        """The first `max_nodes` nodes (root included) as a new tree.

        Because parents precede children, any prefix of the arrays is itself a valid tree.
        """
        if max_nodes >= len(self):
            return self
        keep = max(1, max_nodes)
        out = DraftTree(tokens=self.tokens[:keep], parents=self.parents[:keep],
                        sources=[set(s) for s in self.sources[:keep]], scores=self.scores[:keep],
                        depths=self.depths[:keep], _children=[{} for _ in range(keep)],
                        draft_probs={n: q for n, q in self.draft_probs.items() if n < keep})
        for n in range(1, keep):
            out._children[out.parents[n]][out.tokens[n]] = n
        return out

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root's first child down to `node` (empty for the root)."""
        path = []
        while node > 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def greedy_path(self, preds: Sequence[int]) -> list[int]:
        """Accepted node indices of greedy verification: from the root, follow the child whose
        token is the target's argmax (`preds[node]`). Siblings are unique per token, so the walk
        is unambiguous."""
        path, node = [], 0
        while (child := self.child(node, preds[node])) is not None:
            path.append(child)
            node = child
        return path

    def best_path(self, max_len: int) -> list[int]:
        """The tree's best root-to-leaf path, for engines that verify chains only (e.g. vLLM).

        From the root, step to the child with the highest score, the earliest-built on a tie
        (drafters build their most promising nodes first), until a leaf or `max_len` nodes.

        Returns:
            Node indices, root excluded, at most `max_len` of them.
        """
        path: list[int] = []
        node = 0
        while len(path) < max_len:
            children = self.children(node)
            if not children:
                break
            node = max(children, key=lambda c: (self.scores[c], -c))
            path.append(node)
        return path

    def subtree(self, nodes: Sequence[int]) -> "DraftTree":
        """The root and `nodes` as a tree of its own, node `nodes[i]` becoming node i + 1, each
        keeping its sources, score and draft distribution.

        Args:
            nodes: ascending node indices whose parents are the root or earlier entries (a
                root-to-node path such as `best_path` returns, or any ancestor-closed set).

        Raises:
            ValueError: a node's parent is not kept.
        """
        out = DraftTree.root(self.tokens[0])
        index = {0: 0}
        for node in nodes:
            parent = self.parents[node]
            if parent not in index:
                raise ValueError(f"node {node}'s parent {parent} is not in the subtree")
            new = len(out)
            index[node] = new
            out.tokens.append(self.tokens[node])
            out.parents.append(index[parent])
            out.sources.append(set(self.sources[node]))
            out.scores.append(self.scores[node])
            out.depths.append(out.depths[index[parent]] + 1)
            out._children.append({})
            out._children[index[parent]][self.tokens[node]] = new
            if node in self.draft_probs:
                out.draft_probs[new] = self.draft_probs[node]
        return out

    # --- what the verifier needs -----------------------------------------------------------

    def ancestor_matrix(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """Boolean [N, N] on `device`: entry (n, m) is True when m is n or an ancestor of n.

        Built from the parent array on the device by pointer doubling: after round r, row n
        holds its ancestors up to 2^r levels up, so ceil(log2(depth)) rounds of [N, N] gathers
        suffice (no per-node Python loop, no host-to-device copy of an [N, N] matrix).
        """
        n_nodes = len(self)
        nodes = torch.arange(n_nodes, device=device)  # [N]
        jump = torch.tensor(self.parents, device=device).clamp(min=0)  # [N]; the root points to itself
        visible = torch.zeros((n_nodes, n_nodes), dtype=torch.bool, device=device)  # [N, N]
        visible[nodes, nodes] = True
        visible[nodes, jump] = True
        reach = 1
        while reach < max(self.depths):
            visible |= visible[jump]  # ancestors of my 2^r-th ancestor: up to 2^(r+1) levels
            jump = jump[jump]
            reach *= 2
        return visible

    def attention_mask(self, prefix_len: int, dtype: torch.dtype,
                       device: torch.device | str = "cpu") -> torch.Tensor:
        """Additive 4-D mask for a tree forward over a cache of `prefix_len` tokens, built on `device`.

        Row n sees every cached column and the columns of n and its ancestors; everything else
        holds the dtype's minimum, so each root-to-node path is scored as if it were alone.

        Returns:
            Tensor [1, 1, N, prefix_len + N].
        """
        n_nodes = len(self)
        mask = torch.zeros((n_nodes, prefix_len + n_nodes), dtype=dtype, device=device)  # [N, P+N]
        mask[:, prefix_len:].masked_fill_(~self.ancestor_matrix(device), torch.finfo(dtype).min)
        return mask[None, None]  # [1, 1, N, P+N]

    def position_ids(self, prefix_len: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """Positions P + depth: siblings share a position. Returns [1, N]."""
        return (torch.tensor(self.depths, dtype=torch.long) + prefix_len)[None].to(device)
