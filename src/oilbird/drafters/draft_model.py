"""Draft-model decoding (FLy's setting; ALGORITHMS.md §8): a small LLM drafts, the target verifies.

A drafter model that shares the target's tokenizer proposes a chain of K tokens per round; the
target verifies the chain in one forward (strict greedy verification is lossless; FLy's loose
rule is the verifier's opt-in). With multi-level acceleration (MLA) the drafter itself is sped
up: instead of one drafter forward per token, prompt lookup proposes up to 6 tokens from the
context and the drafts so far, and one drafter forward verifies them greedily, exactly, so the
drafts are the ones the drafter would have produced token by token.

Lifecycle: the harness calls `attach(target)` once: it loads the drafter (a preset, file,
directory or hub id) and refuses one whose vocabulary differs from the target's, or builds
`self:N`, the target's own first N layers under its final norm and LM head (shared weights, no
extra memory: a legitimate same-tokenizer drafter for fast tests). One model serves every
request; each request keeps, in its state, the drafter's KV cache of what it has read, and each
`propose` first re-reads whatever was committed since (cropping the cache back to the longest
prefix it agrees with), then drafts. Like the verifier's prefix cache, the drafter keeps, per
tenant, the KV of the tenant's last finished request (`reuse_prefix`); a new request whose prompt
starts the same way takes it over, cropped to the shared prefix, and reads only the rest. The KV
rows are the drafter's own reading of the same tokens, so drafts are unchanged up to
floating-point summation order; only earlier, finished traffic of the same tenant is reused.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from transformers import DynamicCache

from oilbird.drafters.base import Drafter, RequestState
from oilbird.drafters.pld import pld_lookup
from oilbird.drafters.registry import register
from oilbird.errors import ConfigError, ModelError
from oilbird.prefix_cache import PrefixCacheConfig, common_prefix
from oilbird.sampling import Sampler, SamplingConfig, sample_walk, warped_probs
from oilbird.tenants import TenantMap
from oilbird.tree import DraftTree

SOURCE = "draft"


@dataclass
class DraftModelConfig:
    """Draft-model decoding (the FLy paper's defaults)."""

    model: str = "qwen2.5-coder-0.5b"
    """The drafter LLM: a preset, .gguf file, directory or hub id that shares the target's tokenizer, or 'self:N' (the target's own first N layers and LM head)."""
    k: int = 15
    """K: draft tokens per round (the paper's setting for a 70B target with an 8B drafter)."""
    mla: bool = False
    """Multi-level acceleration: prompt lookup proposes to the drafter, which verifies each proposal in one forward (lossless with respect to the drafter)."""
    mla_ngram: int = 4
    """MLA's prompt lookup: longest n-gram key."""
    mla_tokens: int = 6
    """MLA's prompt lookup: tokens per proposal."""
    reuse_prefix: bool = True
    """Start a request from the drafter's KV of its tenant's last finished request, cropped to the prompt prefix they share (at least `REUSE_MIN_MATCH` tokens); false: read every prompt whole."""
    sample: bool = True
    """At temperature > 0, sample the chain from the drafter's own distribution (the request's temperature, top-k and top-p) and let the verifier test it by min(1, p/q); False drafts the drafter's argmax, as at temperature 0."""

    def __post_init__(self) -> None:
        if self.k < 1:
            raise ValueError(f"draft k must be >= 1, got {self.k}")
        if self.mla_ngram < 1 or self.mla_tokens < 1:
            raise ValueError(f"draft mla_ngram and mla_tokens must be >= 1, got {self.mla_ngram}, {self.mla_tokens}")
        if self.model.startswith("self:") and not self.model[5:].isdigit():
            raise ValueError(f"draft model 'self:N' needs a layer count, got {self.model!r}")


def self_drafter(target, n_layers: int):
    """The target's own first `n_layers` layers under its final norm and LM head, as a causal LM.

    The modules are the target's (shared, not copied); only the config is new.

    Raises:
        ModelError: for a layer count out of range or an architecture without `model.layers`.
    """
    layers = getattr(getattr(target, "model", None), "layers", None)
    if layers is None:
        raise ModelError(f"cannot take the first layers of a {type(target).__name__}: it has no model.layers")
    if not 1 <= n_layers < len(layers):
        raise ModelError(f"a self drafter needs 1 <= N < {len(layers)} layers (the target's depth), got {n_layers}")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = config.layer_types[:n_layers]
    with torch.device("meta"):
        small = type(target)(config)
    for name, module in target.model.named_children():
        setattr(small.model, name, torch.nn.ModuleList(list(layers[:n_layers])) if name == "layers" else module)
    for name, module in target.named_children():
        if name != "model":
            setattr(small, name, module)
    if any(p.is_meta for p in small.parameters()):
        raise ModelError(f"cannot build a self drafter from a {type(target).__name__}: some weights are not shared")
    return small.eval()


def check_same_vocabulary(target_tokenizer, drafter_tokenizer, target_name: str, drafter_name: str) -> None:
    """Refuse a drafter whose tokenizer maps tokens to other ids than the target's.

    Raises:
        ModelError: naming both models and the sizes of their vocabularies.
    """
    a, b = target_tokenizer.get_vocab(), drafter_tokenizer.get_vocab()
    if a != b:
        raise ModelError(
            f"the drafter {drafter_name!r} has another vocabulary ({len(b)} tokens) than the target "
            f"{target_name!r} ({len(a)} tokens); draft-model decoding needs a drafter that shares the "
            "target's tokenizer (e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b), or 'self:N'")


REUSE_MIN_MATCH = PrefixCacheConfig().min_match
"""Shortest shared prompt prefix worth taking over: the verifier's prefix cache's default."""


def _new_stats() -> dict:
    return dict(drafter_forwards=0, mla_proposed=0, mla_accepted=0, prefix_reused=0)


@dataclass
class DrafterPrefix:
    """One tenant's last finished request as the drafter read it, for the next request to take."""

    tokens: list[int] = field(default_factory=list)
    """The tokens whose KV `cache` holds, in order."""
    cache: DynamicCache | None = None
    """The finished request's drafter cache (None once a request has taken it)."""

    def memory_bytes(self) -> int:
        layers = getattr(self.cache, "layers", [])
        return sum(t.numel() * t.element_size() for layer in layers
                   for t in (getattr(layer, "keys", None), getattr(layer, "values", None))
                   if isinstance(t, torch.Tensor))


@dataclass
class DraftModelState(RequestState):
    """A request of the 'draft' method: the drafter model's KV cache of what it has read."""

    cache: DynamicCache | None = None
    """The drafter's KV cache of `cached`."""
    cached: list[int] = field(default_factory=list)
    """The tokens whose KV is in `cache`, in order."""
    agreed: int = 0
    """A prefix of `cached` known to equal the committed sequence."""
    stats: dict = field(default_factory=_new_stats)
    """The request's measurements (`request_stats`)."""
    sampler: Sampler | None = None
    """Set when the request is sampled and the drafter samples its drafts (`use_sampling`)."""


@register
class DraftModelDrafter(Drafter):
    """A chain of K tokens from a drafter LLM, optionally accelerated by prompt lookup (MLA).

    The model is shared by every request; each request keeps its own KV cache in its state.
    """

    name = "draft"
    Config = DraftModelConfig
    State = DraftModelState
    needs_target = True

    def __init__(self, config=None) -> None:
        super().__init__(config)
        self.model = None  # the drafter causal LM, set by attach()
        self._target = None
        self.prefixes: TenantMap[DrafterPrefix] = TenantMap(DrafterPrefix)

    def attach(self, target, models: dict | None = None) -> None:
        if self._target is target:
            return
        spec = self.config.model
        # The drafter runs the target's fast kernels too (LoadedModel.tree_model(): our skinny
        # GEMM streams its weights once for the few rows a draft reads, where PyTorch's default
        # GEMM costs several one-row forwards on a CPU); a draft's exact bits do not matter.
        if spec.startswith("self:"):
            self.model = self_drafter(target.tree_model(), int(spec[5:]))
        else:
            from oilbird.models import load_model

            models = {} if models is None else models
            if spec not in models:
                models[spec] = load_model(spec, device=str(target.device))
            loaded = models[spec]
            check_same_vocabulary(target.tokenizer, loaded.tokenizer, target.name, spec)
            self.model = loaded.tree_model()
        self._target = target

    def start_request(self, request_id: str, prompt_ids: list[int], tenant: str = "default") -> DraftModelState:
        """Begin a request with an empty KV cache (raises ConfigError before `attach`)."""
        if self.model is None:
            raise ConfigError("the 'draft' method needs its target model: call drafter.attach(loaded) "
                              "before decoding (oilbird bench, generate and serve do)")
        state = super().start_request(request_id, prompt_ids, tenant)
        state.cache = DynamicCache(config=self.model.config)
        kept = self.prefixes.peek(tenant) if self.config.reuse_prefix else None
        if kept is not None and kept.cache is not None:
            # Keep >= 1 prompt token to read: its logits draft the first token.
            shared = min(common_prefix(kept.tokens, state.sequence), len(state.sequence) - 1)
            if shared >= REUSE_MIN_MATCH:
                state.cache, state.cached = kept.cache, kept.tokens  # taken over, not copied
                kept.cache, kept.tokens = None, []
                self._crop(state, shared)
                state.agreed = shared
                state.stats["prefix_reused"] = shared
        return state

    def stop_request(self, request_id: str) -> DraftModelState | None:
        """Release the request; its drafter cache becomes its tenant's reusable prefix."""
        state = super().stop_request(request_id)
        if state is not None and self.config.reuse_prefix and state.cache is not None:
            kept = self.prefixes.get(state.tenant)
            kept.tokens, kept.cache = state.cached, state.cache
        return state

    def use_sampling(self, request_id: str, sampling: SamplingConfig) -> None:
        """Sample this request's drafts from the drafter's warped distribution (if `sample`).

        The drafter's generator is its own, seeded from the request's seed, so a seed still
        reproduces the run."""
        if self.config.sample and not sampling.greedy:
            self.state(request_id).sampler = Sampler(sampling, seed=(sampling.seed * 7919 + 104729) % 2**62)

    def request_stats(self, request_id: str) -> dict:
        return dict(self.state(request_id).stats)

    @torch.inference_mode()
    def _read(self, state: DraftModelState, tokens: list[int], keep: int = 1) -> torch.Tensor:
        """Run the drafter over `tokens` after the request's cache; its logits after the last `keep`.

        Only the rows a draft reads go through the LM head: on a request's first read (the whole
        prompt) the full [P, V] logits cost as much as the drafter's layers.

        Returns:
            [keep, V] logits, on the drafter's device (only what a draft needs is copied out).
        """
        device = next(self.model.parameters()).device
        out = self.model(input_ids=torch.tensor([tokens], device=device), past_key_values=state.cache,
                         use_cache=True, logits_to_keep=keep)
        state.cached += tokens
        state.stats["drafter_forwards"] += 1
        return out.logits[0]  # [keep, V]

    @staticmethod
    def _choose(state: DraftModelState, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        """The next draft token from one row of logits [V]: the argmax, or a sample and its q [V]."""
        if state.sampler is None:
            return int(logits.argmax()), None
        q = warped_probs(logits.cpu(), state.sampler.config)  # [V]
        return state.sampler.draw(q), q

    @staticmethod
    def _crop(state: DraftModelState, length: int) -> None:
        if length < len(state.cached):
            state.cache.crop(length - len(state.cached))  # transformers 5: a negative count to drop
            state.cached = state.cached[:length]
            state.agreed = min(state.agreed, length)

    def _sync(self, state: DraftModelState) -> list[int]:
        """Crop the cache to its agreement with the committed sequence; what is left to read.

        The committed sequence only grows, so the prefix that agreed at the last sync still
        agrees: the comparison starts there instead of at token 0.
        """
        context = state.sequence
        limit = min(len(state.cached), len(context) - 1)  # keep >= 1 token to read: its logits draft
        agree = min(state.agreed, limit)
        while agree < limit and state.cached[agree] == context[agree]:
            agree += 1
        self._crop(state, agree)
        state.agreed = len(context)  # the pending tokens are read next: all of it will agree
        return context[agree:]

    def propose(self, request_id: str, budget: int) -> DraftTree:
        state = self.state(request_id)
        k = min(self.config.k, budget - 1)
        if k < 1:
            return DraftTree.root(state.anchor)
        pending = self._sync(state)
        draft = self._draft_mla if self.config.mla else self._draft_plain
        drafts, qs = draft(state, pending, k)
        tree = DraftTree.chain(state.anchor, drafts[:k], SOURCE)
        if state.sampler is not None:  # node i + 1 holds drafts[i], sampled from qs[i]
            tree.draft_probs.update({i + 1: q for i, q in enumerate(qs[:k])})
        return tree

    def _draft_plain(self, state: DraftModelState, pending: list[int], k: int):
        """K tokens, one drafter forward each. Returns (tokens, their q's or Nones)."""
        drafts, qs = [], []
        logits = self._read(state, pending)[-1]  # [V]
        while True:
            token, q = self._choose(state, logits)
            drafts.append(token)
            qs.append(q)
            if len(drafts) == k:
                return drafts, qs
            logits = self._read(state, [token])[-1]

    def _draft_mla(self, state: DraftModelState, pending: list[int], k: int):
        """K tokens, prompt lookup proposing to the drafter (greedy: its argmax test; sampled: the
        rejection-sampling walk over the proposal, so the drafts are distributed exactly as the
        drafter's own token-by-token sampling). Returns (tokens, their q's or Nones)."""
        cfg = self.config
        drafts: list[int] = []
        qs: list[torch.Tensor | None] = []
        previous: list[int] = []  # no match: reuse the last proposal (the reference code's rule)
        while len(drafts) < k:
            proposal = pld_lookup(state.sequence + drafts, cfg.mla_ngram, 1, cfg.mla_tokens) or previous
            previous = proposal
            rows = self._read(state, pending + proposal, len(proposal) + 1)  # [len(proposal) + 1, V]; row i predicts proposal[i]
            m, bonus, row_qs = self._mla_accept(state, proposal, rows)
            self._crop(state, len(state.cached) - (len(proposal) - m))  # forget the rejected proposal tokens
            state.stats["mla_proposed"] += len(proposal)
            state.stats["mla_accepted"] += m
            drafts += proposal[:m] + [bonus]
            qs += row_qs
            pending = [bonus]
        return drafts, qs

    @staticmethod
    def _mla_accept(state: DraftModelState, proposal: list[int], rows: torch.Tensor):
        """How many proposal tokens the drafter takes, its next token, and the q's of all of them."""
        if state.sampler is None:
            preds = rows.argmax(dim=-1).tolist()
            m = 0
            while m < len(proposal) and proposal[m] == preds[m]:
                m += 1
            return m, preds[m], [None] * (m + 1)
        chain = DraftTree.chain(-1, proposal, "pld")
        dist = [warped_probs(row, state.sampler.config) for row in rows.cpu()]  # [V] each; node i's is row i
        path, bonus = sample_walk(chain, lambda node: dist[node], state.sampler)
        return len(path), bonus, dist[: len(path) + 1]
