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
