"""Linear layers that read a GGUF file's own blocks (4 to 8 bits a weight) instead of their float32 copy.

A GGUF model is loaded as the float32 weights transformers de-quantizes from it; a one-token
forward on a CPU is bound by reading those weights (SmolLM2-135M: 425 MB of float32 in its
decoder; Qwen2.5-Coder-0.5B: 1.4 GB). The file holds the same layers as blocks (SmolLM2: Q4_1,
66 MB; Qwen2.5-Coder-0.5B: Q5_0 attention and gated-MLP projections, Q4_K / Q6_K down
projections, Q8_0 value projections), and each float32 weight is exactly fl(d * q + m) of its
block (oilbird/gguf_blocks.py). `BlockLinear` multiplies from those blocks, rebuilding each
weight in registers and summing in the float32 kernel's order (csrc/q4_gemm.cpp), so its output
is the float32 kernel's bit for bit: the model computes what it computed before, token for
token, from a fraction of the bytes (Q4_1 and Q5_0 0.6-0.75 bytes a weight; the byte plane the
K-quants and Q8_0 run on, 1.5).

The contract is checked, not assumed: `q4_layers` de-quantizes every block and compares it with
the loaded layer's float32 weight, bit for bit (finding the row order the loader used: it
permutes the query and key rows for rotary embeddings); a layer that differs in any bit, or is
of a type not read here, keeps the float32 kernel. Forwards of more than `max_rows` rows use the
float32 kernel too (`ForwardConfig.q4_rows`; the blocks were faster or level at every size
measured on two Zen 4 cores: docs/RESULTS.md, issue 15, stop 43).

Three kernels read the blocks (`ForwardConfig.block_kernel`): 'fma' (csrc/q4_gemm.cpp) rebuilds
each float32 weight and gives the float32 kernel's bits; 'int8' (csrc/amx_blocks.cpp; CPUs with
AMX and AVX512-VNNI) splits each group of inputs into four int8 parts whose products with q are
exact integer sums, on AMX tiles for many rows and VNNI dot products for one; 'bf16'
(csrc/amx_bf16_blocks.cpp; CPUs with AMX-BF16) writes each input as three bfloat16 parts whose sum
is the input exactly and multiplies them by q - c on AMX bfloat16 tiles, one float32 sum per
group. The last two give other last bits than the float32 kernel's (another rounding, like
oneDNN's), but the same bits for a row at any row count, so a tree forward still gives each node
a one-token step's bits.

Prefills may run another of them (`ForwardConfig.prefill_kernel`): a model's block layers share a
`PrefillSwitch` that the verifier turns on around its prefills. A prefill computes only the
prompt's positions, which every method (and `ar`) prefills alike. Steps and tree forwards keep
the step's kernel, except forwards of `ForwardConfig.wide_rows` rows or more, which the switch
sends to the prefill kernel too, where its tiles cost less: their rows are another rounding of
the same model, which the audit against `generate()` checks.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from pathlib import Path

import torch

from oilbird.gguf_blocks import BLOCK_READERS, dequantize
from oilbird.skinny_gemm import SkinnyLinear, kernels

BLOCK_KERNELS = ("fma", "int8", "bf16")
"""The kernels that read blocks: 'fma' (the float32 kernel's bits), 'int8' (AMX tiles and VNNI),
'bf16' (AMX bfloat16 tiles, each input in three exact parts)."""
INT8_DOT_ROWS = 1
"""Forwards of at most this many rows take the 'int8' kernel's VNNI dot products, larger ones its
tiles (the same bits): one row 24.9 us against the tiles' 34.6, two rows 49.2 against 44.1, on a
1536 x 576 Q4_1 layer, one Xeon core (scripts/int8_blocks_ab.py; docs/runs/issue15/stop48)."""


def require_int8() -> None:
    """Raise ValueError, saying what to do, where the 'int8' block kernel cannot run here."""
    if not kernels() or not kernels().amx_available():
        raise ValueError("the 'int8' block kernel needs a CPU with AMX and AVX512-VNNI (Intel Xeon since Sapphire "
                         "Rapids) and an OS that grants AMX's tiles; use block_kernel='fma'")


def require_bf16_tiles() -> None:
    """Raise ValueError, saying what to do, where the 'bf16' block kernel cannot run here."""
    if not kernels() or not kernels().amx_bf16_available():
        raise ValueError("the 'bf16' block kernel needs a CPU with AMX-BF16 and AVX512_BF16 (Intel Xeon since "
                         "Sapphire Rapids) and an OS that grants AMX's tiles; use block_kernel='fma'")


def int8_center(q: torch.Tensor, d: torch.Tensor, m: torch.Tensor) -> int:
    """The c with m == -c d in every group (Q8_0: 128, Q6_K: 32), which the 'int8' kernel takes off
    q so its two sums do not cancel; 0 where there is none (Q4_K). Only for the byte plane."""
    for c in (128, 32):
        if torch.equal(m, -c * d):
            return c
    return 0

GGUF_NAMES = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
              "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
              "mlp.down_proj": "ffn_down"}
"""transformers' module name within a decoder layer -> llama.cpp's tensor name in `blk.<i>.`."""
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


class BlockLinear(torch.nn.Module):
    """A float32 linear layer computed from its GGUF blocks, bit-identical to `SkinnyLinear`.

    Forwards of up to `max_rows` rows read the blocks; more rows go to the wrapped
    `SkinnyLinear` (its float32 kernel). Both give the same bits.

    Args:
        dense: the layer on our float32 kernel, whose weight must be fl(d * q + m).
        q, d, m: its blocks in the layer's row order, as `oilbird.gguf_blocks` reads them: q [N, K]
            uint8; float16 d and m [N, K/32] run the 4-bit kernel (5-bit where q exceeds 15),
            float32 ones [N, K/16] the byte plane.
        max_rows: the most rows a forward reads the blocks for.
        block_type: the GGUF type the blocks came from (e.g. 'Q4_1'), for descriptions.
        kernel: one of `BLOCK_KERNELS`: 'fma' gives the float32 kernel's bits, 'int8' and 'bf16'
            their own (the same for a row at every row count).
        prefill_kernel: the kernel of forwards run while `switch` is on (prefills); None: `kernel`.
        switch: the model's `PrefillSwitch`, shared by its block layers; None: no prefill kernel.

    Raises:
        ValueError: if the blocks do not rebuild the layer's weight bit for bit, the shapes do not
            fit, or `kernel` cannot run here.
    """

    def __init__(self, dense: SkinnyLinear, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor,
                 max_rows: int, block_type: str = "Q4_1", kernel: str = "fma",
                 prefill_kernel: str | None = None, switch: "PrefillSwitch | None" = None) -> None:
        super().__init__()
        self.block_type = block_type
        self.dense = dense
        self.in_features, self.out_features = dense.in_features, dense.out_features
        self.weight, self.bias = dense.weight, dense.bias  # kept for code that reads them
        plane = d.dtype == torch.float32
        if self.out_features % 16 or self.in_features % (16 if plane else 32):
            raise ValueError(f"a block layer needs out_features % 16 == 0 and in_features % {16 if plane else 32} "
                             f"== 0, not {self.out_features}x{self.in_features}")
        if not torch.equal(dequantize(q, d, m), dense.weight.detach()):
            raise ValueError("the GGUF blocks do not rebuild this layer's float32 weight bit for bit")
        self.max_rows = max_rows
        q_max = int(q.max())  # one pass over the layer's q: the bit width and the kernels' checks read it
        self.bits = 8 if plane else 5 if q_max > 15 else 4
        # [N/16, K/32, 320 or 384] bytes (4- or 5-bit), or [N/16, K/16, 384] (the byte plane)
        packed = kernels().pack_q8(q, d, m) if plane else kernels().pack_q4(q, d, m, self.bits)
        self.register_buffer("packed_q4", packed, persistent=False)
        # The forward runs ~200 times per model forward: what it needs, looked up once here
        # (module attribute lookups and reshapes in Python cost as much as a small layer's GEMM).
        self._max_elements = max_rows * self.in_features
        # q's offset the 'int8' kernel takes off (its own for 4 and 5 bits: 8 and 16)
        self.center = int8_center(q, d, m) if plane else 16 if self.bits == 5 else 8
        self.kernel_name, self.kernel = kernel, _kernel_call(kernel, plane, self.center, q_max)
        self.prefill_kernel_name, self.switch = kernel, switch
        self._prefill = self.kernel
        # forwards of at least this many elements (switch.wide_rows rows) run the prefill kernel
        self._wide_elements = switch.wide_rows * self.in_features if switch and switch.wide_rows else math.inf
        if switch is not None and prefill_kernel not in (None, kernel):
            self.prefill_kernel_name = prefill_kernel
            self._prefill = _kernel_call(prefill_kernel, plane, self.center, q_max)
        self._bias = dense.packed_bias  # [out] float32 or None (out is a multiple of 16: no padding)

    def run(self, x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """The block kernel over `packed`: the prefill kernel while `switch` is on or for a forward
        of at least its `wide_rows` rows, else the step's."""
        if self.switch is not None and (self.switch.on or x.numel() >= self._wide_elements):
            return self._prefill(x, packed, bias)
        return self.kernel(x, packed, bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        if x.numel() > self._max_elements:  # more than max_rows rows
            return self.dense(x)
        return self.run(x, self.packed_q4, self._bias)  # [..., out]; the kernel reshapes

    def extra_repr(self) -> str:
        prefill = f", {self.prefill_kernel_name} for prefills" if self.prefill_kernel_name != self.kernel_name else ""
        return (f"{self.block_type} blocks ({self.bits} bits, {self.kernel_name} kernel{prefill}) "
                f"up to {self.max_rows} rows")


class PrefillSwitch:
    """Which forwards of one model run the prefill kernel, for its `BlockLinear`s that have one.

    Two kinds do: prefills, which the verifier marks by turning the switch on around them
    (`prefilling`), and, where `wide_rows` > 0, every forward of at least `wide_rows` rows (a
    tree forward of that many nodes). A prefill computes the prompt's positions, and every
    method (and `ar`) prefills a prompt with the same kernel. A one-token step, and a tree of
    fewer than `wide_rows` nodes, run the step's kernel. A wide tree's rows thus carry the
    prefill kernel's last bits, not the step's: another rounding of the same float32 model
    (`ForwardConfig.wide_rows`), which the harness's audit against `generate()` checks as it
    checks every kernel. A model runs one forward at a time.

    Args:
        wide_rows: forwards of at least this many rows run the prefill kernel; 0: prefills only.
    """

    def __init__(self, wide_rows: int = 0) -> None:
        self.on = False
        self.wide_rows = wide_rows

    @contextmanager
    def prefilling(self):
        self.on = True
        try:
            yield
        finally:
            self.on = False


def prefill_switch(model: torch.nn.Module) -> PrefillSwitch | None:
    """The switch `q4_layers` gave `model`'s block layers, or None when prefills run the step's kernel."""
    return next((m.switch for m in model.modules() if isinstance(m, BlockLinear) and m.switch is not None), None)


def _kernel_call(kernel: str, plane: bool, center: int, q_max: int):
    """(x, packed, bias) -> y on block kernel `kernel` for blocks of this plane and offset.

    Raises:
        ValueError: if `kernel` is unknown or cannot run here or on these blocks.
    """
    if kernel not in BLOCK_KERNELS:
        raise ValueError(f"block kernel must be one of {', '.join(BLOCK_KERNELS)}, got {kernel!r}")
    if kernel == "int8":
        if q_max - center > 127:  # the tiles read q - c as a signed byte
            raise ValueError(f"the 'int8' block kernel needs q - {center} in a signed byte; these blocks reach {q_max}")
        require_int8()
        amx = kernels().linear_amx
        return lambda x, packed, bias: amx(x, packed, bias, plane, center, INT8_DOT_ROWS)
    if kernel == "bf16":
        require_bf16_tiles()
        bf16 = kernels().linear_amx_bf16
        return lambda x, packed, bias: bf16(x, packed, bias, plane, center)
    return kernels().linear_q8 if plane else kernels().linear_q4


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


def block_layer(module: torch.nn.Module, tensor: tuple[str, object] | None, max_rows: int,
                kernel: str = "fma", prefill_kernel: str | None = None,
                switch: PrefillSwitch | None = None) -> BlockLinear | str:
    """`module` on the GGUF blocks `tensor` (type name, raw data), or why it keeps the float32 kernel."""
    if not isinstance(module, SkinnyLinear):
        return f"it runs {type(module).__name__}, not our float32 kernel"
    if tensor is None or tensor[0] not in BLOCK_READERS:
        return f"{tensor[0]} in the GGUF, a type not read here" if tensor is not None else "not in the GGUF"
    try:
        q, d, m = BLOCK_READERS[tensor[0]](tensor[1])
        order = row_order(module.weight.detach(), dequantize(q, d, m))
        if order is None:
            return "its float32 weight is not fl(d * q + m) of the GGUF's blocks"
        return BlockLinear(module, q[order], d[order], m[order], max_rows, tensor[0], kernel, prefill_kernel, switch)
    except ValueError as err:
        return str(err)


def q4_layers(model: torch.nn.Module, gguf: GGUFTensors, max_rows: int, kernel: str = "fma",
              prefill_kernel: str | None = None, wide_rows: int = 0) -> dict[str, str]:
    """Swap `model`'s decoder linear layers and LM head for `BlockLinear` where its GGUF holds them
    in a block type of `oilbird.gguf_blocks.BLOCK_READERS`.

    The head is the file's `output.weight`, or its token embeddings where the two are tied
    (SmolLM2; both presets store them as Q8_0): its float32 logits, the same bits as the float32
    kernel's, from 1.5 bytes a weight.

    Args:
        model: a float32 causal LM loaded from `gguf` whose linear layers run `SkinnyLinear`
            (`oilbird.kernels.tree_model`), changed in place.
        gguf: the tensors of the GGUF file the model was converted from.
        max_rows: `BlockLinear.max_rows`.
        kernel: `BlockLinear`'s kernel, one of `BLOCK_KERNELS`.
        prefill_kernel: the kernel of prefills (`PrefillSwitch`), one of `BLOCK_KERNELS`; None
            or `kernel`: the same as the steps'.
        wide_rows: forwards of at least this many rows run `prefill_kernel` too (`PrefillSwitch`); 0: none.

    Returns:
        module name -> why it kept the float32 kernel, for every such layer not swapped (empty
        when all were).

    Raises:
        ValueError: if the kernels cannot run the blocks here (no AVX-512 build; 'int8' without AMX).
    """
    if not kernels() or not kernels().q4_available():
        raise ValueError("the GEMM over GGUF blocks needs our kernels built for AVX-512")
    for choice in {kernel, prefill_kernel or kernel}:
        if choice == "int8":
            require_int8()
        if choice == "bf16":
            require_bf16_tiles()
    switch = PrefillSwitch(wide_rows) if prefill_kernel not in (None, kernel) else None
    kept = {}
    for i, layer in enumerate(model.model.layers):
        for name, gguf_name in GGUF_NAMES.items():
            swapped = block_layer(layer.get_submodule(name), gguf.get(f"blk.{i}.{gguf_name}.weight"), max_rows, kernel,
                                  prefill_kernel, switch)
            if isinstance(swapped, str):
                kept[f"model.layers.{i}.{name}"] = swapped
            else:
                layer.set_submodule(name, swapped)
    head = gguf.get("output.weight") or gguf.get("token_embd.weight")
    swapped = block_layer(model.get_output_embeddings(), head, max_rows, kernel, prefill_kernel, switch)
    if isinstance(swapped, str):
        kept["lm_head"] = swapped
    else:
        model.set_output_embeddings(swapped)
    return kept
