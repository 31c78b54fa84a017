"""Losslessness audit and external reference runs (ALGORITHMS.md §9).

Lossless means token-identical to plain greedy decoding of the same model. The reference is an
independent run of transformers' own `generate(do_sample=False)`, not our decode loop, so a bug in
the loop cannot hide in both sides. At the first divergence we report the reference's top-1/top-2
logit margin there: a margin near zero points to a numeric near-tie flipped by the batched tree
forward; a large margin points to a bug.

This module also runs transformers' own prompt lookup (`prompt_lookup_num_tokens`), counting the
model's forward calls with a forward hook, so our PLD can be compared with it side by side.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch


@dataclass
class Reference:
    """Greedy output of transformers' `generate` for one prompt."""

    output_ids: list[int]
    """Generated ids, stop token included when one was produced."""
    margins: list[float]
    """Top-1 minus top-2 logit at each generated position."""
    wall_s: float
    """Seconds the generate call took."""


@dataclass
class AuditResult:
    """Comparison of one method's output with the greedy reference."""

    lossless: bool
    divergence: int | None = None
    """Index of the first differing generated token (or of the first missing/extra token)."""
    expected: int | None = None
    """Reference token there (None when the reference ended first)."""
    got: int | None = None
    """Method's token there (None when the method ended first)."""
    margin: float | None = None
    """Reference top-1/top-2 logit margin at the divergence."""


def _generate_kwargs(stop_ids: frozenset[int], max_new_tokens: int) -> dict:
    stops = sorted(stop_ids)
    return dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=stops,
                pad_token_id=stops[0], temperature=None, top_p=None, top_k=None)


@torch.inference_mode()
def greedy_reference(model, prompt_ids: list[int], max_new_tokens: int,
                     stop_ids: frozenset[int]) -> Reference:
    """Greedy decoding by transformers `generate`, with per-step logit margins."""
    ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)  # [1, T]
    t = time.perf_counter()
    out = model.generate(ids, output_logits=True, return_dict_in_generate=True,
                         **_generate_kwargs(stop_ids, max_new_tokens))
    wall = time.perf_counter() - t
    margins = []
    for step_logits in out.logits:  # each [1, V]
        top2 = step_logits[0].float().topk(2).values
        margins.append(float(top2[0] - top2[1]))
    return Reference(output_ids=out.sequences[0, len(prompt_ids):].tolist(), margins=margins,
                     wall_s=wall)


def first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first token where two outputs differ (one ending first counts), or None."""
    if a == b:
        return None
    n = min(len(a), len(b))
    return next((i for i in range(n) if a[i] != b[i]), n)


def compare(output_ids: list[int], reference: Reference) -> AuditResult:
    """Audit `output_ids` token for token against `reference`."""
    ref = reference.output_ids
    i = first_difference(output_ids, ref)
    if i is None:
        return AuditResult(lossless=True)
    return AuditResult(
        lossless=False, divergence=i,
        expected=ref[i] if i < len(ref) else None,
        got=output_ids[i] if i < len(output_ids) else None,
        margin=reference.margins[i] if i < len(reference.margins) else None)


@dataclass
class Differences:
    """How far a lossy (FLy) output is from the greedy output of the same prompt."""

    tokens: int
    """Positions whose token differs, plus the difference in length (0: identical)."""
    first: int | None
    """The first differing position (None: identical)."""


def differences(output_ids: list[int], reference_ids: list[int]) -> Differences:
    """Count the committed tokens of a lossy output that differ from greedy decoding, position by position."""
    n = min(len(output_ids), len(reference_ids))
    differ = [i for i in range(n) if output_ids[i] != reference_ids[i]]
    extra = abs(len(output_ids) - len(reference_ids))
    first = differ[0] if differ else (n if extra else None)
    return Differences(tokens=len(differ) + extra, first=first)


@dataclass
class HFLookupResult:
    """Output and counts of transformers' own prompt lookup decoding."""

    output_ids: list[int]
    forwards: int
    """Model forward calls made by `generate` (its first call also consumes the prompt)."""
    wall_s: float


@torch.inference_mode()
def hf_prompt_lookup(model, prompt_ids: list[int], max_new_tokens: int, stop_ids: frozenset[int],
                     num_tokens: int = 10, max_ngram: int = 2) -> HFLookupResult:
    """Run `generate(prompt_lookup_num_tokens=num_tokens)` and count its forward calls."""
    calls = 0

    def count(_module, _args, _kwargs):
        nonlocal calls
        calls += 1

    handle = model.register_forward_pre_hook(count, with_kwargs=True)
    try:
        ids = torch.tensor([prompt_ids], device=next(model.parameters()).device)  # [1, T]
        t = time.perf_counter()
        out = model.generate(ids, prompt_lookup_num_tokens=num_tokens,
                             max_matching_ngram_size=max_ngram,
                             **_generate_kwargs(stop_ids, max_new_tokens))
        wall = time.perf_counter() - t
    finally:
        handle.remove()
    return HFLookupResult(output_ids=out[0, len(prompt_ids):].tolist(), forwards=calls, wall_s=wall)
