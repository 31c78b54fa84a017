"""GGUF conversion (oilbird.gguf_convert) on the real default model (SmolLM2-135M-Instruct).

The session fixture loads it into a fresh cache dir, so every run exercises the one-time GGUF
conversion (~20 s) and then a load that reads the converted copy.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from oilbird.models import DEFAULT_MODEL, LoadedModel, load_model, resolve_model_file


@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("oilbird-cache")


@pytest.fixture(scope="session")
def lm(cache) -> LoadedModel:
    return load_model(DEFAULT_MODEL, cache_dir=cache, log=lambda message: None)


def test_first_load_returns_the_converted_copy(lm, cache):
    source = Path(lm.source)
    assert source.parent == cache / "converted" and (source / "model.safetensors").is_file()
    # The GGUF quantization marker is dropped: the copy holds plain float32 weights.
    assert "quantization_config" not in json.loads((source / "config.json").read_text())


def test_later_loads_read_the_converted_copy(lm, cache):
    # Loading by the .gguf path hits the same sha256-keyed converted copy as the preset did.
    gguf = resolve_model_file(DEFAULT_MODEL, cache_dir=cache, log=lambda message: None)
    again = load_model(str(gguf), cache_dir=cache, log=lambda message: None)
    assert again.source == lm.source and "converted" in again.source
    ids = torch.tensor([lm.encode_text("The quick brown fox")])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, again.model(ids).logits)


def test_the_copy_stores_tied_embeddings_under_the_name_every_engine_reads(lm):
    # vLLM reads a tied LM head from the input embedding's tensor; a copy holding only
    # `lm_head.weight` loads into vLLM with an empty embedding and decodes token 0 forever.
    from safetensors import safe_open

    assert lm.model.config.tie_word_embeddings
    with safe_open(str(Path(lm.source) / "model.safetensors"), framework="pt") as f:
        names = set(f.keys())
        embedding = f.get_tensor("model.embed_tokens.weight")
    assert "lm_head.weight" not in names
    assert torch.equal(embedding, lm.model.get_input_embeddings().weight.detach())
    assert torch.equal(embedding, lm.model.get_output_embeddings().weight.detach())  # re-tied on load


def test_a_copy_in_the_old_layout_is_not_reused(lm, cache):
    # Copies written before the layout fix lack the embedding's name; the version tag in the
    # directory name keeps them from being read again.
    assert Path(lm.source).name.endswith("-v2")
