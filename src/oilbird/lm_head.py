"""What a verification forward's LM head yields: top-k and argmax of the model's own logits
(`top_k_and_argmax`), or of greedy verification's certified head (`CertifiedHead`), whose bfloat16
copy streams half the bytes while its top-k and argmax stay float32's.

A one-token forward of a small model is bound by reading its weights, and the LM head is a large
share of them (SmolLM2-135M: 28M of 135M parameters; Qwen2.5-0.5B: 136M of 494M). Verification
and the drafters need only each row's top-k (k = 10) and argmax. `CertifiedHead` computes the
logits from a bfloat16 copy of the head's weight (our skinny kernel widens it to float32 in
registers: every product and sum is float32, only the weight is rounded) and then recovers the
float32 top-k exactly, from a bound on the copy's error:

    |u~[v] - u[v]| <= c * ||h|| * ||w[v]||    for every token v of a row with hidden state h,

where u~ are the bfloat16-weight logits and u = h . w[v] the exact ones. Rounding w to bfloat16
moves each weight by at most 2^-8 of itself, so the sum moves by at most 2^-8 * sum_i |h_i w_vi|
<= 2^-8 ||h|| ||w_v|| (Cauchy-Schwarz); a float32 sum of d products adds at most gamma_d = d 2^-24
/ (1 - d 2^-24) of the same quantity, paid once by the bfloat16 path, once by any float32
evaluation the result must agree with, and once by the recomputation below. Hence
c = 1.01 * (2^-8 + 4 gamma_d), the 1% covering the rounding of the norms and of the bound itself.
On a CPU with AVX512_BF16 the logits come from bfloat16 dot products (csrc/bf16_dot_gemm.cpp:
twice the products per instruction of a float32 FMA), which round the hidden state to bfloat16
as well: the rounding term becomes (1 + 2^-8)^2 - 1; products stay exact and sums float32. (That
instruction also flushes values below 2^-126 to zero: an absolute error under d * 2^-126 per
logit, some thirty orders of magnitude below a logit's own float32 rounding.)
A token whose upper bound falls below the row's k-th best lower bound cannot be among the float32
top k; the few that remain are computed again from the float32 weight and their top k taken,
exact ties by the lower id (csrc/certified_topk.cpp; how many per row: scripts/certified_head.py,
docs/RESULTS.md). Verification stays token-identical to float32 greedy decoding, and drafters
read the same top-k as from the float32 head; the audit checks every output as always.

Sampling and FLy's loose rule need whole float32 distributions and run the model's own head.
`oilbird.int8_head` certifies the same way a head read from the GGUF's Q8_0 blocks on int8 dot
products (the inputs rounded to bytes); greedy verification takes it first where it applies.

It applies to float32 models on a CPU where our kernels build, whose head is a plain linear
layer without bias of a model type whose forward applies it unchanged (`SUPPORTED_MODEL_TYPES`:
no logit scaling or soft-capping); `certified_head_unavailable` says why not elsewhere.
"""

from __future__ import annotations

import torch

from oilbird.errors import ModelError
from oilbird.gguf_weights import BlockLinear
from oilbird.skinny_gemm import kernels, skinny_available
from oilbird.skinny_gemm import topk as fast_topk

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")
"""Model types whose causal-LM forward is `lm_head(final_norm(decoder(...)))`, nothing after."""
BLOCK = 16
"""The skinny kernel packs outputs in blocks of 16 (the head's rows are padded to a multiple)."""


def error_coefficient(hidden_size: int, rounded_inputs: bool = False) -> float:
    """c of the module docstring's bound for rows of `hidden_size` products (`rounded_inputs`:
    the hidden state is rounded to bfloat16 too, as the AVX512_BF16 kernel does)."""
    gamma = hidden_size * 2.0 ** -24 / (1 - hidden_size * 2.0 ** -24)
    rounding = (1 + 2.0 ** -8) ** 2 - 1 if rounded_inputs else 2.0 ** -8
    return 1.01 * (rounding + 4 * gamma)


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


def greedy_head(model: torch.nn.Module, want: str) -> str:
    """Which of 'certified' and 'model' greedy verification runs on `model` (the verifier asks
    `oilbird.int8_head.choose_head`, which takes 'int8' first where it applies, then this).

    Args:
        model: the verifier's model.
        want: `VerifierConfig.head`: 'model', 'certified', or 'auto' (the model's own where it
            reads the GGUF's blocks, `BlockLinear`: exact float32 logits from fewer bytes than the
            bfloat16 copy; whole forwards 4-8% faster at 1, 8 and 64 nodes, 1-2% slower at 16,
            docs/RESULTS.md, issue 15, stop 47; else certified where it applies).

    Raises:
        ModelError: if 'certified' is asked for where it cannot serve.
    """
    if want == "model" or (want == "auto" and isinstance(model.get_output_embeddings(), BlockLinear)):
        return "model"
    why = certified_head_unavailable(model)
    if why is not None and want == "certified":
        raise ModelError(f"the certified LM head cannot serve this model: {why}; use head='model'")
    return "model" if why is not None else "certified"


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
        # AVX512_BF16 dot products where the CPU has them (twice the products per instruction;
        # the hidden state is rounded too, which the coefficient covers), else bfloat16 weights
        # widened to float32 (csrc/skinny_kernels.h).
        self.dot = bool(kernels().bf16_dot_available())
        low = low.to(torch.bfloat16)
        self.packed = kernels().pack_pairs(low) if self.dot else kernels().pack(low)  # [V/16, d/2, 32] or [V/16, d, 16]
        # Row norms in float64, rounded up into float32, so the bound never shrinks by rounding.
        norms = weight.double().norm(dim=1)  # [V]
        self.norms = (norms * (1 + 2.0 ** -22)).float().contiguous()
        self.coefficient = error_coefficient(self.hidden, rounded_inputs=self.dot)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[N, d] final hidden states -> [N, V] float32 logits from the bfloat16 weight (approximate)."""
        rows = hidden.float().contiguous()  # [N, d]
        out = kernels().linear_pairs(rows, self.packed) if self.dot else kernels().linear(rows, self.packed, None)  # [N, V padded]
        return out[:, : self.vocab] if out.shape[1] != self.vocab else out

    def greedy(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """([N, V] bfloat16-weight logits, [N, k] float32 top-k logits, [N, k] their ids) of [N, d] rows."""
        logits = self.logits(hidden)  # [N, V]
        values, ids, _ = self.topk(hidden, logits, k)  # [N, k], float32's
        return logits, values, ids

    def topk(self, hidden: torch.Tensor, logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The float32 top-k of each row, values included.

        Args:
            hidden: [N, d] the final hidden states the logits came from.
            logits: [N, V] their `logits` (bfloat16-weight, float32 values).
            k: how many, 1 <= k <= V.

        Returns:
            ([N, k] float32 logits, [N, k] ids: descending, exact ties by the lower id; so
            ids[:, 0] is the argmax), and [N] how many tokens each row computed again in float32.
        """
        return kernels().certified_topk(logits.contiguous(), hidden.float().contiguous(), self.weight,
                                        self.norms, self.coefficient, k)


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
