"""Greedy verification's LM head on int8 dot products over the head's own Q8_0 blocks, with each
row's float32 top-k and argmax recovered exactly (`Int8Head`).

Why: past one row a tree forward's LM head is bound by arithmetic, not by reading it: the float32
kernel over the byte plane (`BlockLinear`, 1.5 bytes a weight) runs one FMA per weight and row.
Both presets store their heads as Q8_0 (a signed byte per weight, one scale per 32), so rounding
each row's inputs to bytes as well turns every group of 32 products into one exact int32 sum, 64
products per AVX512-VNNI instruction (csrc/int8_head.cpp): rows get four times cheaper, and one
row reads 1.125 bytes a weight instead of 1.5.

The rounded inputs make the logits approximate, with a bound per row n and token v:

    |u~[n, v] - h[n] . w[v]| <= ||w[v]|| * (||h[n] - h^[n]|| + gamma_{G+2} ||h^[n]||)

(h^ the rounded inputs, G the groups of 32; the kernel's header derives it). As in
`oilbird.lm_head.CertifiedHead`, a token whose upper bound falls below the row's k-th best lower
bound cannot be in the float32 top k; the rest are computed again in float32 from the float32
weight (csrc/certified_topk.cpp), whose own error gamma_d ||w[v]|| ||h[n]|| is added to the bound
twice (once for the recomputation, once for the float32 evaluation it stands for), all of it
times 1.01 for the rounding of the norms. So verification stays token-identical to float32
greedy decoding, and drafters read float32's top-k. The logits `greedy` returns are the
approximate ones: greedy decoding reads only the top-k.

Where the CPU has AMX-INT8, forwards of `tiles_from` rows or more sum the same int32 groups on
AMX tiles (csrc/int8_head.cpp): the same bits, less arithmetic per row (`VerifierConfig.head_tiles`).
"""

from __future__ import annotations

import torch

from oilbird.errors import ModelError
from oilbird.gguf_weights import BlockLinear
from oilbird.lm_head import CertifiedHead, certified_head_unavailable, greedy_head
from oilbird.skinny_gemm import kernels

GROUP = 32
"""Inputs per Q8_0 block: one scale each."""


def q8_0_blocks(head: BlockLinear) -> tuple[torch.Tensor, torch.Tensor]:
    """The Q8_0 blocks of a head read from them, from its byte plane (no second copy kept).

    Args:
        head: a `BlockLinear` over a byte plane (`block_type` 'Q8_0').

    Returns:
        (q + 128 [V, K] uint8, d [V, K/32] float32): w = d * (q + 128 - 128).

    Raises:
        ValueError: if the plane is not Q8_0's (m = -128 d, one d per 32 inputs).
    """
    if head.block_type != "Q8_0" or head.bits != 8:
        raise ValueError(f"the int8 head reads Q8_0 blocks, not {head.block_type}")
    packed = head.packed_q4  # [V/16, K/16, 384]: 16 d and 16 m (float32), then [16 inputs][16 outputs] bytes
    blocks, groups = packed.shape[:2]
    scales = packed[..., :128].contiguous().view(torch.float32)  # [V/16, K/16, 32]
    d16 = scales[..., :16].permute(0, 2, 1).reshape(blocks * 16, groups)  # [V, K/16]
    m16 = scales[..., 16:].permute(0, 2, 1).reshape(blocks * 16, groups)  # [V, K/16]
    q = packed[..., 128:].reshape(blocks, groups, 16, 16).permute(0, 3, 1, 2).reshape(blocks * 16, groups * 16)
    if not torch.equal(m16, -128 * d16) or not torch.equal(d16[:, 0::2], d16[:, 1::2]):
        raise ValueError("the head's byte plane is not Q8_0's (m = -128 d, one d per 32 inputs)")
    return q.contiguous(), d16[:, 0::2].contiguous()


def int8_head_unavailable(model: torch.nn.Module) -> str | None:
    """Why `Int8Head` cannot serve `model`'s greedy verification, or None when it can."""
    why = certified_head_unavailable(model)
    if why is not None:
        return why
    head = model.get_output_embeddings()
    if not isinstance(head, BlockLinear) or head.block_type != "Q8_0":
        return "the LM head is not read from Q8_0 blocks (a GGUF model with q4 layers on)"
    if not kernels().int8_head_available():
        return "the CPU lacks AVX512-VNNI byte dot products"
    if head.in_features % GROUP:
        return f"the head's {head.in_features} inputs are not a multiple of {GROUP}"
    return None


