"""The method-spec language of `oilbird bench --methods`: which drafter, which config, which rule.

A spec is `name`, optionally followed by `+fly` (FLy's loose, lossy rule), a trailing
`[field=value;...]` of config overrides and `@budget`:

    pld                          prompt lookup, paper defaults
    oilbird[sem_theta=0.6]       Oilbird with one config field changed
    goose@auto                   GOOSE at the hardware-aware budget
    oilbird@fit                  Oilbird, each tree pruned to the subtree worth its forward
    draft+fly[k=10;fly_window=4] draft-model decoding verified by FLy (W = 4)

Overrides are fields of the method's config dataclass, parsed by the field's type; `fly_*`
overrides are fields of `FlyConfig`. Specs in a list are separated by commas outside brackets.
Every mistake raises `ConfigError` naming the spec and what is wrong.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from dataclasses import replace

from oilbird.config import field_types, parse_bool
from oilbird.drafters import DRAFTERS, make_drafter
from oilbird.errors import ConfigError
from oilbird.fly import FlyConfig

FLY = "+fly"
"""Method suffix: verify with FLy's loose (lossy) rule, e.g. 'draft+fly[fly_window=4]'."""
EXTERNAL_METHODS = {"hf-pld": "transformers generate(prompt_lookup_num_tokens=10)"}
"""Methods that are not our drafters but external runs reported beside them."""


def split_methods(text: str) -> list[str]:
    """Split a methods list on commas that are not inside [...] overrides."""
    parts, depth, current = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def _split_spec(spec: str) -> tuple[str, dict[str, str]]:
    """'oilbird[sem_theta=0.6;sem_floor=false]' -> ('oilbird', {'sem_theta': '0.6', ...}), all overrides."""
    if "[" not in spec:
        return spec.strip(), {}
    method, _, rest = spec.partition("[")
    if not rest.endswith("]"):
        raise ConfigError(f"{spec!r}: overrides go in one trailing [field=value;...]")
    overrides = {}
    for item in filter(None, (x.strip() for x in rest[:-1].split(";"))):
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"{spec!r}: override {item!r} is not field=value")
        overrides[key.strip()] = value.strip()
    return method.strip(), overrides


def parse_spec(spec: str) -> tuple[str, dict[str, str]]:
    """The drafter of a method spec and its config overrides.

    'oilbird[sem_theta=0.6;sem_floor=false]' -> ('oilbird', {'sem_theta': '0.6', ...}). FLy's
    part ('+fly' and 'fly_*' overrides, see `fly_config`) is left out: 'draft+fly[k=10;fly_window=4]'
    -> ('draft', {'k': '10'}).

    Raises:
        ConfigError: for unbalanced brackets or an override without '='.
    """
    method, overrides = _split_spec(spec)
    return method.removesuffix(FLY), {k: v for k, v in overrides.items() if not k.startswith("fly_")}


def is_drafter(spec: str) -> bool:
    """Whether a spec (with or without '@budget') names one of our drafters ('ar' included)."""
    return parse_spec(spec.partition("@")[0])[0] in DRAFTERS


def fly_config(spec: str) -> FlyConfig | None:
    """FLy's config of a method spec: None unless the method ends with '+fly'.

    'draft+fly[fly_theta=0.6;fly_window=4]' -> FlyConfig(theta=0.6, window=4).

    Raises:
        ConfigError: for 'fly_*' overrides without '+fly', an unknown field or a bad value.
    """
    method, overrides = _split_spec(spec)
    fly = {k.removeprefix("fly_"): v for k, v in overrides.items() if k.startswith("fly_")}
    if not method.endswith(FLY):
        if fly:
            raise ConfigError(f"{spec!r}: fly_* overrides need the FLy rule: write {method}{FLY}[...]")
        return None
    return override(FlyConfig(), fly, f"{spec!r}", prefix="fly_")


def check_spec(spec: str) -> None:
    """Validate one spec of a methods list (name, '+fly', overrides and '@budget').

    Raises:
        ConfigError: for an unknown method or field, a bad value, or a budget or FLy rule on
            something that is not a drafter; the message names what is known.
    """
    body, _, budget = spec.partition("@")
    method, overrides = parse_spec(body)
    known = sorted(DRAFTERS) + sorted(EXTERNAL_METHODS)
    if method not in known:
        raise ConfigError(f"unknown method {method!r}; known methods: {', '.join(known)}")
    if fly_config(body) is not None and method not in DRAFTERS:
        raise ConfigError(f"{spec!r}: FLy verifies drafts; only drafters take '{FLY}'")
    if "@" in spec and (method not in DRAFTERS or not (budget in ("auto", "fit") or budget.isdigit() and int(budget) >= 1)):
        raise ConfigError(f"{spec!r}: only drafters take a budget, as name@N, name@auto or name@fit")
    if overrides:
        if method not in DRAFTERS:
            raise ConfigError(f"{spec!r}: only drafters take config overrides")
        configure(method, None, overrides)  # validates fields and values now


def configure(method: str, base, overrides: dict[str, str]):
    """`method`'s config: `base` (or the defaults) with `overrides` (field -> text) applied.

    Raises:
        ConfigError: for a field the config does not have, or a value it rejects.
    """
    config = base if base is not None else DRAFTERS[method].Config()
    return override(config, overrides, method)


def override(config, overrides: dict[str, str], label: str, prefix: str = ""):
    """`config` with `overrides` (field -> text, parsed by the field's type) applied.

    Args:
        config: a config dataclass instance.
        overrides: field name -> its value as text.
        label: names the owner in messages.
        prefix: how the fields are spelled in a spec ('fly_' for FlyConfig).

    Returns:
        A new config (the same one when there is nothing to override).

    Raises:
        ConfigError: for a field the config does not have, or a value it rejects.
    """
    if not overrides:
        return config
    types = field_types(type(config))
    values = {}
    for key, text in overrides.items():
        if key not in types:
            raise ConfigError(f"{label} has no config field {prefix + key!r}; "
                              f"fields: {', '.join(prefix + t for t in types)}")
        kind = parse_bool if types[key] is bool else types[key]
        try:
            values[key] = kind(text)
        except (ValueError, ArgumentTypeError):
            hint = " (true or false)" if types[key] is bool else ""
            raise ConfigError(f"{label}[{prefix}{key}={text}]: expected {types[key].__name__}{hint}, "
                              f"got {text!r}") from None
    try:
        return replace(config, **values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{label}: {err}") from None


def build_drafter(spec: str, drafter_configs: dict, target=None, models: dict | None = None):
    """A fresh drafter for a method spec, attached to `target` (a `LoadedModel`) when given.

    Args:
        spec: the spec without '@budget'.
        drafter_configs: method name -> base config (the command line's); defaults otherwise.
        target: the target model, for drafters that run a model of their own.
        models: memoizes drafter models across the drafters of one run (see `Drafter.attach`).
    """
    method, overrides = parse_spec(spec)
    drafter = make_drafter(method, configure(method, drafter_configs.get(method), overrides))
    if target is not None:
        drafter.attach(target, models)
    return drafter
