"""What the scripts that read an `oilbird bench --out RUN` directory share: the command line's
run argument, its records (`oilbird.tables.read_records`, with its errors) and a markdown table."""

from __future__ import annotations

import argparse
from pathlib import Path

from oilbird.errors import DatasetError
from oilbird.tables import read_records


def run_parser(doc: str, what: str = "an `oilbird bench --out` directory") -> argparse.ArgumentParser:
    """A parser whose description is the script's docstring and whose first argument is the run."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help=what)
    return parser


def load(parser: argparse.ArgumentParser, run: Path) -> list[dict]:
    """The run's records, or the parser's usage error saying what is wrong with the directory
    (none there, an empty or damaged file)."""
    try:
        return read_records(run)
    except DatasetError as err:
        parser.error(str(err))


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
