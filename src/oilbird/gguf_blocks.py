"""GGUF weight blocks read into one form our kernels run: (q, d, m) with each weight fl(d * q + m).

llama.cpp stores a weight matrix row by row in blocks of 32 or 256 weights, each with its own
scales. transformers' loader de-quantizes every block type used here to float32 as one rounding
of an exact d' q' + m' (d', m' exact in float32, q' a small integer); the readers return the
q (uint8), d and m (per output and group of inputs) for which fl(d * q + m) is that same number:

| type | bytes per block | q | d, m | groups of inputs |
| --- | --- | --- | --- | --- |
| Q4_1 | 20 per 32 | 0..15 | float16 d, float16 minimum m | 32 |
| Q5_0 | 22 per 32 | 0..31 | float16 d, m = -16 d | 32 |
| Q4_K | 144 per 256 | 0..15 | float32 D = d sc, m = -dmin mn (6-bit sc, mn per 32) | 16 |
| Q6_K | 210 per 256 | 0..63 | float32 D = d sc (int8 sc per 16), m = -32 D | 16 |
| Q8_0 | 34 per 32 | q + 128 | float32 d, m = -128 d | 16 |

float16 (d, m) run on the 4-/5-bit kernel (`pack_q4`), float32 ones on the byte-plane kernel
(`pack_q8`, groups of 16, so the K-quants' 16- and 32-input scales both fit). Callers check the
result against the loaded float32 weight bit for bit (`oilbird.gguf_weights.q4_layers`): these
readers follow llama.cpp's layouts, the check proves them on every layer.
"""

from __future__ import annotations

import numpy as np
import torch

BLOCK_BYTES = {"Q4_1": 20, "Q5_0": 22, "Q4_K": 144, "Q6_K": 210, "Q8_0": 34}
"""Bytes of one block (32 weights, or 256 for the K-quants) of each type read here."""


def _blocks(raw: np.ndarray, kind: str) -> np.ndarray:
    """A tensor's bytes [rows, blocks * size] -> [rows, blocks, size]."""
    return np.ascontiguousarray(raw).reshape(raw.shape[0], -1, BLOCK_BYTES[kind])


def _f16(blocks: np.ndarray, at: int) -> np.ndarray:
    """The float16 at byte `at` of every block [rows, G] (as float16)."""
    return blocks[:, :, at:at + 2].copy().view(np.float16)[..., 0]


