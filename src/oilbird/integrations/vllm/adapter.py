"""The bridge between an engine's batched steps and the drafter protocol; no vLLM import here.

An engine that verifies draft *chains* (vLLM) tells us, after each forward, for every request in
the batch: its id, prompt and tenant, the drafts it verified, the tokens it committed (accepted
drafts, then the bonus token), and, per verified position, the target's hidden state and top-k.
`EngineDrafter.step` turns that into the drafter protocol (oilbird/drafters/base.py):

- a request seen for the first time with a committed token starts (`start_request`); its first
  token came from the prefill, observed as the verification of a root-only tree;
- every later step is observed as the verification of the chain anchor -> drafts;
- then each request gets a proposal: the drafter's tree at `node_budget` nodes, cut to its best
  path (`DraftTree.best_path`) of at most the engine's draft length.

A request with nothing committed this step (a chunk of a long prompt, a resumed preemption that
is still re-reading its prompt) is neither observed nor proposed for. `finish` stops a request
and hands its committed sequence to the caller (which may log it). Only the engine's output rank
calls this, one step at a time; requests of any tenants interleave freely.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from oilbird.acceptance import ExplorationFloor, node_shapes
from oilbird.drafters.base import Drafter
from oilbird.drafters.registry import drafter_class
from oilbird.errors import ConfigError
from oilbird.integrations.vllm.chain_policy import ChainCalibrator, batch_min_reach, chain_outcome
from oilbird.integrations.vllm.config import EngineDrafterConfig
from oilbird.tree import DraftTree
from oilbird.verifier import Verification


@dataclass
class StepRequest:
    """One request's part of an engine step."""

    request_id: str
    prompt_ids: list[int]
    tenant: str
    drafts: list[int]
    """The draft tokens the engine verified this step (what we proposed, possibly cut)."""
    committed: list[int]
    """Tokens committed this step: the accepted drafts, then the bonus token; [] for none."""
    hidden: torch.Tensor | None = None
    """[len(drafts) + 1, d] the target's last-layer state (after the final norm) at each verified position."""
    topk_ids: torch.Tensor | None = None
    """[len(drafts) + 1, k] the target's top-k ids at each verified position, best first."""
    topk_logits: torch.Tensor | None = None
    """[len(drafts) + 1, k] their logits."""
    max_output: int | None = None
    """The request's max_tokens: the engine drops committed tokens beyond it, and so do we."""
    stop_ids: frozenset[int] = frozenset()
    """Tokens that end the request: the engine drops what a step committed after one."""
    seeded: bool = False
    """A sampled request with a seed. It gets no drafts: the engine draws its random numbers per
    draft token, so drafts from pools that grow between two runs would change what the same seed
    samples; without drafts the same seed gives the same tokens, as without speculation."""


@dataclass
class FinishedRequest:
    """A request that left the engine, as it joins its tenant's pools (and the request log)."""

    request_id: str
    tenant: str
    prompt_ids: list[int]
    output_ids: list[int]


@dataclass
class TenantStats:
    """Counters per tenant, for the server's metrics."""

    requests: int = 0
    """Requests finished."""
    forwards: int = 0
    """Verification steps observed (the prefill's first token included)."""
    committed: int = 0
    """Tokens committed."""
    drafted: int = 0
    """Draft tokens proposed and verified."""
    accepted: int = 0
    """Draft tokens accepted."""

    @property
    def tau(self) -> float:
        """Committed tokens per verification forward."""
        return self.committed / self.forwards if self.forwards else 0.0


