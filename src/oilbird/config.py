"""Config dataclasses -> command-line options, with the field docstrings as help.

Every component has a `@dataclass` config whose defaults are the papers' values and whose fields
carry a docstring (a string literal right below the field, as in the stdlib's style guides). This
module reads those docstrings from the source with `ast`, so the CLI, the server and benchmark
sweeps derive their options from the dataclass fields and never repeat them by hand.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import textwrap
from typing import Any

from oilbird.errors import ConfigError


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """Map each field of dataclass `cls` to the docstring written below it.

    Args:
        cls: a dataclass whose fields are followed by string literals.

    Returns:
        field name -> docstring (empty string where a field has none).
    """
    docs = {f.name: "" for f in dataclasses.fields(cls)}
    for base in reversed(cls.__mro__[1:]):  # inherited fields keep their base's docstring
        if dataclasses.is_dataclass(base):
            docs.update({k: v for k, v in field_docs(base).items() if k in docs})
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):  # source unavailable (e.g. frozen app): help text is optional
        return docs
    body = tree.body[0].body  # type: ignore[attr-defined]
    for node, nxt in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                and isinstance(nxt.value.value, str)):
            docs[node.target.id] = " ".join(nxt.value.value.split())
    return docs


def _option(prefix: str, name: str) -> str:
    return "--" + (f"{prefix}-" if prefix else "") + name.replace("_", "-")


def parse_bool(text: str) -> bool:
    """'true'/'false' (and 1/0, yes/no, on/off) as a bool; raises ArgumentTypeError otherwise."""
    low = text.lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true/false, got {text!r}")


def add_config_args(parser: argparse.ArgumentParser, cls: type, prefix: str = "",
                    exclude: tuple[str, ...] = ()) -> None:
    """Add one `--prefix-field-name` option per scalar field of dataclass `cls`.

    Options default to None so that `config_from_args` can tell "not given" from "given".
    Fields named in `exclude` get no option (the command fixes them itself).
    """
    group = parser.add_argument_group(f"{cls.__name__} ({prefix or 'general'})")
    docs = field_docs(cls)
    hints = field_types(cls)
    for f in dataclasses.fields(cls):
        kind = hints[f.name]
        if kind not in (int, float, str, bool) or f.name in exclude:
            continue  # structured fields are set from code, not the command line
        default = f.default if f.default is not dataclasses.MISSING else None
        # argparse expands %-formats in help text; a docstring's "20%" must stay literal.
        text = f"{docs[f.name]} (default: {default})".replace("%", "%%")
        group.add_argument(
            _option(prefix, f.name), dest=f"{prefix}__{f.name}", default=None,
            type=parse_bool if kind is bool else kind, metavar=kind.__name__.upper(),
            help=text,
        )


def config_from_args(cls: type, args: argparse.Namespace, prefix: str = "", **overrides: Any):
    """Build `cls` from the options `add_config_args` added, keeping defaults for unset ones."""
    values = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, f"{prefix}__{f.name}", None)
        if value is not None:
            values[f.name] = value
    values.update(overrides)
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"invalid {cls.__name__}: {err}") from None


@functools.cache
def field_types(cls: type) -> dict[str, type]:
    # `from __future__ import annotations` makes annotations strings; resolve the simple ones.
    names = {"int": int, "float": float, "str": str, "bool": bool}
    return {f.name: names.get(f.type, object) if isinstance(f.type, str) else f.type
            for f in dataclasses.fields(cls)}
