"""The semantic source transplanted into other hosts: prompt lookup, Token Recycling, SuffixDecoding.

Each is `SemanticDrafter` (oilbird/drafters/oilbird.py) over another lexical host, at that host's
unchanged budget and defaults, with the `sem_*` fields of `SemanticConfig`: the pairs (host,
transplant) isolate what the semantic key adds to a given tree (`results.SEMANTIC_PAIRS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from oilbird.drafters.oilbird import SemanticDrafter
from oilbird.drafters.pld import PLDConfig, PromptLookup
from oilbird.drafters.registry import register
from oilbird.drafters.suffix_decoding import SuffixDecoding, SuffixDecodingConfig
from oilbird.drafters.token_recycling import TokenRecycling, TokenRecyclingConfig
from oilbird.semantic_memory import SemanticConfig


@dataclass
class OilbirdPLDConfig(SemanticConfig, PLDConfig):
    """The semantic source transplanted into prompt lookup (PLDConfig fields plus sem_* fields)."""


@dataclass
class OilbirdTRConfig(SemanticConfig, TokenRecyclingConfig):
    """The semantic source transplanted into Token Recycling (its fields plus sem_* fields)."""


@register
class OilbirdPLD(SemanticDrafter):
    """The semantic source inside prompt lookup, at PLD's unchanged budget."""

    name = "oilbird-pld"
    Config = OilbirdPLDConfig
    host_class = PromptLookup


@register
class OilbirdTR(SemanticDrafter):
    """The semantic source inside Token Recycling, at TR's unchanged budget."""

    name = "oilbird-tr"
    Config = OilbirdTRConfig
    host_class = TokenRecycling


@dataclass
class OilbirdSuffixConfig(SemanticConfig, SuffixDecodingConfig):
    """The semantic source transplanted into SuffixDecoding (its fields plus sem_* fields)."""


@register
class OilbirdSuffix(SemanticDrafter):
    """The semantic source inside SuffixDecoding's tree, at SuffixDecoding's unchanged budget.

    The host's tree is small and precise (about 4 nodes a forward on API-Bank), so here the key's
    chains are more often the only route to a token than in GOOSE's wider tree (docs/RESULTS.md)."""

    name = "oilbird-suffix"
    Config = OilbirdSuffixConfig
    host_class = SuffixDecoding
