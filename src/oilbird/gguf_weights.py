"""Linear layers that read a GGUF file's own 4- and 5-bit weights (Q4_1, Q5_0) instead of their float32 copy.

A GGUF model is loaded as the float32 weights transformers de-quantizes from it; a one-token
forward on a CPU is bound by reading those weights (SmolLM2-135M: 425 MB of float32 in its
decoder). Its GGUF holds the same decoder layers as Q4_1 blocks (66 MB: per 32 inputs of an
output a float16 scale d and minimum m, and 4-bit q), and each float32 weight is exactly
fl(d * q + m). `Q4Linear` multiplies from those blocks, rebuilding each weight in registers and
summing in the float32 kernel's order (csrc/q4_gemm.cpp), so its output is the float32 kernel's
bit for bit: the model computes what it computed before, token for token, from a sixth of the bytes.

The contract is checked, not assumed: `q4_layers` de-quantizes every block and compares it with
the loaded layer's float32 weight, bit for bit (finding the row order the loader used: it
permutes the query and key rows for rotary embeddings); a layer that differs in any bit, or is
not Q4_1 or Q5_0, keeps the float32 kernel. Forwards of more than `max_rows` rows use the float32 kernel
too (`ForwardConfig.q4_rows`; the blocks were faster or level at every size measured on two Zen 4
cores: docs/RESULTS.md, issue 15, stop 43).

Q5_0 blocks (Qwen2.5-Coder-0.5B's attention and gated-MLP projections) hold a float16 scale d and
5-bit q per 32 inputs; the loader makes fl(d * (q - 16)), an exact product, which is the same
number as fl(d * q + m) with m = -16 d (exact in float16), so they run on the same kernel with a
fifth bit per weight (24 of Qwen's 1.4 GB of float32 decoder weights per forward become 0.19 GB
of blocks). Other block types (Q8_0, the K-quants) keep the float32 kernel.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from oilbird.skinny_gemm import SkinnyLinear, kernels

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
"""transformers' module name within a decoder layer -> llama.cpp's tensor name in `blk.<i>.`."""
BLOCK_BYTES = {"Q4_1": 20, "Q5_0": 22}
"""Bytes of one block of 32 weights: Q4_1 d and m (float16), 16 bytes of 32 nibbles; Q5_0 d
(float16), 4 bytes of fifth bits, 16 bytes of nibbles."""


def read_q4_1(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q4_1 tensor's bytes [rows, blocks * 20] -> (q [rows, K] uint8, d, m [rows, K/32] float16).

    Within a block, byte j holds input j in its low nibble and input j + 16 in its high one (llama.cpp's layout).
    """
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, BLOCK_BYTES["Q4_1"])  # [rows, G, 20]
    d = torch.from_numpy(blocks[:, :, 0:2].copy().view(np.float16)[..., 0])  # [rows, G]
    m = torch.from_numpy(blocks[:, :, 2:4].copy().view(np.float16)[..., 0])
    nibbles = blocks[:, :, 4:]  # [rows, G, 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2).reshape(raw.shape[0], -1)  # [rows, K]
    return torch.from_numpy(np.ascontiguousarray(q)), d, m


