"""Tree verification (ALGORITHMS.md §1): one forward of a draft tree, greedy walk, KV compaction.

Contract:
- `prefill(prompt_ids)` caches the KV of every prompt token but the last; the last prompt token
  becomes the anchor. The prefill therefore commits nothing, and every later forward is a
  verification forward rooted at the anchor (so PLD can draft from the prompt on the first step).
  Prefills (and trees of `ForwardConfig.wide_rows` nodes or more) run the model's prefill kernel.
- `verify(state, tree)` runs one forward over the tree's N nodes against the cache with a 4-D
  additive mask and `position_ids = P + depth`, walks greedily from the root (a child is accepted
  when its token equals the argmax at its parent), appends the bonus token (the argmax at the last
  accepted node), cuts at a stop token, and compacts the cache to the accepted path.
- After every forward the result exposes, for all N nodes (rejected ones included), the argmax,
  the top-k ids and, when the caller asks for one (`hidden_layer`, the drafter's
  `Drafter.hidden_layer`), that layer's hidden state, for drafters that harvest them.
- The cache is a `TreeCache` (oilbird/kv_cache.py): rows written in place, compacted by row moves.
  Give the verifier `oilbird.kernels.tree_model(model)` for the fast kernels (oneDNN GEMM, tree
  attention without cache copies); `LoadedModel.tree_model()` builds it once per model.
- With a `FlyConfig` (opt-in, lossy) the walk is FLy's loose rule (`oilbird.fly`) instead: a
  mismatching draft token may be committed where the target was unsure and the draft agrees again
  right after; such nodes are listed in `Verification.forgiven`.
- With a `Sampler` at temperature > 0 the walk is rejection sampling over the tree
  (oilbird/sampling.py, docs/SAMPLING.md): the committed tokens are distributed exactly as
  token-by-token sampling of the target.

Greedy (strict) verification is lossless by construction: every committed token is the model's argmax
given the committed prefix. The batched tree forward can still flip an argmax where the top two
logits nearly tie, which is why the harness audits outputs against an independent greedy run.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace

import torch

from oilbird.errors import ModelError
from oilbird.fly import FlyConfig, entropy, fly_walk
from oilbird.gguf_weights import prefill_switch
from oilbird.kernels import harvest_head
from oilbird.kv_cache import TreeCache, compact_cache, new_cache
from oilbird.int8_head import build_head, choose_head
from oilbird.lm_head import top_k_and_argmax
from oilbird.sampling import Sampler, calibration_terms, sample_walk, warped_probs
from oilbird.skinny_gemm import topk as fast_topk
from oilbird.tree import DraftTree
from oilbird.tree_attention import SKINNY_ATTENTION, check_tree_attention


@dataclass
class VerifierConfig:
    """What each verification forward computes for drafters."""

    top_k: int = 10
    """Top-k token ids exposed per node (the widest consumer, GOOSE's adjacency table, uses 10; Token Recycling reads the first 8)."""
    head: str = "auto"
    """LM head of greedy verification: 'int8' (the GGUF's Q8_0 head on int8 dot products, the inputs rounded to bytes; each row's float32 top-k and argmax recovered exactly from an error bound, oilbird/int8_head.py), 'certified' (a bfloat16 copy, half the bytes; each row's float32 top-k and argmax recovered exactly from an error bound, oilbird/lm_head.py), 'model' (the model's own), 'auto' (the model's own where it reads the GGUF's blocks, `BlockLinear`: float32 logits from 1.5 bytes a weight; whole forwards 4-8% faster than on the certified head at 1, 8 and 64 nodes, 1-2% slower at 16, docs/RESULTS.md, issue 15, stop 47; else certified where it applies: float32 on a CPU with our kernels, a supported model type; 'int8' before both where it applies: a Q8_0 head on a CPU with AVX512-VNNI). Sampling and FLy always use the model's."""
    head_tiles: int = 2
    """With the 'int8' head: forwards of at least this many rows sum its int8 products on AMX tiles (CPUs with AMX-INT8: Intel Xeon since Sapphire Rapids; csrc/int8_head.cpp) instead of VNNI dot products; the logits have the same bits either way, so it changes speed only. 0: never. On one Xeon thread the tiles took, for the logits alone, 1.04-1.05x the VNNI time at 1-4 rows, 0.93x at 6-8, 0.56-0.73x at 12-16 (SmolLM2, +0.05 ms at 2 rows) and 0.93x at 2, 0.73-0.78x at 3-8, 0.63x at 16 (Qwen2.5-Coder-0.5B, -0.9 ms at 2); whole forwards 0.94-0.96x at 2-16 nodes on Qwen, 0.89-0.98x at 2-16 on SmolLM2; end to end Oilbird 1.02x [1.00-1.03] its tokens/s with 0 on one thread (100 API-Bank requests) and 1.04x [1.00-1.09] on two (40), no output changed (scripts/int8_head.py --tiles, scripts/forward_ab.py --b head_tiles=2; docs/RESULTS.md, issue 15, stop 63)."""
    harvest_dtype: str = "auto"
    """Dtype of the LM-head pass that harvests the prompt's top-k for drafters (GOOSE, Oilbird): draft material only, never what is verified. 'auto': bfloat16 on a CPU with bfloat16 GEMM (AVX-512 BF16 or AMX; about 3x faster than float32 there), else the model's; 'model': the model's own dtype."""

    def __post_init__(self) -> None:
        if self.top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {self.top_k}")
        if self.head not in ("auto", "int8", "certified", "model"):
            raise ValueError(f"head must be 'auto', 'int8', 'certified' or 'model', got {self.head!r}")
        if self.head_tiles < 0:
            raise ValueError(f"head_tiles must be >= 0 (0: never), got {self.head_tiles}")
        if self.harvest_dtype not in ("auto", "model", "bfloat16", "float32"):
            raise ValueError(f"harvest_dtype must be 'auto', 'model', 'bfloat16' or 'float32', got {self.harvest_dtype!r}")


@dataclass
class KVState:
    """Per-request decoding state: the cache and what it holds."""

    cache: TreeCache
    """transformers cache holding the KV of `length` committed tokens."""
    length: int
    """P: the number of tokens whose KV is cached (every committed token but the anchor)."""
    anchor: int
    """The last committed token; the root of the next tree."""


@dataclass
class PrefillObservation:
    """What the prefill forward computed, for drafters that harvest the prompt (GOOSE, Oilbird)."""

    tokens: list[int]
    """The prefilled tokens: the prompt without its last token (the anchor)."""
    topk_ids: torch.Tensor
    """[P, k] target top-k ids at every prefilled position (the prediction of the next token)."""
    topk_logits: torch.Tensor
    """[P, k] the logits of those ids."""
    hidden: torch.Tensor | None = None
    """[P, hidden] the asked-for layer's state at every prefilled position, or None when none was asked for."""
    reused: int = 0
    """Leading positions copied from an earlier request's prefill of the same tokens (a prefix
    cache): that request's harvest already saw them, so a pool may skip them."""

    def head(self, n: int) -> "PrefillObservation":
        """The first `n` positions."""
        return PrefillObservation(self.tokens[:n], self.topk_ids[:n], self.topk_logits[:n],
                                  None if self.hidden is None else self.hidden[:n], min(self.reused, n))

    def then(self, rest: "PrefillObservation") -> "PrefillObservation":
        """These positions followed by `rest`'s."""
        hidden = None if self.hidden is None else torch.cat([self.hidden, rest.hidden])
        return PrefillObservation(self.tokens + rest.tokens, torch.cat([self.topk_ids, rest.topk_ids]),
                                  torch.cat([self.topk_logits, rest.topk_logits]), hidden, self.reused)


@dataclass
class CachedPrefix:
    """The KV of a prompt's first `length` tokens, from an earlier request (oilbird/prefix_cache.py)."""

    cache: TreeCache
    """A cache holding at least `length` rows; the verifier crops it to `length` and prefills into it."""
    length: int
    """How many leading prompt tokens the cache holds (0 < length < len(prompt))."""
    observation: PrefillObservation | None = None
    """The earlier prefill's observation (at least `length` positions), for drafters that harvest it."""


@dataclass
class Verification:
    """The outcome of one tree forward; handed to drafters as their observation."""

    tree: DraftTree
    """The tree that was verified."""
    prefix_len: int
    """P at the time of the forward (the root sat at position P)."""
    argmax: torch.Tensor
    """[N] target argmax at every node."""
    topk_ids: torch.Tensor
    """[N, k] target top-k ids at every node, best first."""
    topk_logits: torch.Tensor
    """[N, k] the logits of those ids (softmax over them gives within-top-k scores)."""
    path: list[int]
    """Accepted node indices in root-to-leaf order, root excluded (cut at a stop token)."""
    committed: list[int]
    """Tokens committed by this forward: the accepted drafts plus the bonus (unless cut)."""
    finished: bool
    """True when a stop token was committed."""
    hidden: torch.Tensor | None = None
    """[N, hidden] the asked-for layer's state at every node (see `hidden_layer`), or None when none was asked for."""
    forward_s: float = 0.0
    """Seconds spent in the model forward (including argmax/top-k)."""
    bookkeeping_s: float = 0.0
    """Seconds spent on mask, walk and cache compaction."""
    forgiven: list[int] = field(default_factory=list)
    """Accepted nodes whose token is not the target's argmax at their parent (FLy only; empty under strict verification)."""
    sample_terms: list[tuple[float, float]] = field(default_factory=list)
    """Sampling only: per committed token, `calibration_terms` of its draw (the distribution check)."""


class TreeVerifier:
    """Verifies draft trees with one forward each over a transformers model.

    Args:
        model: a transformers causal LM whose attention honors a custom 4-D mask (SDPA, eager,
            or `TREE_ATTENTION`); pass `LoadedModel.tree_model()` for the fast kernels.
        stop_ids: token ids that end a request.
        config: what to expose per forward.
        fly: FLy's loose acceptance rule (lossy); None: strict greedy verification.
    """

    def __init__(self, model, stop_ids: frozenset[int] | set[int],
                 config: VerifierConfig | None = None, fly: FlyConfig | None = None) -> None:
        check_tree_attention(model.config)
        self.model = model
        self.fly = fly
        self.stop_ids = frozenset(int(t) for t in stop_ids)
        self.config = config or VerifierConfig()
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        # A bfloat16 model on our float32 attention kernel keeps its cache in float32: each row
        # is widened once, when written, not the whole cache at every forward (exact either way).
        skinny = getattr(model.config, "_attn_implementation", None) == SKINNY_ATTENTION
        self.cache_dtype = torch.float32 if skinny and self.dtype == torch.bfloat16 else None
        self._harvest = None  # the prefill harvest's LM head, built on first use
        self._head = None  # greedy verification's Int8Head or CertifiedHead, built on first use
        switch = prefill_switch(model)  # prefills on another block kernel (ForwardConfig.prefill_kernel), or None
        self._prefilling, self.prefills_apart = (switch.prefilling, True) if switch else (nullcontext, False)
        # FLy's rule reads whole distributions: its forwards keep the model's head.
        self.head_kind = "model" if fly is not None else choose_head(model, self.config.head)
        """Which LM head greedy forwards run: 'int8', 'certified' or 'model'."""

    def _hidden(self, out, layer: int | None) -> torch.Tensor | None:
        """The asked-for layer's states from a forward's output, [T, hidden], or None."""
        if layer is None:
            return None
        try:
            return out.hidden_states[layer][0]
        except IndexError:
            raise ModelError(f"hidden layer {layer} is out of range: the model exposes {len(out.hidden_states)} "
                             "hidden states (0 = input embeddings, -1 = after the final norm)") from None

    @torch.inference_mode()
    def prefill(self, prompt_ids: list[int], past: CachedPrefix | None = None) -> KVState:
        """Cache the KV of `prompt_ids[:-1]`; the last prompt token becomes the anchor.

        Args:
            prompt_ids: the prompt.
            past: the KV of a prefix of the prompt, from an earlier request (oilbird/prefix_cache.py);
                only the rest of the prompt is run.

        Raises:
            ValueError: if `prompt_ids` is empty.
        """
        if not prompt_ids:
            raise ValueError("cannot prefill an empty prompt")
        cache, done = self._start(prompt_ids, past)
        if done < len(prompt_ids) - 1:
            ids = torch.tensor([prompt_ids[done:-1]], device=self.device)  # [1, P - done]
            # The decoder alone: the prefill commits nothing, so it needs no logits at all.
            with self._prefilling():
                self.model.get_decoder()(input_ids=ids, past_key_values=cache, use_cache=True)
        return KVState(cache=cache, length=len(prompt_ids) - 1, anchor=int(prompt_ids[-1]))

    def _start(self, prompt_ids: list[int], past: CachedPrefix | None):
        """The cache to prefill into and how many prompt tokens it already holds."""
        if past is None:
            return new_cache(self.model.config, self.cache_dtype), 0
        if not 0 < past.length < len(prompt_ids) or past.cache.get_seq_length() < past.length:
            raise ValueError(f"a cached prefix of {past.length} tokens does not fit a prompt of "
                             f"{len(prompt_ids)} (the anchor is never cached)")
        past.cache.crop(past.length - past.cache.get_seq_length())
        return past.cache, past.length

    @torch.inference_mode()
    def prefill_observed(self, prompt_ids: list[int], chunk: int = 256, topk: bool = True,
                         hidden_layer: int | None = -1,
                         past: CachedPrefix | None = None) -> tuple[KVState, PrefillObservation]:
        """`prefill`, also returning the top-k and a hidden layer at every prefilled position.

        The LM head is applied in chunks of `chunk` positions, so memory stays at
        [chunk, V] logits instead of [P, V]. Costs roughly one extra LM-head pass over the prompt;
        `topk=False` skips it (the top-k tensors are then empty [P, 0]). `hidden_layer` indexes
        transformers' `hidden_states` (0: input embeddings, -1: after the final norm); None: none.
        With `past`, its `observation` (which must cover its `length` positions, computed with
        the same `topk` and `hidden_layer`) gives the reused positions' rows.
        """
        if not prompt_ids:
            raise ValueError("cannot prefill an empty prompt")
        if past is not None and (past.observation is None or len(past.observation.tokens) < past.length):
            raise ValueError("a cached prefix reused by an observed prefill needs its observation")
        cache, done = self._start(prompt_ids, past)
        anchor, prefix = int(prompt_ids[-1]), prompt_ids[:-1]
        k = self.config.top_k if topk else 0
        if done == len(prefix):
            observation = (replace(past.observation.head(done), reused=done) if past is not None
                           else PrefillObservation([], torch.zeros((0, k), dtype=torch.long), torch.zeros((0, k))))
            return KVState(cache=cache, length=done, anchor=anchor), observation
        ids = torch.tensor([prefix[done:]], device=self.device)  # [1, P - done]
        with self._prefilling():
            out = self.model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1,
                             output_hidden_states=True)
        final = out.hidden_states[-1][0]  # [P - done, hidden], after the final norm
        head = self._harvest_head()
        n = final.shape[0]
        if topk:  # the head's own dtype (bfloat16 for the harvest on most CPUs), no float32 copy
            parts = [fast_topk(head(final[s:s + chunk]), k) for s in range(0, n, chunk)]  # [chunk, k]
            topk_ids = torch.cat([ids for _, ids in parts])  # [P - done, k]
            topk_logits = torch.cat([values for values, _ in parts])  # float32
        else:
            topk_ids = torch.zeros((n, 0), dtype=torch.long, device=final.device)  # [P - done, 0]
            topk_logits = torch.zeros((n, 0), device=final.device)
        observation = PrefillObservation(list(prefix[done:]), topk_ids, topk_logits, self._hidden(out, hidden_layer))
        if past is not None:
            observation = replace(past.observation.head(done).then(observation), reused=done)
        return KVState(cache=cache, length=len(prefix), anchor=anchor), observation

    def _harvest_head(self):
        """The LM head of the prefill harvest (oilbird.kernels.harvest_head), built once."""
        if self._harvest is None:
            self._harvest = harvest_head(self.model.get_output_embeddings(), self.config.harvest_dtype,
                                         self.device, self.dtype)
        return self._harvest

    @torch.inference_mode()
    def verify(self, state: KVState, tree: DraftTree, hidden_layer: int | None = None,
               sampler: Sampler | None = None) -> Verification:
        """Run one forward over `tree`, commit the greedy (or sampled) path and compact the cache.

        This is the one forward decoding runs: an autoregressive step is a one-node tree, and
        the cost curve (oilbird/cost_curve.py) times this very call.

        Args:
            state: the request's KV state; updated in place (cache, length, anchor).
            tree: a draft tree whose root token is `state.anchor`.
            hidden_layer: which hidden state to return per node (an index into transformers'
                `hidden_states`: 0 input embeddings, -1 after the final norm); None: none.
            sampler: the request's sampling settings and generator; None (or temperature 0):
                greedy. Sampling walks the tree by rejection sampling (oilbird/sampling.py).

        Returns:
            The verification: per-node argmax/top-k (and hidden state), accepted path and committed tokens.

        Raises:
            ValueError: if the tree's root is not the anchor, or if FLy's rule meets sampling.
        """
        sampling = sampler is not None and not sampler.config.greedy
        if sampling and self.fly is not None:
            raise ValueError("FLy's loose rule is greedy only; verify sampled requests strictly")
        if tree.tokens[0] != state.anchor:
            raise ValueError(f"tree root {tree.tokens[0]} is not the anchor {state.anchor}")
        t0 = time.perf_counter()
        prefix = state.length
        n_nodes = len(tree)
        ids = torch.tensor([tree.tokens], device=self.device)  # [1, N]
        # A single node needs no mask: it sees the whole cache, exactly like an AR step.
        mask = None if n_nodes == 1 else tree.attention_mask(prefix, self.dtype, self.device)
        positions = tree.position_ids(prefix, self.device)  # [1, N]
        t1 = time.perf_counter()
        greedy = not sampling and self.fly is None
        out, logits, topk_ids, topk_logits, argmax = self._forward(
            dict(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=state.cache,
                 use_cache=True, output_hidden_states=hidden_layer is not None), greedy)
        hidden = self._hidden(out, hidden_layer)  # [N, hidden] or None
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        t2 = time.perf_counter()
        preds = argmax.tolist()
        path, forgiven, bonus, dist = self._walk(tree, logits, preds, sampler if sampling else None)
        committed = [tree.tokens[c] for c in path]
        finished = False
        for i, token in enumerate(committed):
            if token in self.stop_ids:  # cut right after the stop token and drop the bonus
                path, committed, finished = path[: i + 1], committed[: i + 1], True
                forgiven = [c for c in forgiven if c in path]
                break
        if not finished:
            bonus = preds[path[-1] if path else 0] if bonus is None else bonus
            committed.append(bonus)
            finished = bonus in self.stop_ids
        terms = []
        if dist is not None:  # the position after node u is drawn from dist(u): the walk computed it
            parents = [0] + path
            terms = [calibration_terms(dist(parents[i]), token) for i, token in enumerate(committed)]
        compact_cache(state.cache, prefix, n_nodes, path)
        state.length = prefix + 1 + len(path)
        state.anchor = committed[-1]
        t3 = time.perf_counter()
        return Verification(tree=tree, prefix_len=prefix, argmax=argmax, topk_ids=topk_ids,
                            topk_logits=topk_logits, hidden=hidden, path=path,
                            committed=committed, finished=finished, forgiven=forgiven,
                            sample_terms=terms, forward_s=t2 - t1, bookkeeping_s=(t1 - t0) + (t3 - t2))

    def _forward(self, inputs: dict, greedy: bool):
        """The forward of `verify`: (model output, [N, V] logits, [N, k] top-k ids and logits, [N] argmax).

        Greedy forwards on the int8 or certified head run the decoder, take approximate logits
        from the head (only FLy and sampling read logits, and they run the model's head) and the
        top-k and argmax certified in float32; the rest run the model's own head.
        """
        if not greedy or self.head_kind == "model":
            out = self.model(**inputs)
            logits = out.logits[0]  # [N, V]
            return (out, logits, *top_k_and_argmax(logits, self.config.top_k))
        if self._head is None:
            self._head = build_head(self.head_kind, self.model, self.config.head_tiles)
        out = self.model.get_decoder()(**inputs)
        final = out.last_hidden_state[0]  # [N, hidden], after the final norm
        logits, topk_logits, topk_ids = self._head.greedy(final, self.config.top_k)  # [N, V] approximate; [N, k] float32's
        return out, logits, topk_ids, topk_logits, topk_ids[:, 0].clone()

    def _walk(self, tree: DraftTree, logits: torch.Tensor, preds: list[int], sampler: Sampler | None):
        """The accepted path: greedy, FLy's loose rule, or rejection sampling (with `sampler`).

        Returns:
            (path, forgiven nodes, the sampled bonus or None, node -> warped distribution or None).
        """
        if sampler is not None:
            rows: dict[int, torch.Tensor] = {}  # only the nodes the walk visits are warped

            def dist(node: int) -> torch.Tensor:
                if node not in rows:
                    rows[node] = warped_probs(logits[node].cpu(), sampler.config)  # [V]
                return rows[node]

            path, bonus = sample_walk(tree, dist, sampler)
            return path, [], bonus, dist
        if self.fly is None:
            return tree.greedy_path(preds), [], None, None
        entropies = entropy(logits, self.fly.entropy).tolist()
        path, forgiven = fly_walk(tree, preds, entropies, self.fly)
        return path, forgiven, None, None

