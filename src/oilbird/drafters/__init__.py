"""Drafters: one module per method, all behind the protocol in `base`, found by name in the registry.

Importing this package registers every built-in drafter.
"""

from oilbird.drafters import (ar, draft_model, goose, oilbird, oilbird_transplants, pld, sam,  # noqa: F401  (import registers the drafters)
                              suffix_decoding, suffix_reference, token_recycling)
from oilbird.drafters.base import Drafter
from oilbird.drafters.registry import DRAFTERS, drafter_class, make_drafter, register

__all__ = ["DRAFTERS", "Drafter", "drafter_class", "make_drafter", "register"]