def read_q5_0(raw: np.ndarray) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A GGUF Q5_0 tensor's bytes [rows, blocks * 22] -> (q [rows, K] uint8 0..31, d, m [rows, K/32] float16).

    Within a block (llama.cpp's layout): d, then a little-endian 32-bit word whose bit j is input
    j's fifth bit, then byte j holds input j's low four bits in its low nibble and input j + 16's
    in its high one. The weight is d * (q - 16): returned as m = -16 d (exact in float16), the
    form `dequantize` and the kernel share with Q4_1.

    Raises:
        ValueError: if some -16 d overflows float16 (no such block in any file seen).
    """
    blocks = np.ascontiguousarray(raw).reshape(raw.shape[0], -1, BLOCK_BYTES["Q5_0"])  # [rows, G, 22]
    d = torch.from_numpy(blocks[:, :, 0:2].copy().view(np.float16)[..., 0])  # [rows, G]
    fifth = blocks[:, :, 2:6].copy().view(np.uint32)  # [rows, G, 1]
    fifth = ((fifth >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)  # [rows, G, 32]
    nibbles = blocks[:, :, 6:]  # [rows, G, 16]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4], axis=2) | (fifth << 4)  # [rows, G, 32]
    m = (d.float() * -16).half()
    if not torch.isfinite(m).all():
        raise ValueError("a Q5_0 scale too large for m = -16 d in float16")
    return torch.from_numpy(np.ascontiguousarray(q.reshape(raw.shape[0], -1))), d, m


BLOCK_READERS = {"Q4_1": read_q4_1, "Q5_0": read_q5_0}
"""GGUF block type -> its reader (q, d, m); the block types `Q4Linear` runs."""


def dequantize(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """fl(d * q + m) in float32 [rows, K], as transformers' GGUF loader computes it (d * q is exact)."""
    return d.float().repeat_interleave(32, 1) * q.float() + m.float().repeat_interleave(32, 1)


def row_order(weight: torch.Tensor, rebuilt: torch.Tensor) -> torch.Tensor | None:
    """The permutation p with rebuilt[p] == weight bit for bit, or None when there is none.

    Args:
        weight: [N, K] the loaded layer's float32 weight.
        rebuilt: [N, K] the same layer de-quantized from its GGUF blocks, in the file's row order.
    """
    if torch.equal(weight, rebuilt):
        return torch.arange(weight.shape[0])
    where = {row.tobytes(): i for i, row in enumerate(rebuilt.view(torch.int32).numpy())}
    if len(where) != rebuilt.shape[0]:
        return None  # repeated rows: no unique order to recover
    order = [where.get(row.tobytes()) for row in weight.view(torch.int32).numpy()]
    return None if None in order else torch.tensor(order)


class Q4Linear(torch.nn.Module):
    """A float32 linear layer computed from its GGUF Q4_1 or Q5_0 blocks, bit-identical to `SkinnyLinear`.

    Forwards of up to `max_rows` rows read the blocks; more rows go to the wrapped
    `SkinnyLinear` (its float32 kernel). Both give the same bits.

    Args:
        dense: the layer on our float32 kernel, whose weight must be fl(d * q + m).
        q, d, m: its blocks in the layer's row order ([N, K] uint8, [N, K/32] float16 twice), as
            `read_q4_1` or `read_q5_0` give them: q above 15 packs a fifth bit per weight.
        max_rows: the most rows a forward reads the blocks for.
        block_type: the GGUF type the blocks came from ('Q4_1' or 'Q5_0'), for descriptions.

    Raises:
        ValueError: if the blocks do not rebuild the layer's weight bit for bit, or the shapes do not fit.
    """

    def __init__(self, dense: SkinnyLinear, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                 max_rows: int, block_type: str = "Q4_1") -> None:
        super().__init__()
        self.block_type = block_type
        self.dense = dense
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.weight, self.bias = dense.weight, dense.bias  # kept for code that reads them
        if self.out_features % 16 or self.in_features % 32:
            raise ValueError(f"a block layer needs out_features % 16 == 0 and in_features % 32 == 0, "
                             f"not {self.out_features}x{self.in_features}")
        if not torch.equal(dequantize(q, d, m), dense.weight.detach()):
            raise ValueError("the GGUF blocks do not rebuild this layer's float32 weight bit for bit")
        self.max_rows = max_rows
        self.bits = 5 if int(q.max()) > 15 else 4
        packed = kernels().pack_q4(q, d, m, self.bits)  # [N/16, K/32, 320 or 384] bytes
        self.register_buffer("packed_q4", packed, persistent=False)
        # The forward runs ~200 times per model forward: what it needs, looked up once here
        # (module attribute lookups and reshapes in Python cost as much as a small layer's GEMM).
        self._max_elements = max_rows * self.in_features
        self._linear_q4 = kernels().linear_q4
        self._bias = dense.packed_bias  # [out] float32 or None (out is a multiple of 16: no padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.numel() > self._max_elements:  # more than max_rows rows
            return self.dense(x)
        return self._linear_q4(x, self.packed_q4, self._bias)  # [..., out]; the kernel reshapes

    def extra_repr(self) -> str:
        return f"{self.block_type} blocks ({self.bits} bits) up to {self.max_rows} rows"


class GGUFTensors:
    """A GGUF file's tensors by name, read on first use and kept: (type name, raw blocks) each.

    The reader parses the whole file's metadata (SmolLM2's vocabulary: ~3 s), so a model reads
    it once however many kernel sets it builds (`LoadedModel` holds one). The blocks are views of
    the memory-mapped file, not copies.

    Args:
        path: the GGUF file.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._tensors: dict[str, tuple[str, np.ndarray]] | None = None

    def get(self, name: str) -> tuple[str, np.ndarray] | None:
        """(type name, e.g. 'Q4_1'; raw data) of tensor `name`, or None when the file has none."""
        if self._tensors is None:
            from gguf import GGUFReader

            self._tensors = {t.name: (t.tensor_type.name, t.data) for t in GGUFReader(str(self.path)).tensors}
        return self._tensors.get(name)


def q4_layers(model: torch.nn.Module, gguf: GGUFTensors, max_rows: int) -> dict[str, str]:
    """Swap `model`'s decoder linear layers for `Q4Linear` where its GGUF holds them as Q4_1 or Q5_0.

    Args:
        model: a float32 causal LM loaded from `gguf` whose linear layers run `SkinnyLinear`
            (`oilbird.kernels.tree_model`), changed in place.
        gguf: the tensors of the GGUF file the model was converted from.
        max_rows: `Q4Linear.max_rows`.

    Returns:
        module name -> why it kept the float32 kernel, for every decoder linear layer not swapped
        (empty when all were).

    Raises:
        ValueError: if the kernels cannot run the blocks here (no AVX-512 build).
    """
    if not kernels() or not kernels().q4_available():
        raise ValueError("the Q4_1 / Q5_0 GEMM needs our kernels built for AVX-512")
    kept = {}
    for i, layer in enumerate(model.model.layers):
        for name, gguf_name in GGUF_NAMES.items():
            where = f"model.layers.{i}.{name}"
            module = layer.get_submodule(name)
            if not isinstance(module, SkinnyLinear):
                kept[where] = f"it runs {type(module).__name__}, not our float32 kernel"
                continue
            tensor = gguf.get(f"blk.{i}.{gguf_name}.weight")
            if tensor is None or tensor[0] not in BLOCK_READERS:
                kept[where] = f"{tensor[0]} in the GGUF, not Q4_1 or Q5_0" if tensor is not None else "not in the GGUF"
                continue
            try:
                q, d, m = BLOCK_READERS[tensor[0]](tensor[1])
            except ValueError as err:
                kept[where] = str(err)
                continue
            order = row_order(module.weight.detach(), dequantize(q, d, m))
            if order is None:
                kept[where] = "its float32 weight is not fl(d * q + m) of the GGUF's blocks"
                continue
            try:
                layer.set_submodule(name, Q4Linear(module, q[order], d[order], m[order], max_rows, tensor[0]))
            except ValueError as err:
                kept[where] = str(err)
    return kept
