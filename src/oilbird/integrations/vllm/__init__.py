"""Oilbird inside vLLM: any of our drafters as vLLM's speculative proposer, per tenant.

vLLM verifies draft chains only, so the drafter's tree is cut to its best path each step
(oilbird/integrations/vllm/adapter.py). Use it through `oilbird serve`, or with vLLM directly:

    speculative_config={"method": "custom_class",
                        "model": "oilbird.integrations.vllm.OilbirdProposer",
                        "num_speculative_tokens": 8}
    worker_cls="oilbird.integrations.vllm.OilbirdCPUWorker"        # OilbirdGPUWorker on CUDA
    additional_config={"oilbird": {"method": "oilbird"}}           # EngineDrafterConfig fields

A request's tenant is `SamplingParams(extra_args={"oilbird_tenant": name})` (OpenAI body:
`"vllm_xargs": {"oilbird_tenant": name}`); requests without one share the tenant "default".
Importing this package does not import vLLM; its worker and proposer classes do, on first use
(so the adapter and config can be used and tested where vLLM is not installed).
"""

from oilbird.integrations.vllm.config import TENANT_ARG, EngineDrafterConfig

_LAZY = {"OilbirdProposer": "proposer", "OilbirdCPUWorker": "runner", "OilbirdGPUWorker": "runner"}

__all__ = ["EngineDrafterConfig", "TENANT_ARG", *_LAZY]


def __getattr__(name: str):
    # PEP 562: vLLM is imported only when one of its subclasses is asked for.
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
