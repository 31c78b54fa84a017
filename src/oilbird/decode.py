"""The one decode loop every method runs; autoregressive decoding is this loop with an empty draft.

Per request: prefill, then repeat { drafter proposes a tree within the node budget; the verifier
runs one forward and commits the greedy path plus a bonus token; the drafter observes } until a
stop token, `max_new_tokens`, or the model's context is reached. Wall time is split into prefill,
the drafter's `propose` and `observe` (drafting, and harvesting into its pools), the model
forward, and bookkeeping (the verifier's mask, walk and KV compaction, and this loop's own
accounting); tokens committed per forward are recorded so that
τ = Σ committed / Σ verification forwards can be pooled over a dataset. The prefill commits no
token (the last prompt token is the first anchor), so τ excludes it by construction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace

from oilbird.budget import AdaptiveBudget
from oilbird.drafters.base import Drafter
from oilbird.errors import PromptError
from oilbird.prefix_cache import PrefixCache
from oilbird.sampling import Sampler, SamplingConfig
from oilbird.tree import DraftTree
from oilbird.tree_select import FittedTree, tree_outcome
from oilbird.verifier import TreeVerifier, Verification


@dataclass
class DecodeConfig:
    """Limits of one request, and how its tokens are chosen."""

    max_new_tokens: int = 128
    """Most tokens to generate per request (a commit that overshoots is truncated)."""
    node_budget: int = 64
    """Most tree nodes per verification forward, root included; drafters propose within it."""
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    """Greedy (the default, temperature 0) or lossless sampling (temperature, top-k, top-p, seed)."""

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.node_budget < 1:
            raise ValueError(f"node_budget must be >= 1, got {self.node_budget}")


@dataclass
class RequestResult:
    """Output and measurements of one request."""

    request_id: str
    prompt_len: int
    output_ids: list[int]
    """Generated token ids, stop token included when one was produced."""
    finish_reason: str
    """'stop' (stop token), 'length' (max_new_tokens) or 'context' (model context full)."""
    committed_per_forward: list[int] = field(default_factory=list)
    """Tokens committed by each verification forward (after truncation to the limit)."""
    nodes_per_forward: list[int] = field(default_factory=list)
    """Tree size of each verification forward, root included."""
    accepted_drafts: int = 0
    """Accepted draft tokens (committed tokens minus bonus tokens)."""
    accepted_sources: dict[str, int] = field(default_factory=dict)
    """Accepted draft tokens per source tag (a token with several tags counts for each)."""
    sole_sources: dict[str, int] = field(default_factory=dict)
    """Accepted draft tokens whose only tag is the source."""
    lossy: bool = False
    """True when FLy's loose rule verified the request: the output may differ from greedy decoding."""
    forgiven_positions: list[int] = field(default_factory=list)
    """Output indices committed by FLy's loose rule although they were not the target's argmax (empty unless FLy is on: then the output is lossy)."""
    sample_check: list[float] = field(default_factory=lambda: [0.0, 0.0, 0])
    """Sampling only: summed `calibration_terms` of the committed tokens and their count ([deviation, variance, n])."""
    drafter_stats: dict = field(default_factory=dict)
    """The drafter's own measurements of this request (`Drafter.request_stats`)."""
    excess_tokens: int = 0
    """Committed tokens dropped because they overshot max_new_tokens."""
    prefix_reused: int = 0
    """Prompt tokens whose KV came from the prefix cache instead of the prefill."""
    prefill_s: float = 0.0
    """The prefill forward, and the drafter's harvest of it (`observe_prefill`)."""
    propose_s: float = 0.0
    """The drafter's `propose` calls."""
    forward_s: float = 0.0
    """The verification forwards (with their argmax and top-k)."""
    forward_s_per_forward: list[float] = field(default_factory=list)
    """Each verification forward's seconds, in order (with `nodes_per_forward`: the cost curve decoding paid)."""
    observe_s: float = 0.0
    """The drafter's `observe` calls: harvesting what was committed and computed."""
    bookkeeping_s: float = 0.0
    """The verifier's mask, walk and KV compaction, and the loop's accounting (attribution, budget policy)."""
    wall_s: float = 0.0
    """The whole request, prefill included."""

    def add_sample_terms(self, terms: list[tuple[float, float]]) -> None:
        """Pool a forward's `calibration_terms` of the committed tokens (sampling only)."""
        for deviation, variance in terms:
            self.sample_check[0] += deviation
            self.sample_check[1] += variance
            self.sample_check[2] += 1

    @property
    def drafter_s(self) -> float:
        """Seconds in the drafter during decoding: `propose` plus `observe`."""
        return self.propose_s + self.observe_s

    @property
    def forwards(self) -> int:
        """Verification forwards (the prefill is not one)."""
        return len(self.committed_per_forward)

    @property
    def tau(self) -> float:
        """Accepted length of this request: committed tokens per verification forward."""
        return len(self.output_ids) / self.forwards if self.forwards else 0.0


