"""Oilbird: lossless, training-free speculative decoding.

The public API: load a model, pick a drafter by name, decode.

    from oilbird import load_model, make_drafter, TreeVerifier, decode
    loaded = load_model("smollm2-135m")
    ids = loaded.encode_chat([{"role": "user", "content": "Hi"}])
    result = decode(TreeVerifier(loaded.tree_model(), loaded.stop_ids), make_drafter("pld"), ids,
                    max_context=loaded.max_context)
    print(loaded.decode(result.output_ids), result.tau)
"""

from oilbird.decode import DecodeConfig, RequestResult, decode
from oilbird.drafters import DRAFTERS, Drafter, make_drafter, register
from oilbird.errors import ConfigError, DatasetError, ModelError, OilbirdError, PromptError
from oilbird.tree import DraftTree
from oilbird.verifier import TreeVerifier, Verification, VerifierConfig


def load_model(*args, **kwargs):
    """See `oilbird.models.load_model` (imported lazily: it pulls in transformers' GGUF loader)."""
    from oilbird.models import load_model as _load

    return _load(*args, **kwargs)


__all__ = [
    "ConfigError", "DatasetError", "DecodeConfig", "DraftTree", "Drafter", "DRAFTERS",
    "ModelError", "OilbirdError", "PromptError", "RequestResult", "TreeVerifier", "Verification",
    "VerifierConfig", "decode", "load_model", "make_drafter", "register",
]

__version__ = "0.1.0"
