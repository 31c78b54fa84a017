"""The answer graders (oilbird.accuracy): GSM8K numbers and HumanEval execution."""

from oilbird.accuracy import Grader, gradable, gsm8k_correct, humaneval_completion, last_number
from oilbird.datasets import Request, load_dataset, load_humaneval_problems


def test_gsm8k_compares_the_last_number_with_the_reference():
    reference = "So it cost 600+400=$<<600+400=1000>>1000 in total.\n#### 1000"
    assert gsm8k_correct("Travel costs $600, so the total is $1,000.", reference)
    assert not gsm8k_correct("The total is 1000 dollars, or 999 after the discount.", reference)
    assert not gsm8k_correct("I do not know.", reference)
    assert last_number("pay 5.50 now") == 5.5 and last_number("-3 degrees") == -3.0


def test_the_80_math_reasoning_questions_are_gradable():
    questions = load_dataset("spec-bench:math_reasoning", limit=1000)
    assert len(questions) == 80 and all(gradable(q) for q in questions)
    assert all(gsm8k_correct(q.reference.rpartition("####")[2], q.reference) for q in questions)
    assert not gradable(load_dataset("spec-bench:writing", limit=1)[0])


def test_humaneval_runs_the_tests_on_the_answer():
    problem = load_humaneval_problems()["HumanEval/0"]
    request = Request(id="HumanEval/0", category="humaneval")
    grader = Grader(timeout=10)
    full = f"Here it is:\n```python\n{problem['prompt']}{problem['canonical_solution']}```\n"
    assert grader.grade(request, full) is True
    body_only = f"```python\n{problem['canonical_solution']}```"
    assert grader.grade(request, body_only) is True
    wrong = f"```python\ndef {problem['entry_point']}(numbers, threshold):\n    return False\n```"
    assert grader.grade(request, wrong) is False
    endless = f"```python\ndef {problem['entry_point']}(numbers, threshold):\n    while True:\n        pass\n```"
    assert Grader(timeout=1).grade(request, endless) is False
    assert humaneval_completion("no code at all", problem) == "no code at all"
    assert grader.grade(Request(id="x", category="writing"), "text") is None