@dataclass
class EngineDrafter:
    """A drafter serving an engine's batches. Build it with `EngineDrafter.build(config)`."""

    drafter: Drafter
    config: EngineDrafterConfig
    stats: dict[str, TenantStats] = field(default_factory=dict)
    proposed: dict[str, DraftTree] = field(default_factory=dict)
    """request id -> the chain last proposed (its nodes keep their sources, for attribution)."""
    lengths: dict[str, int] = field(default_factory=dict)
    """request id -> its next draft length (length_policy 'adaptive')."""
    calibrators: dict[str, ChainCalibrator] = field(default_factory=dict)
    """tenant -> its acceptance estimates (length_policy 'calibrated')."""
    prompt_lens: dict[str, int] = field(default_factory=dict)
    """request id -> its prompt's length, for every request in flight."""
    floors: dict[str, ExplorationFloor] = field(default_factory=dict)
    """tenant -> when its calibrated chains, cut to nothing, get a probe (length_policy 'calibrated')."""
    chain_shapes: dict[str, list] = field(default_factory=dict)
    """request id -> the shapes its last proposed chain's nodes had in their tree, root first
    (`calibration_shape`)."""
    contexts: dict[str, str] = field(default_factory=dict)
    """request id -> how its last verified chain went (`chain_outcome`), the context its next
    chain is calibrated in (calibration_context 'outcome')."""

    @classmethod
    def build(cls, config: EngineDrafterConfig) -> "EngineDrafter":
        """The drafter named by `config.method`, configured by `config.options`.

        Raises:
            ConfigError: unknown method or override, or a method that needs a model of its own.
        """
        from oilbird.methods import check_spec, configure, parse_spec

        check_spec(config.method)
        name, overrides = parse_spec(config.method)
        klass = drafter_class(name)
        if klass.needs_target:
            raise ConfigError(f"method {name!r} runs a model of its own, which the vLLM "
                              "integration does not host; use vLLM's own draft-model method")
        drafter_config = configure(name, None, overrides)
        return cls(klass(drafter_config), config)

    def step(self, batch: list[StepRequest], max_drafts: int) -> list[list[int]]:
        """Observe one engine step and propose the next drafts, one list per request of `batch`."""
        proposals = []
        min_reach = batch_min_reach(self.config.min_reach, sum(bool(r.committed) for r in batch),
                                    self.config.max_batch_reach)
        for request in batch:
            if not request.committed:
                proposals.append([])
                continue
            self._observe(request)
            length = 0 if request.seeded else self._length(request, max_drafts)
            proposals.append(self._propose(request.request_id, length, min_reach))
        return proposals

    def finish(self, request_id: str) -> FinishedRequest | None:
        """Stop a request (it joins its tenant's pools); None if it never committed a token."""
        self.proposed.pop(request_id, None)
        self.chain_shapes.pop(request_id, None)
        self.lengths.pop(request_id, None)
        self.contexts.pop(request_id, None)
        prompt_len = self.prompt_lens.pop(request_id, 0)
        state = self.drafter.stop_request(request_id)
        if state is None:
            return None
        self.tenant_stats(state.tenant).requests += 1
        return FinishedRequest(request_id, state.tenant, state.sequence[:prompt_len],
                               state.sequence[prompt_len:])

    def _observe(self, request: StepRequest) -> None:
        rid, drafter = request.request_id, self.drafter
        if rid not in drafter.requests:
            drafter.start_request(rid, request.prompt_ids, request.tenant)
            self.prompt_lens[rid] = len(request.prompt_ids)
            tree = DraftTree.root(request.prompt_ids[-1])
            drafts: list[int] = []
        else:
            drafts = request.drafts
            tree = self._verified_chain(rid, drafts)
        accepted = len(request.committed) - 1
        if accepted > len(drafts) or request.committed[:accepted] != drafts[:accepted]:
            raise ConfigError(f"request {rid!r}: committed {request.committed} does not extend "
                              f"the verified drafts {drafts}; the engine's step is inconsistent")
        if self.config.length_policy == "calibrated" and drafts and "engine" not in tree.sources[1]:
            # our chain, as verified, in the context it was proposed in
            shapes = self.chain_shapes.get(rid)
            self._calibrator(request.tenant).update(tree, accepted, self._context(rid),
                                                    shapes[:len(tree)] if shapes else None)
        if self.config.calibration_context == "outcome":  # a new request's first chain: 'start'
            self.contexts[rid] = chain_outcome(len(drafts), accepted) if rid in self.contexts else "start"
        committed = self._kept(request)
        if committed:  # else the request is over (max_tokens reached): nothing to harvest
            drafter.observe(rid, self._verification(request, tree, committed, min(accepted, len(committed))))
        stats = self.tenant_stats(request.tenant)
        stats.forwards += 1
        stats.committed += len(committed)
        stats.drafted += len(drafts)
        stats.accepted += accepted

    def _kept(self, request: StepRequest) -> list[int]:
        """The step's committed tokens the engine keeps: none past max_tokens or a stop token."""
        committed = list(request.committed)
        if request.max_output is not None:
            produced = len(self.drafter.requests[request.request_id].sequence) - self.prompt_lens[request.request_id]
            committed = committed[:max(0, request.max_output - produced)]
        for i, token in enumerate(committed):
            if token in request.stop_ids:
                return committed[:i + 1]
        return committed

    def _length(self, request: StepRequest, max_drafts: int) -> int:
        """This request's next draft length: vLLM's maximum, or adapted to its acceptance.

        Rejected drafts cost verification compute and a chain engine gains nothing from them,
        so after a partial acceptance the next chain is cut to what was accepted plus one, and it
        grows by two after a full acceptance (the schedule of transformers' assisted decoding).
        """
        if self.config.length_policy != "adaptive" or max_drafts < 1:
            return max_drafts
        previous = self.lengths.get(request.request_id)
        if previous is None or not request.drafts:
            length = previous or max_drafts
        elif len(request.committed) - 1 >= len(request.drafts):
            length = previous + 2
        else:
            length = len(request.committed)  # accepted + 1
        length = max(1, min(max_drafts, length))
        self.lengths[request.request_id] = length
        return length

    def _verified_chain(self, request_id: str, drafts: list[int]) -> DraftTree:
        """The chain the engine verified: our last proposal, cut to what the engine kept."""
        proposed = self.proposed.get(request_id)
        if proposed is not None and proposed.tokens[1:len(drafts) + 1] == drafts:
            return proposed.truncated(len(drafts) + 1)
        # The engine verified something else (it may pad or drop drafts): tag it as the engine's.
        return DraftTree.chain(self.drafter.requests[request_id].anchor, drafts, "engine")

    def _verification(self, request: StepRequest, tree: DraftTree, committed: list[int],
                      accepted: int) -> Verification:
        n = len(tree)
        topk_ids = request.topk_ids[:n] if request.topk_ids is not None else None
        if topk_ids is not None:
            argmax = topk_ids[:, 0]  # [N]
        else:  # the committed tokens are the argmax where they exist (greedy); unknown past them
            argmax = torch.full((n,), -1, dtype=torch.long)
            argmax[: len(request.committed[:n])] = torch.tensor(request.committed[:n])
        hidden = request.hidden[:n] if request.hidden is not None else None  # [N, d]
        return Verification(
            tree=tree, prefix_len=len(self.drafter.requests[request.request_id].sequence) - 1,
            argmax=argmax, topk_ids=topk_ids,
            topk_logits=request.topk_logits[:n] if request.topk_logits is not None else None,
            path=list(range(1, accepted + 1)), committed=committed,
            finished=False, hidden=hidden)

    def _propose(self, request_id: str, max_drafts: int, min_reach: float) -> list[int]:
        if max_drafts < 1:
            return []
        tree = self.drafter.propose(request_id, self.config.node_budget).truncated(self.config.node_budget)
        if self.config.length_policy == "calibrated":
            tenant = self.drafter.requests[request_id].tenant
            shapes = node_shapes(tree) if self.config.calibration_shape else None
            path = self._calibrator(tenant).choose(tree, max_drafts, min_reach, self._context(request_id), shapes,
                                                   self.config.extend_trials)
            if not path and len(tree) > 1:
                path = self._probe(tenant, tree, max_drafts, request_id, shapes)
            elif path:
                self._floor(tenant).drafted()
            if shapes:  # the chain's nodes keep the shapes they had in the tree, for `update`
                self.chain_shapes[request_id] = [shapes[0]] + [shapes[n] for n in path]
        else:
            path = tree.best_path(max_drafts)
        self.drafter.restrict_proposal(request_id, path)
        chain = tree.subtree(path)
        self.proposed[request_id] = chain
        return chain.tokens[1:]

    def _probe(self, tenant: str, tree: DraftTree, max_drafts: int, request_id: str,
               shapes: list | None) -> list[int]:
        """The chain of a step whose estimates cut every chain to nothing: none, except every
        `explore_every + 1`-th such step in a row of the tenant, whose best chain's first
        `explore_drafts` tokens are proposed whatever their estimates (a probe)."""
        if not self._floor(tenant).probe_due():  # counts the probe (the metrics read it there)
            return []
        length = min(max_drafts, self.config.explore_drafts)
        return self._calibrator(tenant).choose(tree, length, 0.0, self._context(request_id), shapes)

    def _context(self, request_id: str) -> str:
        if self.config.calibration_context == "none":
            return ""
        return self.contexts.get(request_id, "start")

    def _floor(self, tenant: str) -> ExplorationFloor:
        return self.floors.setdefault(tenant, ExplorationFloor(self.config.explore_every))

    def _calibrator(self, tenant: str) -> ChainCalibrator:
        return self.calibrators.setdefault(tenant, ChainCalibrator())

    def tenant_stats(self, tenant: str) -> TenantStats:
        """The tenant's counters (created at zero for a tenant not seen yet)."""
        return self.stats.setdefault(tenant, TenantStats())