def check_prompt(prompt_ids: list[int], max_context: int) -> None:
    """Raise PromptError when a prompt is empty or leaves no room in the model's context."""
    if not prompt_ids:
        raise PromptError("the prompt is empty: give at least one token of text")
    if len(prompt_ids) >= max_context:
        raise PromptError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {max_context} tokens; "
            "shorten the prompt or use a model with a longer context")


def decode(verifier: TreeVerifier, drafter: Drafter, prompt_ids: list[int],
           config: DecodeConfig | None = None, *, max_context: int,
           request_id: str = "request", tenant: str = "default",
           budget_policy: AdaptiveBudget | FittedTree | None = None,
           prefix_cache: PrefixCache | None = None) -> RequestResult:
    """Generate for one request with `drafter` proposing draft trees (greedy, or sampled losslessly).

    Args:
        verifier: the tree verifier over the target model.
        drafter: any registered drafter (use "ar" for plain autoregressive decoding).
        prompt_ids: the tokenized prompt.
        config: limits (max_new_tokens, node budget) and sampling (greedy by default).
        max_context: the model's context length; generation stops when it is full.
        request_id: the request's name in records and in the drafter (unique among its requests in flight).
        tenant: whose cross-request pool the request drafts from and joins.
        budget_policy: picks each forward's budget (up to `config.node_budget`) and may prune the
            proposal to the nodes worth verifying ('fit'); None: fixed.
        prefix_cache: the tenant's KV of an earlier request, reused for the prompt's shared
            prefix and replaced by this request's (oilbird/prefix_cache.py); None: prefill whole.

    Returns:
        The generated ids and the request's measurements.

    Raises:
        PromptError: if the prompt is empty or does not fit the context.
    """
    config = config or DecodeConfig()
    check_prompt(prompt_ids, max_context)
    start = time.perf_counter()
    result = RequestResult(request_id=request_id, prompt_len=len(prompt_ids), output_ids=[],
                           finish_reason="length", lossy=verifier.fly is not None)
    out = result.output_ids
    sampler = None if config.sampling.greedy else Sampler(config.sampling)
    drafter.start_request(request_id, prompt_ids, tenant)
    try:
        if sampler is not None:
            drafter.use_sampling(request_id, config.sampling)
        t = time.perf_counter()
        state, observation = _prefill(verifier, drafter, prompt_ids, request_id, tenant, prefix_cache, result)
        result.prefill_s = time.perf_counter() - t
        context = ""  # how the request's previous tree went (oilbird/tree_select.py)
        while len(out) < config.max_new_tokens:
            # A tree of N nodes commits at most N tokens after the anchor, so the sequence
            # (P cached + anchor + N) must stay within the context: N <= context - P - 1.
            room = max_context - state.length - 1
            if room < 1:
                result.finish_reason = "context"
                break
            t = time.perf_counter()
            budget, tree = _propose(drafter, request_id, min(config.node_budget, room), budget_policy, context)
            result.propose_s += time.perf_counter() - t
            ver = verifier.verify(state, tree, drafter.hidden_layer, sampler)
            result.forward_s += ver.forward_s
            result.forward_s_per_forward.append(ver.forward_s)
            t = time.perf_counter()
            accepted = ver.path  # what the verifier accepted, also past the request's last token
            ver = _record(result, tree, ver, config.max_new_tokens)
            committed = ver.committed
            if budget_policy is not None:
                # The policy learns what verification accepted: a tail cut by max_new_tokens
                # was accepted, and counting it as rejected would teach it that deep nodes fail.
                budget_policy.verified(budget, tree, accepted, context)
                context = tree_outcome(tree, accepted)
            t_observe = time.perf_counter()
            drafter.observe(request_id, ver)
            result.observe_s += time.perf_counter() - t_observe
            result.bookkeeping_s += ver.bookkeeping_s + t_observe - t
            if ver.finished and committed and committed[-1] in verifier.stop_ids:
                result.finish_reason = "stop"
                break
        result.drafter_stats = drafter.request_stats(request_id)
        if prefix_cache is not None:
            prefix_cache.store(tenant, prompt_ids + out, state, observation, prefilled=len(prompt_ids) - 1)
    finally:
        drafter.stop_request(request_id)
    result.wall_s = time.perf_counter() - start
    return result


