"""What a verification forward's LM head yields: top-k and argmax of the model's own logits
(`top_k_and_argmax`), or of greedy verification's certified head (`CertifiedHead`), whose bfloat16
copy streams half the bytes while its argmax stays float32's.

A one-token forward of a small model is bound by reading its weights, and the LM head is a large
share of them (SmolLM2-135M: 28M of 135M parameters; Qwen2.5-0.5B: 136M of 494M). Greedy
verification needs only each row's argmax. `CertifiedHead` computes the logits from a bfloat16
copy of the head's weight (our skinny kernel widens it to float32 in registers: every product
and sum is float32, only the weight is rounded) and then recovers the float32 argmax exactly:

    |u~[v] - u[v]| <= c * ||h|| * ||w[v]||    for every token v of a row with hidden state h,

where u~ are the bfloat16-weight logits and u = h . w[v] the exact ones. Rounding w to bfloat16
moves each weight by at most 2^-8 of itself, so the sum moves by at most 2^-8 * sum_i |h_i w_vi|
<= 2^-8 ||h|| ||w_v|| (Cauchy-Schwarz); a float32 sum of d products adds at most gamma_d = d 2^-24
/ (1 - d 2^-24) of the same quantity, paid once by the bfloat16 path, once by any float32
evaluation the result must agree with, and once by the recomputation below. Hence
c = 1.01 * (2^-8 + 4 gamma_d), the 1% covering the rounding of the norms and of the bound itself.
A token whose upper bound falls below the row's best lower bound cannot be the float32 argmax;
the few that remain (one in most rows; measured: docs/RESULTS.md) are computed again from the
float32 weight, and the largest wins, the lowest id among exact ties (csrc/certified_argmax.cpp).
Verification stays token-identical to float32 greedy decoding; the audit checks it as always.

The top-k the verifier hands to drafters comes from the bfloat16-weight logits: draft material,
never what is verified. Sampling and FLy's loose rule need whole float32 distributions and run
the model's own head.

It applies to float32 models on a CPU where our kernels build, whose head is a plain linear
layer without bias of a model type whose forward applies it unchanged (`SUPPORTED_MODEL_TYPES`:
no logit scaling or soft-capping); `certified_head_unavailable` says why not elsewhere.
"""

from __future__ import annotations

import torch

from oilbird.skinny_gemm import kernels, skinny_available
from oilbird.skinny_gemm import topk as fast_topk

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""Model types whose causal-LM forward is `lm_head(final_norm(decoder(...)))`, nothing after."""
BLOCK = 16
"""The skinny kernel packs outputs in blocks of 16 (the head's rows are padded to a multiple)."""


def error_coefficient(hidden_size: int) -> float:
    """c of the module docstring's bound for rows of `hidden_size` products."""
    gamma = hidden_size * 2.0 ** -24 / (1 - hidden_size * 2.0 ** -24)
    return 1.01 * (2.0 ** -8 + 4 * gamma)


def certified_head_unavailable(model: torch.nn.Module) -> str | None:
    """Why `CertifiedHead` cannot serve `model`'s greedy verification, or None when it can."""
    config = model.config
    head = model.get_output_embeddings()
    weight = getattr(head, "weight", None)
    if getattr(config, "model_type", None) not in SUPPORTED_MODEL_TYPES:
        return (f"model type {getattr(config, 'model_type', None)!r} is not one known to apply its LM head "
                f"unchanged ({', '.join(SUPPORTED_MODEL_TYPES)})")
    if getattr(config, "final_logit_softcapping", None) or getattr(config, "logit_scale", None):
        return "the model scales or soft-caps its logits"
    if weight is None or weight.dim() != 2 or getattr(head, "bias", None) is not None:
        return "the LM head is not a linear layer without bias"
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return f"the LM head is {weight.dtype} on {weight.device.type}; the certified head is for float32 on a CPU"
    ok, why = skinny_available()
    return None if ok else why


class CertifiedHead:
    """The LM head of greedy verification from a bfloat16 copy, with float32 argmaxes.

    Args:
        head: the model's output embeddings (`nn.Linear` or our `SkinnyLinear`: anything with a
            float32 `.weight` [V, d] and no bias); its weight is shared, the bfloat16 copy (half
            its size) is the only new memory.

    Raises:
        ValueError: if the kernels are unavailable or the weight is not float32.
    """

    def __init__(self, head: torch.nn.Module) -> None:
        ok, why = skinny_available()
        if not ok:
            raise ValueError(f"the certified head needs our CPU kernels: {why}")
        weight = head.weight.detach()  # [V, d]
        if weight.dtype != torch.float32:
            raise ValueError(f"the certified head reads a float32 weight, not {weight.dtype}")
        self.vocab, self.hidden = weight.shape
        self.weight = weight.contiguous()  # [V, d] float32, the original (no copy when contiguous)
        padded = -self.vocab % BLOCK
        low = torch.cat([weight, weight.new_zeros(padded, self.hidden)]) if padded else weight
        self.packed = kernels().pack(low.to(torch.bfloat16))  # [V/16, d, 16] bfloat16
        # Row norms in float64, rounded up into float32, so the bound never shrinks by rounding.
        norms = weight.double().norm(dim=1)  # [V]
        self.norms = (norms * (1 + 2.0 ** -22)).float().contiguous()
        self.coefficient = error_coefficient(self.hidden)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, d] final hidden states -> [N, V] float32 logits from the bfloat16 weight (approximate)."""
        out = kernels().linear(hidden.float().contiguous(), self.packed, None)  # [N, V padded]
        return out[:, : self.vocab] if out.shape[1] != self.vocab else out

    def argmax(self, hidden: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The float32 argmax of each row.

        Args:
            hidden: [N, d] the final hidden states the logits came from.
            logits: [N, V] their `logits` (bfloat16-weight, float32 values).

        Returns:
            ([N] argmax ids, [N] how many tokens each row had to compute again in float32).
        """
        return kernels().certified_argmax(logits.contiguous(), hidden.float().contiguous(), self.weight,
                                          self.norms, self.coefficient)


def top_k_and_argmax(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Top-k ids and logits and the argmax of [N, V] logits, in one pass over the vocabulary.

    The argmax is the top-1 id, except in a row whose top two logits tie exactly: there a top-k
    may order the tied ids either way (`torch.topk` does; our kernel puts the lower id first), so
    that row takes `argmax` (the lowest tied id, as transformers' greedy decoding does).

    Returns:
        ([N, k] ids, [N, k] logits, [N] argmax).
    """
    values, ids = fast_topk(logits, min(max(k, 2), logits.shape[-1]))  # [N, max(k, 2)]
    argmax = ids[:, 0].clone()  # [N]
    if values.shape[-1] > 1:
        tied = (values[:, 0] == values[:, 1]).nonzero().flatten()
        if len(tied):
            argmax[tied] = logits[tied].argmax(dim=-1)
    return ids[:, :k], values[:, :k], argmax
