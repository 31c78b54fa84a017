"""Name -> drafter class registry. Drafter modules register themselves with `@register`."""

from __future__ import annotations

from oilbird.drafters.base import Drafter
from oilbird.errors import ConfigError

DRAFTERS: dict[str, type[Drafter]] = {}


def register(cls: type[Drafter]) -> type[Drafter]:
    """Class decorator: make `cls` available under `cls.name`."""
    if not cls.name or cls.name in DRAFTERS:
        raise ValueError(f"drafter name {cls.name!r} is empty or already registered")
    DRAFTERS[cls.name] = cls
    return cls


def drafter_class(name: str) -> type[Drafter]:
    """The class registered as `name`.

    Raises:
        ConfigError: for an unknown name, listing the known ones.
    """
    try:
        return DRAFTERS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; known methods: {', '.join(sorted(DRAFTERS))}") from None


def make_drafter(name: str, config=None) -> Drafter:
    """A fresh drafter of method `name` with `config` (default: the paper's values)."""
    return drafter_class(name)(config)
