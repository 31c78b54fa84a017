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
    adaptive_length: bool = True
    """Adapt each request's draft length to its acceptance: +2 after a step that accepted every
    draft, down to what was accepted + 1 otherwise (between 1 and num_speculative_tokens)."""
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
