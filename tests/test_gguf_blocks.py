"""GGUF blocks read into (q, d, m): llama.cpp's byte layouts, checked against gguf-py's own
de-quantizer (what transformers' loader runs) bit for bit, for every block type read."""

import numpy as np
import pytest
import torch

from oilbird.gguf_blocks import BLOCK_BYTES, BLOCK_READERS, dequantize, q4_k_scales, read_q4_1, read_q5_0


def random_raw(kind: str, rows: int, k: int, seed: int) -> np.ndarray:
    """Random bytes of `rows` x `k` weights of type `kind`, with finite positive float16 scales."""
    rng = np.random.default_rng(seed)
    per = 256 if kind.endswith("_K") else 32
    raw = rng.integers(0, 256, (rows, k // per, BLOCK_BYTES[kind]), dtype=np.uint8)
    for at in {"Q4_K": (0, 2), "Q6_K": (208,), "Q8_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,)}[kind]:
        scale = rng.uniform(0.0005, 0.01, (rows, k // per)).astype(np.float16)
        raw[:, :, at:at + 2] = scale.view(np.uint8).reshape(rows, k // per, 2)
    return raw.reshape(rows, -1)


def test_q4_1_blocks_are_read_in_llama_cpp_layout():
    # One row of two blocks: d, m float16, then byte j = input j (low nibble) | input j + 16 (high).
    d, m = np.float16(0.5), np.float16(-1.0)
    nibbles = np.array([(j % 16) | (((15 - j) % 16) << 4) for j in range(16)], dtype=np.uint8)
    block = np.concatenate([np.array([d, m], dtype=np.float16).view(np.uint8), nibbles])
    raw = np.concatenate([block, block])[None, :]  # [1, 40]
    q, dd, mm = read_q4_1(raw)
    assert q.shape == (1, 64) and dd.shape == mm.shape == (1, 2)
    assert q[0, :16].tolist() == list(range(16)) and q[0, 16:32].tolist() == [15 - j for j in range(16)]
    assert dequantize(q, dd, mm)[0, 3].item() == 0.5 * 3 - 1.0


def test_q5_0_blocks_are_read_in_llama_cpp_layout():
    # d, a word of fifth bits (bit j: input j), then byte j = input j (low nibble) | input j + 16 (high).
    q = [(7 * j + 3) % 32 for j in range(32)]
    fifth = sum((v >> 4) << j for j, v in enumerate(q))
    nibbles = np.array([(q[j] & 15) | ((q[j + 16] & 15) << 4) for j in range(16)], dtype=np.uint8)
    block = np.concatenate([np.array([0.25], dtype=np.float16).view(np.uint8),
                            np.array([fifth], dtype=np.uint32).view(np.uint8), nibbles])
    qq, d, m = read_q5_0(block[None, :])  # [1, 22]
    assert qq[0].tolist() == q and d.item() == 0.25 and m.item() == -4.0
    assert dequantize(qq, d, m)[0].tolist() == [0.25 * (v - 16) for v in q]


def test_q4_k_scales_unpack_six_bit_fields():
    # Scales 0-3 and minimums 0-3 in bytes 0-7's low 6 bits; 4-7 from bytes 8-11's nibbles plus
    # the top 2 bits of bytes 0-3 (scales) and 4-7 (minimums).
    scales, minimums = [5, 17, 33, 63, 1, 40, 62, 16], [0, 9, 63, 20, 48, 3, 31, 58]
    packed = np.zeros(12, dtype=np.uint8)
    for j in range(4):
        packed[j] = scales[j] | ((scales[4 + j] >> 4) << 6)
        packed[4 + j] = minimums[j] | ((minimums[4 + j] >> 4) << 6)
        packed[8 + j] = (scales[4 + j] & 15) | ((minimums[4 + j] & 15) << 4)
    sc, mn = q4_k_scales(packed)
    assert sc.tolist() == scales and mn.tolist() == minimums


@pytest.mark.parametrize("kind", sorted(BLOCK_READERS))
def test_every_reader_rebuilds_gguf_pys_weights_bit_for_bit(kind):
    from gguf import GGMLQuantizationType, quants

    raw = random_raw(kind, 32, 512, 0)
    loaded = torch.from_numpy(quants.dequantize(raw, getattr(GGMLQuantizationType, kind)).astype(np.float32))
    q, d, m = BLOCK_READERS[kind](raw)
    assert q.shape == (32, 512) and q.dtype == torch.uint8
    assert d.shape == m.shape and d.dtype == (torch.float16 if kind in ("Q4_1", "Q5_0") else torch.float32)
    assert torch.equal(dequantize(q, d, m), loaded)
