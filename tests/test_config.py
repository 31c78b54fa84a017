"""Config dataclasses become command-line options with their field docstrings as help."""

import argparse
from dataclasses import dataclass

import pytest

from oilbird.config import add_config_args, config_from_args, field_docs
from oilbird.errors import ConfigError


@dataclass
class DemoConfig:
    """A demo."""

    depth: int = 3
    """How deep to go."""
    ratio: float = 0.5
    """A share of something."""
    enabled: bool = True
    """Whether it runs."""

    def __post_init__(self):
        if self.depth < 0:
            raise ValueError("depth must be >= 0")


def test_field_docs_are_read_from_the_source():
    assert field_docs(DemoConfig) == {"depth": "How deep to go.", "ratio": "A share of something.",
                                      "enabled": "Whether it runs."}


def test_options_round_trip_and_keep_defaults():
    parser = argparse.ArgumentParser()
    add_config_args(parser, DemoConfig, prefix="demo")
    args = parser.parse_args(["--demo-depth", "7", "--demo-enabled", "false"])
    assert config_from_args(DemoConfig, args, "demo") == DemoConfig(depth=7, ratio=0.5, enabled=False)
    assert "How deep to go. (default: 3)" in parser.format_help().replace("\n", " ").replace("  ", " ")


def test_invalid_values_raise_config_error():
    parser = argparse.ArgumentParser()
    add_config_args(parser, DemoConfig, prefix="demo")
    with pytest.raises(ConfigError, match="depth must be >= 0"):
        config_from_args(DemoConfig, parser.parse_args(["--demo-depth", "-1"]), "demo")


def test_inherited_fields_keep_their_docstrings_and_options():
    from oilbird.drafters.oilbird import OilbirdConfig

    docs = field_docs(OilbirdConfig)
    assert docs["sem_theta"].startswith("Entry floor")  # from SemanticConfig
    assert docs["node_budget"] and docs["harvest_prefill"]  # from GooseConfig
    parser = argparse.ArgumentParser()
    add_config_args(parser, OilbirdConfig, prefix="oilbird")
    args = parser.parse_args(["--oilbird-sem-theta", "0.8", "--oilbird-top-k", "4"])
    config = config_from_args(OilbirdConfig, args, prefix="oilbird")
    assert config.sem_theta == 0.8 and config.top_k == 4