def choose_head(model: torch.nn.Module, want: str) -> str:
    """Which head greedy verification runs on `model`: 'int8', 'certified' or 'model'.

    Args:
        model: the verifier's model.
        want: `VerifierConfig.head`: 'int8', 'certified', 'model', or 'auto' ('int8' where it
            applies, else as `oilbird.lm_head.greedy_head` decides).

    Raises:
        ModelError: if 'int8' or 'certified' is asked for where it cannot serve.
    """
    if want in ("int8", "auto"):
        why = int8_head_unavailable(model)
        if why is None:
            return "int8"
        if want == "int8":
            raise ModelError(f"the int8 LM head cannot serve this model: {why}; use head='auto'")
    return greedy_head(model, want)


def build_head(kind: str, model: torch.nn.Module, tiles_from: int = 0) -> "Int8Head | CertifiedHead":
    """The head object of `choose_head`'s 'int8' or 'certified' for `model` (`tiles_from`: `Int8Head`'s)."""
    head = model.get_output_embeddings()
    return Int8Head(head, tiles_from) if kind == "int8" else CertifiedHead(head)


def tiles_run() -> bool:
    """Whether the int8 head's AMX tiles path runs here (built with AMX-INT8, tiles granted)."""
    return bool(kernels()) and kernels().int8_head_tiles_available()


class Int8Head:
    """The LM head of greedy verification on int8 dot products, with float32 top-k and argmax.

    Args:
        head: the model's output embeddings read from Q8_0 blocks (`BlockLinear`); its float32
            weight (kept by the layer) is shared for the recomputation, the packed bytes (1.125
            a weight) are the only new memory.
        tiles_from: forwards of at least this many rows sum on AMX int8 tiles where they run
            (`tiles_run`), the others on VNNI dot products; the logits have the same bits either
            way. 0: never (`VerifierConfig.head_tiles`).

    Raises:
        ValueError: if the kernels cannot run here or the head is not Q8_0 blocks.
    """

    def __init__(self, head: BlockLinear, tiles_from: int = 0) -> None:
        if not kernels() or not kernels().int8_head_available():
            raise ValueError("the int8 head needs our kernels built with AVX512-VNNI")
        q, d = q8_0_blocks(head)
        self.packed = kernels().pack_int8_head(q, d)  # [V/16, K/32, 576] bytes
        weight = head.weight.detach()  # [V, K] float32 = d * (q - 128), exactly
        self.weight = weight.contiguous()
        self.vocab, self.hidden = weight.shape
        # Row norms in float64, rounded up into float32, so the bound never shrinks by rounding.
        self.norms = (weight.double().norm(dim=1) * (1 + 2.0 ** -22)).float().contiguous()  # [V]
        self.gamma = self.hidden * 2.0 ** -24 / (1 - self.hidden * 2.0 ** -24)
        self.candidates = 0
        """Tokens computed again in float32 over this head's life (the bound's tightness)."""
        self.tiles_from = tiles_from if tiles_from > 0 and tiles_run() else 0
        """Rows from which the logits are summed on AMX tiles; 0: never (not asked for, or no AMX here)."""

    def greedy(self, hidden: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Approximate logits and the float32 top-k of each row.

        Args:
            hidden: [N, d] final hidden states (after the final norm).
            k: how many, 1 <= k <= V.

        Returns:
            ([N, V] approximate logits, [N, k] float32 logits, [N, k] ids: descending, exact ties
            by the lower id, so ids[:, 0] is the argmax).
        """
        rows = hidden.float().contiguous()  # [N, d]
        kernel = "tiles" if self.tiles_from and len(rows) >= self.tiles_from else "vnni"
        logits, bracket = kernels().int8_head_logits(rows, self.packed, kernel)  # [N, V], [N]
        scale = (bracket + 2 * self.gamma * rows.double().norm(dim=1).float()) * 1.01  # [N]
        values, ids, count = kernels().certified_topk_rows(logits, rows, self.weight, self.norms,
                                                           scale.contiguous(), k)
        self.candidates += int(count.sum())
        return logits, values, ids