def _record(result: RequestResult, tree: DraftTree, ver: Verification, max_new_tokens: int) -> Verification:
    """Commit one verification's tokens to `result` (outputs, per-forward counts, attribution),
    cut at `max_new_tokens`. Returns the verification as the drafter may see it: past the
    limit its committed tokens, path and forgiven nodes are dropped, since nobody sees that tail."""
    out = result.output_ids
    committed = ver.committed[: max_new_tokens - len(out)]
    if len(committed) < len(ver.committed):  # overshoot
        result.excess_tokens += len(ver.committed) - len(committed)
        path = ver.path[: len(committed)]
        ver = replace(ver, committed=committed, path=path, forgiven=[c for c in ver.forgiven if c in path])
    result.forgiven_positions += [len(out) + ver.path.index(c) for c in ver.forgiven]
    out.extend(committed)
    result.add_sample_terms(ver.sample_terms[: len(committed)])
    result.committed_per_forward.append(len(committed))
    result.nodes_per_forward.append(len(tree))
    _attribute(result, tree, ver.path)
    return ver


def _propose(drafter: Drafter, request_id: str, cap: int, budget_policy, context: str):
    """The drafter's tree within the budget (the policy's choice, at most `cap`), pruned to the
    nodes the policy would verify ('fit') in the request's `context`. Returns (the budget
    offered, the tree to verify)."""
    budget = cap if budget_policy is None else min(cap, budget_policy.choose())
    tree = drafter.propose(request_id, budget).truncated(budget)
    keep = budget_policy.select(tree, context) if budget_policy is not None else None
    if keep is not None and len(keep) < len(tree) - 1:  # verify only these nodes, renumbered
        drafter.restrict_proposal(request_id, keep)
        tree = tree.subtree(keep)
    return budget, tree


def _prefill(verifier: TreeVerifier, drafter: Drafter, prompt_ids: list[int], request_id: str, tenant: str,
             prefix_cache: PrefixCache | None, result: RequestResult):
    """The request's prefill (from the tenant's cached prefix where one matches), and the
    drafter's harvest of it when it wants one. Returns (KV state, observation or None)."""
    past = (prefix_cache.take(tenant, prompt_ids, drafter.needs_prefill, prefilled_only=verifier.prefills_apart)
            if prefix_cache is not None else None)
    result.prefix_reused = past.length if past is not None else 0
    if not drafter.needs_prefill:
        return verifier.prefill(prompt_ids, past), None
    state, observation = verifier.prefill_observed(prompt_ids, topk=drafter.prefill_topk,
                                                   hidden_layer=drafter.hidden_layer, past=past)
    drafter.observe_prefill(request_id, observation)
    return state, observation


def _attribute(result: RequestResult, tree, path: list[int]) -> None:
    """Count each accepted draft token toward every source tag it carries, and its sole source."""
    for node in path:
        result.accepted_drafts += 1
        tags = tree.sources[node]
        for source in tags:
            result.accepted_sources[source] = result.accepted_sources.get(source, 0) + 1
        if len(tags) == 1:
            (only,) = tags
            result.sole_sources[only] = result.sole_sources.get(only, 0) + 1
