"""The code stays readable in an afternoon: small modules, short functions (the project's rule).

A module past ~400 lines or a function past ~60 holds more than one job: split it by job.
Docstrings do not count toward a function's length (they are encouraged).
"""

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "oilbird"
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 60


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def _body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    first = body[0]
    has_docstring = isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
        and isinstance(first.value.value, str)
    start = (body[1].lineno if len(body) > 1 else first.end_lineno + 1) if has_docstring else first.lineno
    return node.end_lineno - start + 1


def test_no_module_holds_more_than_one_jobs_worth_of_lines():
    long = {str(p.relative_to(SRC)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not long, f"split these modules by job (lines > {MAX_MODULE_LINES}): {long}"


def test_no_function_is_longer_than_a_screen():
    long = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _body_lines(node) > MAX_FUNCTION_LINES:
                long[f"{path.relative_to(SRC)}:{node.name}"] = _body_lines(node)
    assert not long, f"split these functions (body lines > {MAX_FUNCTION_LINES}): {long}"


def test_one_name_per_thing_no_two_classes_share_a_name():
    seen: dict[str, list[str]] = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(path.relative_to(SRC)))
    assert not {name: where for name, where in seen.items() if len(where) > 1}


BRITISH = ("normalise", "summarise", "neighbour", "tokenise", "labelled", "colour", "behaviour", "honour",
           "memoise", "optimise", "initialise", "serialise", "recognise", "maximise", "minimise")


def test_one_spelling_american_throughout_the_code():
    found = {f"{path.relative_to(SRC)}:{i}": word for path in _modules()
             for i, line in enumerate(path.read_text().lower().splitlines(), 1)
             for word in BRITISH if word in line}
    assert not found, f"use the American spelling: {found}"
