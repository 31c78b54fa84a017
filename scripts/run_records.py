"""What the scripts that read an `oilbird bench --out RUN` directory share: the command line's
run argument, its records and a markdown table."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Iterator


def run_parser(doc: str, what: str = "an `oilbird bench --out` directory") -> argparse.ArgumentParser:
    """A parser whose description is the script's docstring and whose first argument is the run."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help=what)
    return parser


def check_run(parser: argparse.ArgumentParser, run: Path) -> None:
    """Exit with the parser's usage error unless `run` holds a records.jsonl."""
    if not (run / "records.jsonl").is_file():
        parser.error(f"{run} holds no records.jsonl: pass an `oilbird bench --out` directory")


def records(run: Path) -> Iterator[dict]:
    """The run's records, one per request and method (the generate() reference's included)."""
    for line in (run / "records.jsonl").read_text().splitlines():
        yield json.loads(line)


def markdown(header: list[str], rows: list[list[str]]) -> str:
    """A markdown table: the first column left-aligned, the others right-aligned."""
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
