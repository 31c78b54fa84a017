"""The request samples the vLLM scripts serve (`--workload`): scripts/vllm_bench.py,
vllm_interleave.py, chain_sim.py and lexical_oracle.py read the same ones."""

from __future__ import annotations

from typing import NamedTuple


class Workload(NamedTuple):
    """A named request sample, as `load_dataset(dataset, per_category=..., limit=...)` takes it."""

    dataset: str
    per_category: int
    limit: int
    title: str
    """How tables name it."""


WORKLOADS = {
    "slice": Workload("api-bank", 5, 20, "API-Bank slice"),  # make bench: --per-category 5 --limit 20
    "stream": Workload("api-bank", 25, 100, "API-Bank stream"),  # 25 per file, stream order
    # Open-ended questions, 4 per category (docs/RESULTS.md's Spec-Bench rows): little to copy,
    # so the drafters' length policies and exploration floors are what it tests.
    "spec-bench": Workload("spec-bench", 4, 52, "Spec-Bench"),
}


def tenant_of(workload: str) -> str:
    """The tenant (pool) a workload's requests share: as `oilbird bench` serves a dataset, one per dataset."""
    return WORKLOADS[workload].dataset
