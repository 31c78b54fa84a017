"""What the vLLM integration reads from vLLM's `additional_config["oilbird"]`.

vLLM passes `additional_config` (a free-form dict, `--additional-config` on its command line) to
every process unchanged, so the drafter's method and options travel there, not in environment
variables. `oilbird serve` writes it; users of vLLM's own `vllm serve` can write it by hand:

    --speculative-config '{"method": "custom_class", "model": "oilbird.integrations.vllm.OilbirdProposer",
                           "num_speculative_tokens": 8}'
    --worker-cls oilbird.integrations.vllm.OilbirdCPUWorker          # or OilbirdGPUWorker
    --additional-config '{"oilbird": {"method": "oilbird", "state_dir": "/var/lib/oilbird"}}'
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from oilbird.errors import ConfigError

ADDITIONAL_CONFIG_KEY = "oilbird"
TENANT_ARG = "oilbird_tenant"
LENGTH_POLICIES = ("calibrated", "adaptive", "fixed")
CALIBRATION_CONTEXTS = ("outcome", "none")
"""The key of `SamplingParams.extra_args` (OpenAI body: `vllm_xargs`) naming a request's tenant."""


@dataclass
class EngineDrafterConfig:
    """How Oilbird drafts inside an engine that verifies chains."""

    method: str = "oilbird"
    """A method spec as `oilbird bench` takes it: a drafter name (`oilbird list`), optionally with
    config overrides, e.g. `oilbird[sem_theta=0.6]`; no '+fly' (vLLM verifies strictly) or '@budget'."""
    node_budget: int = 24
    """Nodes of the tree the drafter builds each step; its best path (at most vLLM's
    num_speculative_tokens) is proposed. Smaller than our engine's 64: only one path is verified,
    and the drafter's time is paid on every step."""
    length_policy: str = "calibrated"
    """Which chain of the tree is proposed and how long (at most num_speculative_tokens):
    'calibrated': the chain most likely accepted by the tenant's online acceptance estimates per
    source, depth and score, cut where its probability of being reached falls below `min_reach`
    (oilbird/integrations/vllm/chain_policy.py); 'adaptive': the best-scored path, its length +2
    after a step that accepted every draft, else what was accepted + 1; 'fixed': the best-scored
    path at full length."""
    min_reach: float = 0.1
    """'calibrated': the least probability of being reached for a proposed draft token when a
    request is alone in its step. A draft token costs verification compute whether accepted or
    not: about the cost of one draft token over the cost of a step (0.05 to 0.1 on a CPU, lower
    on a GPU). With B requests in a step it rises to min(0.5, min_reach·B/(1 + min_reach·(B−1)))."""
    max_batch_reach: float = 0.5
    """'calibrated': the cap on that batch-raised reach."""
    explore_every: int = 8
    """'calibrated': after this many steps in a row in which a tenant's estimates cut every chain
    its drafter offered to nothing, the next such step proposes the best chain's first
    `explore_drafts` tokens anyway, so a source whose early drafts failed can earn its way back
    (estimates learn only from what is verified); 0: never."""
    explore_drafts: int = 2
    """'calibrated': the length of such a probe (at most vLLM's num_speculative_tokens)."""
    extend_trials: int = 0
    """'calibrated': after a chain the engine accepted whole, the draft token the cut falls on is
    proposed anyway if its key (source, depth, score bin) has been tried fewer than this many times
    for the tenant, so that a key condemned by its first misses can be tried again (our engine's
    `--budget-fit-extend-trials`); 0: never. It reads the request's last outcome, so it needs
    `calibration_context` 'outcome'."""
    calibration_context: str = "outcome"
    """'calibrated': what else the acceptance estimates are kept by: 'outcome', how the request's
    previous chain went (none proposed, none accepted, some, all; a request copying a past answer
    keeps copying), or 'none' (source, depth and score only)."""
    calibration_shape: bool = False
    """'calibrated': also keep the estimates by each node's shape in the drafter's tree (the height
    of the subtree under it, its number of siblings; oilbird/acceptance.py `node_shapes`), as our
    engine's 'fit' budget does. Off by default: on the 100-request stream's chains it changed the
    estimated decode time of `oilbird`, `sam` and `suffix` by under 1% (docs/VLLM.md, stop 58)."""
    topk: int = 8
    """Target top-k kept per verified position for drafters that learn from it (GOOSE, TR)."""
    state_dir: str | None = None
    """Where the request log and snapshots live (None: pools live in memory only)."""
    snapshot_every: int = 64
    """Snapshot the semantic stores after this many finished requests (and at shutdown)."""

    def __post_init__(self) -> None:
        if "+fly" in self.method or "@" in self.method:
            raise ConfigError(f"method {self.method!r}: inside vLLM verification is strict and the "
                              "draft length is vLLM's num_speculative_tokens; drop '+fly' and '@...'")
        if self.node_budget < 2:
            raise ConfigError(f"node_budget must be >= 2 (the anchor and one draft), got {self.node_budget}")
        if self.length_policy not in LENGTH_POLICIES:
            raise ConfigError(f"length_policy must be one of {LENGTH_POLICIES}, got {self.length_policy!r}")
        if not 0.0 <= self.min_reach <= 1.0:
            raise ConfigError(f"min_reach must be in [0, 1], got {self.min_reach}")
        if self.calibration_context not in CALIBRATION_CONTEXTS:
            raise ConfigError(f"calibration_context must be one of {CALIBRATION_CONTEXTS}, "
                              f"got {self.calibration_context!r}")
        if not 0.0 <= self.max_batch_reach <= 1.0:
            raise ConfigError(f"max_batch_reach must be in [0, 1], got {self.max_batch_reach}")
        if self.explore_every < 0 or self.explore_drafts < 1:
            raise ConfigError(f"explore_every must be >= 0 and explore_drafts >= 1, got "
                              f"{self.explore_every} and {self.explore_drafts}")
        if isinstance(self.extend_trials, bool) or not isinstance(self.extend_trials, int) or self.extend_trials < 0:
            raise ConfigError(f"extend_trials must be an integer >= 0 (0: never), got {self.extend_trials!r}")
        if not isinstance(self.calibration_shape, bool):
            raise ConfigError(f"calibration_shape must be true or false (a JSON boolean), "
                              f"got {self.calibration_shape!r}")
        if self.topk < 1:
            raise ConfigError(f"topk must be >= 1, got {self.topk}")
        if self.snapshot_every < 1:
            raise ConfigError(f"snapshot_every must be >= 1, got {self.snapshot_every}")

    @classmethod
    def from_additional_config(cls, additional: dict | None) -> "EngineDrafterConfig":
        """The config under `additional["oilbird"]` (defaults where absent).

        Raises:
            ConfigError: for unknown keys, naming the known ones.
        """
        raw = dict((additional or {}).get(ADDITIONAL_CONFIG_KEY) or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ConfigError(f"unknown oilbird option(s) {unknown} in vLLM's additional_config; "
                              f"known: {sorted(known)}")
        return cls(**raw)
