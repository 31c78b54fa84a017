"""GGUF to transformers: loading a GGUF file once, then its converted float32 safetensors copy.

Contract:
- `load_gguf(path, sha, cache_dir, dtype, log)` returns (model, tokenizer, source) for a GGUF
  file whose sha256 is `sha` (verified by `model_fetch.py`). Loading a GGUF file through
  transformers takes 20-55 s (parsing its metadata and tokenizer twice, mapping tensor names and
  de-quantizing), so the first load saves a plain float32 transformers directory under
  `<cache_dir>/converted/<sha256>-transformers-<version>/`, and every load, the first included,
  returns the model read from that copy (2-3 s), bit-identical to the GGUF load. `source` is the
  copy, or the GGUF file itself when the copy could not be written.
- The copy is written to a temporary directory and renamed, so an interrupted conversion never
  leaves a half-written entry; an unreadable entry is deleted and rebuilt.
- `load_pretrained(directory, dtype)` is the one `from_pretrained` call (SDPA attention) that
  every load goes through: the converted copy here, local directories and hub ids in `models.py`.

This module is the only place that writes converted checkpoints; fix conversion issues here.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from oilbird.errors import ModelError
from oilbird.model_fetch import Log


def load_pretrained(directory: Path | str, dtype: torch.dtype, **kwargs: Any):
    """(model, tokenizer) from a transformers directory or hub id, with SDPA attention.

    Args:
        directory: a local directory, a hub id, or (with `gguf_file=`) a GGUF file's directory.
        dtype: the weights' dtype.
        **kwargs: passed to both `from_pretrained` calls (e.g. `gguf_file`, `local_files_only`).
    Returns:
        (model, tokenizer).
    Raises:
        whatever transformers raises; callers turn it into a `ModelError` with context.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(directory, dtype=dtype,
                                                 attn_implementation="sdpa", **kwargs)
    return model, tokenizer


def save_converted(model, tokenizer, target: Path) -> None:
    """Save a GGUF-loaded model as a plain float32 transformers directory, atomically.

    Args:
        model: the model transformers loaded from the GGUF file (de-quantized float32 weights).
        tokenizer: its tokenizer.
        target: the directory to create; if another process created it first, its copy is kept.
    Raises:
        OSError: the copy could not be written.
    """
    from safetensors.torch import save_file

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
        save_file(_engine_neutral_state(model), str(tmp / "model.safetensors"), metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        try:
            os.rename(tmp, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
            # another process converted the same file first; its copy is equivalent
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _engine_neutral_state(model) -> dict[str, torch.Tensor]:
    """The model's tensors under the names every engine reads, one tensor per storage.

    With tied embeddings the input embedding and the LM head share one tensor. safetensors'
    `save_model` keeps one of the two names (it kept `lm_head.weight`); transformers re-ties
    either, but vLLM reads tied weights from the input embedding's name only
    (`model.embed_tokens.weight`), leaves the embedding empty and emits token 0 at every step.
    So keep the input embedding's name and drop the head's, as `save_pretrained` does.
    """
    state = model.state_dict()
    embedding = model.get_input_embeddings()
    keep = next(f"{name}.weight" for name, module in model.named_modules() if module is embedding)
    out: dict[str, torch.Tensor] = {}
    saved: set[int] = set()
    for name in [keep] + [n for n in state if n != keep]:
        tensor = state[name]
        if tensor.data_ptr() in saved:  # a tied alias of a tensor already saved: engines re-tie it
            continue
        saved.add(tensor.data_ptr())
        out[name] = tensor.detach().contiguous()
    return out


_FORMAT = "v2"
"""Bumped when the converted copy's layout changes, so that older copies are rebuilt (v2: tied
embeddings stored as `model.embed_tokens.weight`, which vLLM needs)."""


def load_gguf(path: Path, sha: str, cache_dir: Path, dtype: torch.dtype, log: Log):
    """(model, tokenizer, source) for a verified GGUF file, via the converted copy if possible.

    Args:
        path: the GGUF file.
        sha: its verified sha256 (the copy's cache key, with the transformers version).
        cache_dir: cache root; the copy lives under `<cache_dir>/converted/`.
        dtype: the returned weights' dtype.
        log: receives progress messages.
    Returns:
        (model, tokenizer, source): source is the converted copy's directory, or `path` when
        the copy could not be saved.
    Raises:
        ModelError: transformers could not load the GGUF file.
    """
    import transformers

    converted = cache_dir / "converted" / f"{sha}-transformers-{transformers.__version__}-{_FORMAT}"
    if (converted / "config.json").is_file():
        try:
            return (*load_pretrained(converted, dtype), converted)
        except Exception as e:  # noqa: BLE001 - any damage to a cache entry means: rebuild it
            log(f"converted copy {converted} is unreadable ({e}); rebuilding it")
            shutil.rmtree(converted, ignore_errors=True)
    log(f"loading {path} (first time: converting it, 20-60 s)")
    try:
        model, tokenizer = load_pretrained(path.parent, torch.float32, gguf_file=path.name)
    except Exception as e:
        raise ModelError(f"transformers could not load the GGUF file {path}: {e}") from e
    try:
        save_converted(model, tokenizer, converted)
    except OSError as e:
        log(f"could not save a converted copy to {converted} ({e}); the next load will be slow too")
        return model.to(dtype), tokenizer, path
    log(f"saved a converted copy to {converted}")
    del model  # free the GGUF-loaded weights before reading the copy back
    # Reading the copy back makes the first load return the same kind of model as later ones.
    return (*load_pretrained(converted, dtype), converted)