def _per_16(values: np.ndarray, per: int) -> torch.Tensor:
    """[rows, groups of `per` inputs] float32 -> [rows, K/16] (each value repeated per / 16 times)."""
    return torch.from_numpy(np.ascontiguousarray(np.repeat(values.astype(np.float32), per // 16, axis=1)))


def read_q4_1(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q4_1 tensor's bytes [rows, blocks * 20] -> (q [rows, K] uint8, d, m [rows, K/32] float16).

    Within a block, byte j holds input j in its low nibble and input j + 16 in its high one (llama.cpp's layout).
    """
    blocks = _blocks(raw, "Q4_1")  # [rows, G, 20]
    d, m = torch.from_numpy(_f16(blocks, 0)), torch.from_numpy(_f16(blocks, 2))  # [rows, G]
    nibbles = blocks[:, :, 4:]  # [rows, G, 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2).reshape(raw.shape[0], -1)  # [rows, K]
    return torch.from_numpy(np.ascontiguousarray(q)), d, m


def read_q5_0(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q5_0 tensor's bytes [rows, blocks * 22] -> (q [rows, K] uint8 0..31, d, m [rows, K/32] float16).

    Within a block (llama.cpp's layout): d, then a little-endian 32-bit word whose bit j is input
    j's fifth bit, then byte j holds input j's low four bits in its low nibble and input j + 16's
    in its high one. The weight is d * (q - 16): returned as m = -16 d (exact in float16).

    Raises:
        ValueError: if some -16 d overflows float16 (no such block in any file seen).
    """
    blocks = _blocks(raw, "Q5_0")  # [rows, G, 22]
    d = torch.from_numpy(_f16(blocks, 0))  # [rows, G]
    fifth = blocks[:, :, 2:6].copy().view(np.uint32)  # [rows, G, 1]
    fifth = ((fifth >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [rows, G, 32]
    nibbles = blocks[:, :, 6:]  # [rows, G, 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2) | (fifth << 4)  # [rows, G, 32]
    m = (d.float() * -16).half()
    if not torch.isfinite(m).all():
        raise ValueError("a Q5_0 scale too large for m = -16 d in float16")
    return torch.from_numpy(np.ascontiguousarray(q.reshape(raw.shape[0], -1))), d, m


def q4_k_scales(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K's 12 bytes of scales [..., 12] -> the 8 sub-blocks' 6-bit scales and minimums [..., 8] each.

    Bytes 0-3 hold scales 0-3 in their low 6 bits, bytes 4-7 minimums 0-3; bytes 8-11 hold the
    low 4 bits of scales 4-7 (low nibble) and minimums 4-7 (high nibble), whose top 2 bits are
    the top 2 bits of bytes 0-3 (scales) and 4-7 (minimums).
    """
    low, mid, top = packed[..., 0:4], packed[..., 4:8], packed[..., 8:12]
    scales = np.concatenate([low & 0x3F, (top & 0x0F) | ((low >> 6) << 4)], axis=-1)
    minimums = np.concatenate([mid & 0x3F, (top >> 4) | ((mid >> 6) << 4)], axis=-1)
    return scales, minimums


def read_q4_k(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q4_K tensor's bytes [rows, blocks * 144] -> (q [rows, K] uint8 0..15, d, m [rows, K/16] float32).

    A block of 256: d and dmin (float16), 12 bytes of 6-bit scales and minimums for its eight
    sub-blocks of 32 (`q4_k_scales`), 128 bytes of nibbles: chunk c of 32 bytes holds sub-block
    2c in its low nibbles and 2c + 1 in its high ones. The weight is fl(D q - M), D = d sc and
    M = dmin mn exact in float32, D q exact.
    """
    blocks = _blocks(raw, "Q4_K")  # [rows, G, 144]
    rows, groups = blocks.shape[:2]
    scales, minimums = q4_k_scales(blocks[:, :, 4:16])  # [rows, G, 8] each
    d = _f16(blocks, 0).astype(np.float32)[..., None] * scales.astype(np.float32)  # [rows, G, 8], exact
    m = -(_f16(blocks, 2).astype(np.float32)[..., None] * minimums.astype(np.float32))
    chunks = blocks[:, :, 16:].reshape(rows, groups, 4, 1, 32)  # [rows, G, chunk, 1, 32]
    q = np.concatenate([chunks & 0x0F, chunks >> 4], axis=3).reshape(rows, -1)  # [rows, K]
    return (torch.from_numpy(np.ascontiguousarray(q)), _per_16(d.reshape(rows, -1), 32),
            _per_16(m.reshape(rows, -1), 32))


def read_q6_k(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q6_K tensor's bytes [rows, blocks * 210] -> (q [rows, K] uint8 0..63, d, m [rows, K/16] float32).

    A block of 256 in two halves of 128: 128 bytes of low nibbles (half h's 64 bytes: weights
    128 h + t in the low nibble, 128 h + 64 + t in the high one), 64 bytes of top bits (half h's
    32 bytes: bits 2s..2s+1 of byte t are weight 128 h + 32 s + t's), 16 int8 scales (one per 16
    weights), then d (float16). The weight is D (q - 32), D = d sc exact, the product exact too.
    """
    blocks = _blocks(raw, "Q6_K")  # [rows, G, 210]
    rows, groups = blocks.shape[:2]
    low = blocks[:, :, :128].reshape(rows, groups, 2, 1, 64)
    low = np.concatenate([low & 0x0F, low >> 4], axis=3).reshape(rows, groups, 256)
    top = blocks[:, :, 128:192].reshape(rows, groups, 2, 1, 32) >> (2 * np.arange(4, dtype=np.uint8)).reshape(1, 1, 1, 4, 1)
    top = (top & 0x03).reshape(rows, groups, 256)
    q = (low | (top << 4)).reshape(rows, -1)  # [rows, K]
    scales = blocks[:, :, 192:208].copy().view(np.int8).astype(np.float32)  # [rows, G, 16]
    d = _f16(blocks, 208).astype(np.float32)[..., None] * scales  # [rows, G, 16], exact
    return (torch.from_numpy(np.ascontiguousarray(q)), _per_16(d.reshape(rows, -1), 16),
            _per_16(-32 * d.reshape(rows, -1), 16))


def read_q8_0(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q8_0 tensor's bytes [rows, blocks * 34] -> (q [rows, K] uint8, d, m [rows, K/16] float32).

    A block of 32: d (float16), 32 int8 q. The weight d q, stored as (q + 128) with m = -128 d.
    """
    blocks = _blocks(raw, "Q8_0")  # [rows, G, 34]
    q = (blocks[:, :, 2:].copy().view(np.int8).astype(np.int16) + 128).astype(np.uint8).reshape(raw.shape[0], -1)
    d = _f16(blocks, 0).astype(np.float32)  # [rows, G]
    return torch.from_numpy(np.ascontiguousarray(q)), _per_16(d, 32), _per_16(-128 * d, 32)


BLOCK_READERS = {"Q4_1": read_q4_1, "Q5_0": read_q5_0, "Q4_K": read_q4_k, "Q6_K": read_q6_k, "Q8_0": read_q8_0}
"""GGUF block type -> its reader (q, d, m); the block types our block kernels run."""


def dequantize(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """fl(d * q + m) in float32 [rows, K] (d * q is exact for every type read here), d and m
    [rows, groups] repeated over each group's K / groups inputs."""
    per = q.shape[1] // d.shape[1]
    return d.float().repeat_interleave(per, 1) * q.float() + m.float().repeat_interleave(per, 1)
