"""`OilbirdProposer`: the class vLLM's `custom_class` speculative method builds and calls.

vLLM builds it as `OilbirdProposer(vllm_config)` in its output-rank model runner and calls
`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)` once per step,
expecting one draft list per request of the batch. That call carries no request ids, tenants or
hidden states, so Oilbird's model runner (oilbird/integrations/vllm/runner.py) hands them over
just before, through `set_batch`; the runner also reports finished requests through `finish`.
"""

from __future__ import annotations

import sys
from pathlib import Path

from oilbird.errors import ConfigError
from oilbird.integrations.vllm.adapter import EngineDrafter, StepRequest
from oilbird.integrations.vllm.config import EngineDrafterConfig


class OilbirdProposer:
    """Drafts for vLLM with any of Oilbird's drafters (`additional_config["oilbird"]["method"]`).

    Args:
        vllm_config: vLLM's config; its `additional_config["oilbird"]` is an `EngineDrafterConfig`.

    Raises:
        ConfigError: bad Oilbird options in `additional_config`.
    """

    def __init__(self, vllm_config) -> None:
        self.config = EngineDrafterConfig.from_additional_config(vllm_config.additional_config)
        self.max_drafts = int(vllm_config.speculative_config.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.engine = EngineDrafter.build(self.config)
        self.listeners: list = []
        """Callables told of every `FinishedRequest` (e.g. the request log)."""
        self._batch: list[StepRequest] | None = None
        self.pool_state = None
        if self.config.state_dir:
            # Pools survive restarts: rebuilt from the request log and the last snapshot.
            from oilbird.pool_state import PoolState

            self.pool_state = PoolState(Path(self.config.state_dir), self.engine.drafter,
                                        self.config.snapshot_every)
            for tenant in self.pool_state.restore():  # restored tenants show in the metrics at once
                self.engine.tenant_stats(tenant)
            self.listeners.append(self._log)

    def _log(self, done) -> None:
        if self.pool_state is not None:  # None once closed: requests aborted at shutdown go unlogged
            self.pool_state.record(done.tenant, done.prompt_ids, done.output_ids)

    def load_model(self, target_model) -> None:
        """vLLM's hook to give drafters the target model; ours need none of its weights."""

    def set_batch(self, batch: list[StepRequest]) -> None:
        """The step's requests, in the batch's order; called by the runner before `propose`."""
        self._batch = batch

    def propose(self, sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=None) -> list[list[int]]:
        """Draft token ids per request of the batch (vLLM's custom-proposer call).

        Raises:
            ConfigError: when vLLM runs without Oilbird's worker class, which supplies the batch.
        """
        batch, self._batch = self._batch, None
        if batch is None:
            raise ConfigError("OilbirdProposer needs Oilbird's worker class: start vLLM with "
                              "--worker-cls oilbird.integrations.vllm.OilbirdCPUWorker (or OilbirdGPUWorker)")
        # Never draft past the model's context: vLLM would have to drop the drafts.
        rooms = [self.max_model_len - int(num_tokens_no_spec[i]) - 1 for i in range(len(batch))]
        proposals = self.engine.step(batch, self.max_drafts)
        return [p[:max(0, room)] for p, room in zip(proposals, rooms)]

    def snapshot(self) -> None:
        """Write the pools' snapshot now (no-op without a state dir)."""
        if self.pool_state is not None:
            self.pool_state.snapshot()

    def close(self) -> None:
        """Snapshot the pools and close the request log (the worker's shutdown); idempotent.
        A failed snapshot is logged, not raised: the request log still holds every finished
        request, and the pools are rebuilt from it at the next start."""
        if self.pool_state is None:
            return
        pool_state, self.pool_state = self.pool_state, None
        try:
            pool_state.snapshot()
        except Exception as e:  # noqa: BLE001 - the shutdown must go on
            print(f"oilbird: snapshot at shutdown failed ({type(e).__name__}: {e}); the request "
                  "log keeps every finished request", file=sys.stderr)
        finally:
            pool_state.close()

    def stats(self) -> dict[str, dict[str, float]]:
        """Per tenant: the drafting counters (`TenantStats` fields), `probes` (its exploration
        floor's), `pool_bytes` and `requests_in_flight`."""
        drafter = self.engine.drafter
        out = {}
        for tenant, stats in self.engine.stats.items():
            in_flight = sum(state.tenant == tenant for state in drafter.requests.values())
            floor = self.engine.floors.get(tenant)
            out[tenant] = dict(vars(stats), probes=floor.probes if floor is not None else 0,
                               pool_bytes=drafter.tenant_bytes(tenant), requests_in_flight=in_flight)
        return out

    def finish(self, request_id: str) -> None:
        """A request finished or was aborted: it joins its tenant's pools; listeners are told."""
        finished = self.engine.finish(request_id)
        if finished is not None:
            for listener in self.listeners:
                listener(finished)
