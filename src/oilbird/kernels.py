"""The model the verifier runs: the caller's transformers model with faster kernels, exactly.

A tree forward over N nodes should cost about what one token costs until the hardware becomes
compute-bound. On this project's CPU it did not, for two reasons in the software:

- **GEMM.** PyTorch's default fp32 linear (MKL) takes a fast matrix-vector path for one row but
  a general GEMM path for 2-64 rows that costs 2-6x as much, on the LM head above all (on AMD
  CPUs MKL does not pick its tuned kernels). oneDNN with weights pre-packed into its blocked
  layout (`PackedLinear`, the layout `torch.compile`'s CPU freezing also uses) is flat from 1 to 4
  rows and ~1.5x at 8, and faster than MKL even at one row; but its time at 8 rows is still about
  the weights' load time plus the arithmetic. Our skinny kernel (`SkinnyLinear`,
  oilbird/skinny_gemm.py; AVX-512 or AVX2, float32) streams each weight once with the few rows'
  FMAs hidden under the loads: 8 rows cost ~1.1x one row on AVX-512 (~1.3x on AVX2), and one
  row is faster than oneDNN's. The
  default where it builds; oneDNN where it cannot. Measured in `scripts/forward_cost.py`
  (docs/RESULTS.md); `gemm='default'` keeps PyTorch's linear.
- **bfloat16.** oneDNN's bfloat16 kernels change with the row count, and bfloat16 logits tie
  often, so a tree node and the one-token step over the same path broke ties differently:
  speculation changed half the outputs of our own greedy decoding (docs/RESULTS.md). On a CPU
  with AVX512_BF16 a bfloat16 model gets `PairsLinear` (our dot-product GEMM, each row's sums in
  one order whatever the rows beside it) and, like every model on AVX-512, one attention kernel at
  every row count (`oilbird.tree_attention.INVARIANT_KERNEL`): a node gets the bits of that step,
  and speculation leaves our greedy output unchanged.
- **Bytes.** A GGUF model is run as the float32 weights transformers de-quantizes from it, and a
  one-token forward is bound by reading them (SmolLM2: 425 MB in the decoder). Its file holds the
  decoder's layers as 4-bit Q4_1 blocks, of which every float32 weight is exactly fl(d * q + m):
  with `q4_rows` our kernel reads those blocks (66 MB) and rebuilds the weights in registers,
  with the float32 kernel's bits (oilbird/gguf_weights.py). Qwen2.5-Coder-0.5B's decoder is
  Q5_0, Q4_K, Q6_K and Q8_0 blocks, read the same way (5 bits a weight, or a byte plane).
- **Dispatch.** A one-token forward of a small model makes ~1,300 PyTorch calls, each a few
  microseconds: about as long as streaming its weights. With `fused`, each RMSNorm is one kernel
  call and each gated MLP's gate and up projections one GEMM (oilbird/fused_layers.py).
- **Attention.** transformers copies the cache per query group whenever a mask is given;
  `oilbird.tree_attention` attends over it in place, on our kernel where it builds (on AVX2
  CPUs large trees go to PyTorch's SDPA with grouped heads, faster there).

`tree_model(model, config)` returns a *copy* of the model's module tree that shares every weight
tensor with the original (no second copy of the weights; packed GEMM weights are the only new
memory) and has its `nn.Linear` layers swapped for `SkinnyLinear`, `PairsLinear` (bfloat16) or `PackedLinear`
(`BlockLinear` over GGUF blocks), its RMSNorms and MLPs for fused ones, and its attention set to
`SKINNY_ATTENTION` (or `TREE_ATTENTION`). The caller's model is left untouched:
the losslessness audit runs
transformers' `generate()` on it, an independent reference with PyTorch's default kernels.
Swapping layers on our own copy is how quantization backends plug into transformers; no
modeling file or class is changed.

Exactness: our kernels and oneDNN sum in a different order than MKL, so logits differ in the last
bits; a near-tie argmax can flip. The audit reports every divergence with its logit margin
(docs/RESULTS.md counts them).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

from oilbird.errors import ConfigError
from oilbird.fused_layers import FusedMLP, FusedRMSNorm, fuse_layers
from oilbird.gguf_weights import BLOCK_KERNELS, BlockLinear, GGUFTensors, q4_layers
from oilbird.skinny_gemm import PairsLinear, SkinnyLinear, bf16_dot_ready, kernels, skinny_available
from oilbird.tree_attention import SKINNY_ATTENTION, SKINNY_HEAD_DIMS, TREE_ATTENTION

GEMMS = ("auto", "skinny", "onednn", "default")


class KernelChoiceError(ConfigError, ValueError):
    """A `--gemm` or `--attention` this model's device or dtype cannot run (the CLI prints it as
    an error, not a traceback; a ValueError to Python callers)."""


ATTENTIONS = ("auto", "skinny", "tree", "sdpa")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ForwardConfig:
    """Where and how the verifier's forward runs: device, dtype and kernels."""

    device: str = "cpu"
    """Where the model runs: 'cpu', 'cuda' or 'cuda:N'."""
    dtype: str = "float32"
    """Weight and activation dtype: float32 (the reference precision on the CPU), bfloat16 or float16."""
    gemm: str = "auto"
    """Linear layers: 'skinny' (our kernels, oilbird/skinny_gemm.py: float32 on AVX-512/AVX2, bfloat16 on AVX512_BF16 dot products; CPU), 'onednn' (weights pre-packed for oneDNN; CPU, float32/bfloat16), 'default' (PyTorch's), or 'auto' (the first of these that runs here)."""
    q4_rows: int = 8192
    """The most rows a forward reads the decoder's linear weights for as the model's GGUF file holds them, its blocks (Q4_1, Q5_0, Q4_K, Q6_K, Q8_0), instead of their float32 copy (oilbird/gguf_weights.py): the same bits from a sixth (Q4_1) to a third (the byte plane) of the bytes; larger forwards use the float32 kernel. 8192 (every forward of the presets): on two Zen 4 cores the Q4_1 blocks took 0.56x the float32 time at one row, 0.75x at 16, level at 64-128 rows and 0.97x for an 800-token prefill (scripts/q4_ab.py, docs/RESULTS.md); Qwen2.5-Coder-0.5B's forwards on its blocks 0.55x at one row, 0.83x at 16 (two Xeon cores, scripts/forward_ab.py, docs/RESULTS.md, issue 15, stop 47). Float32 GGUF models on an AVX-512 CPU with gemm 'skinny'; elsewhere, and for layers stored otherwise, it changes nothing. 0: never."""
    block_kernel: str = "fma"
    """The kernel that reads the GGUF blocks (`q4_rows`): 'fma' rebuilds each float32 weight and gives the float32 kernel's bits (csrc/q4_gemm.cpp); 'int8' (CPUs with AMX and AVX512-VNNI: Intel Xeon since Sapphire Rapids) sums exact int8 parts of the inputs times q on AMX tiles or VNNI dot products (csrc/amx_blocks.cpp); 'bf16' (CPUs with AMX-BF16, the same Xeons) multiplies three exact bfloat16 parts of each input by q on AMX bfloat16 tiles (csrc/amx_bf16_blocks.cpp). 'int8' and 'bf16' give last bits of their own, the same for a row at every row count, so speculation stays token-identical to its own greedy decoding. It changes only layers `q4_rows` puts on blocks. On two Xeon cores, against 'fma': 'int8' 1.00-1.07x the time of SmolLM2's forwards of 1-64 nodes, 1.65x for a 512-token prefill (stop 48); 'bf16' 1.23x the time of SmolLM2's one-node forward, 0.85x for 16 nodes, 0.90x for the prefill: the flattest curve (t(16)/t(1) 1.69 against 2.45), but end to end Oilbird 1.01x and `ar` 0.87x its tokens/s on 'fma' (Qwen2.5-Coder-0.5B: 1.20x, 0.76x, 0.95x; Oilbird 1.01x, `ar` 0.89x; stop 49). 'fma' stays the default (scripts/forward_ab.py, docs/RESULTS.md, issue 15)."""
    prefill_kernel: str = "auto"
    """The block kernel of prefills (the prompt's positions; `PrefillSwitch` in oilbird/gguf_weights.py): 'same' (`block_kernel`'s), one of 'fma', 'int8', 'bf16', or 'auto' ('bf16' where AMX-BF16 runs, else 'same'). Steps and tree forwards keep `block_kernel` (except trees of `wide_rows` nodes or more, where that is set), and every method prefills a prompt alike; a prompt position's last bits are the prefill kernel's (a reused prefix keeps the bits it was computed with). On two Xeon cores 'bf16' prefilled prompts of 64-1024 tokens in 0.71-0.80x 'fma''s time (SmolLM2) and 0.82-0.90x (Qwen2.5-Coder-0.5B), and `ar`, `suffix` and Oilbird served API-Bank 1.06-1.10x faster, no output changed (scripts/forward_ab.py --b prefill_kernel=bf16; docs/RESULTS.md, issue 15, stop 50)."""
    wide_rows: int = 0
    """Forwards of at least this many rows (tree forwards of that many nodes) also run the prefill kernel, where `prefill_kernel` resolves to one other than `block_kernel`; smaller ones and one-token steps keep `block_kernel`. 0 (the default): prefills only. A wide tree's rows then carry the prefill kernel's last bits, not the one-token step's: another rounding of the same float32 model, which the harness's audit checks against `generate()` as it checks every kernel. On a Xeon with AMX the 'bf16' tiles cost 0.73-0.86x 'fma''s verification at 12-64 nodes on one thread and 0.83-0.99x at 16-32 on two, but end to end 8 served Oilbird 1.03x [1.02-1.04] its tokens/s on one thread (100 API-Bank requests) and 0.97x [0.96-0.99] on two (40 requests; 16: 0.99x), SuffixDecoding 1.01-1.02x: not the default (scripts/forward_ab.py --b wide_rows=8; docs/RESULTS.md, issue 15, stop 62)."""
    fused: bool = True
    """RMSNorm on one kernel call and a gated MLP's gate and up projections in one GEMM (oilbird/fused_layers.py), where the linear layers run our float32 kernels: the same model in fewer PyTorch calls (a one-token SmolLM2 forward makes ~1,300). The MLP's outputs are bit-identical; the norm's mean of squares is summed in float64, so its outputs differ from transformers' by an ulp now and then. False: transformers' own modules."""
    attention: str = "auto"
    """'skinny': tree attention on our kernel (CPU with AVX-512 or AVX2 and float32, or AVX512_BF16 and bfloat16; head_dim 64 or 128); 'tree': grouped-query attention over the cache in place by PyTorch's SDPA (oilbird/tree_attention.py); 'sdpa': transformers' SDPA, which copies the cache per query group under a tree mask; 'auto': skinny where it runs, else tree."""

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if not (self.device == "cpu" or self.device == "cuda" or self.device.startswith("cuda:")):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        if self.gemm not in GEMMS:
            raise ValueError(f"gemm must be one of {', '.join(GEMMS)}, got {self.gemm!r}")
        if self.q4_rows < 0:
            raise ValueError(f"q4_rows must be >= 0 (0: never), got {self.q4_rows}")
        if self.block_kernel not in BLOCK_KERNELS:
            raise ValueError(f"block_kernel must be one of {', '.join(BLOCK_KERNELS)}, got {self.block_kernel!r}")
        if self.prefill_kernel not in ("same", "auto", *BLOCK_KERNELS):
            raise ValueError(f"prefill_kernel must be 'same', 'auto' or one of {', '.join(BLOCK_KERNELS)}, "
                             f"got {self.prefill_kernel!r}")
        if self.wide_rows < 0:
            raise ValueError(f"wide_rows must be >= 0 (0: prefills only), got {self.wide_rows}")
        if self.attention not in ATTENTIONS:
            raise ValueError(f"attention must be one of {', '.join(ATTENTIONS)}, got {self.attention!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]


def onednn_available() -> bool:
    """True when this PyTorch build can pack linear weights for oneDNN."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def resolve_gemm(config: ForwardConfig, device: torch.device, dtype: torch.dtype) -> str:
    """The GEMM a model on `device` in `dtype` gets: 'skinny', 'onednn' or 'default'.

    'auto' takes the fastest that runs here, by the measurement in docs/RESULTS.md: the skinny
    kernel (a CPU with AVX-512 or AVX2 and float32, or AVX512_BF16 and bfloat16; a compiler), else
    oneDNN (a CPU, float32 or bfloat16), else PyTorch's.

    Raises:
        ValueError: if 'skinny' or 'onednn' is asked for where it cannot run, saying why.
    """
    onednn = device.type == "cpu" and dtype in (torch.float32, torch.bfloat16) and onednn_available()
    if config.gemm == "onednn" and not onednn:
        raise KernelChoiceError(f"gemm='onednn' needs a CPU model in float32 or bfloat16 and a PyTorch "
                         f"build with oneDNN; this model is {dtype} on {device.type}. "
                         "Use gemm='default' (or 'auto').")
    if config.gemm in ("skinny", "auto") and device.type == "cpu" and dtype in (torch.float32, torch.bfloat16):
        ok, why = skinny_available() if dtype == torch.float32 else bf16_dot_ready()
        if ok:
            return "skinny"
        if config.gemm == "skinny":
            raise KernelChoiceError(f"gemm='skinny' cannot run here: {why}. Use gemm='onednn' (or 'auto').")
    elif config.gemm == "skinny":
        raise KernelChoiceError(f"gemm='skinny' needs a CPU model in float32 or bfloat16; this model is {dtype} "
                         f"on {device.type}. Use gemm='auto'.")
    if config.gemm == "auto":
        return "onednn" if onednn else "default"
    return config.gemm


def resolve_attention(config: ForwardConfig, model: torch.nn.Module) -> str:
    """The attention `model` gets: 'skinny', 'tree' or 'sdpa'.

    'auto' takes our kernel where it runs (see oilbird/tree_attention.py).

    Raises:
        ValueError: if 'skinny' is asked for where it cannot run, saying why.
    """
    if config.attention not in ("auto", "skinny"):
        return config.attention
    param = next(model.parameters())
    cfg = model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    ok, why = skinny_available() if param.dtype != torch.bfloat16 else bf16_dot_ready()
    if param.device.type != "cpu" or param.dtype not in (torch.float32, torch.bfloat16):
        ok, why = False, f"the model is {param.dtype} on {param.device.type}, the kernel float32 or bfloat16 on a CPU"
    elif head_dim not in SKINNY_HEAD_DIMS:
        ok, why = False, f"head_dim {head_dim} is not one of {SKINNY_HEAD_DIMS}"
    if not ok and config.attention == "skinny":
        raise KernelChoiceError(f"attention='skinny' cannot run here: {why}. Use attention='tree' (or 'auto').")
    return "skinny" if ok else "tree"


class PackedLinear(torch.nn.Module):
    """`nn.Linear` computed by oneDNN from weights packed once into its blocked layout.

    Args:
        linear: the layer to pack; its weight and bias tensors are shared, not copied.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight = linear.weight  # kept for code that reads it (e.g. tied embeddings)
        self.bias = linear.bias
        with torch.no_grad():
            # [blocked] oneDNN's layout for any row count (no batch-size hint).
            self.register_buffer("packed", torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach()),
                                 persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        rows = x.reshape(-1, self.in_features)  # [M, in]
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, self.bias, "none", [], "")
        return out.reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed"


def describe_kernels(model: torch.nn.Module, prefill: bool = True) -> str:
    """'<gemm>/<attention>' of a model, e.g. 'skinny/oilbird_tree' or 'skinny+q4_1,q8_0<=4+fused/oilbird_skinny'
    ('+prefill:bf16' where prefills run another block kernel, unless `prefill` is False: a cost
    curve, which prices steps and trees only, is keyed without it; '+rows>=8:bf16' where forwards
    of that many rows run it too, which a curve prices; for cost-curve keys and records)."""
    kinds = {type(m) for m in model.modules()}
    gemm = ("skinny" if SkinnyLinear in kinds else "skinny-bf16" if PairsLinear in kinds
            else "onednn" if PackedLinear in kinds else "default")
    blocks = [m for m in model.modules() if isinstance(m, BlockLinear)]
    if blocks:  # e.g. '+q4_1,q8_0<=8192' (SmolLM2) or '+q4_k,q5_0,q6_k,q8_0<=8192' (Qwen2.5-Coder-0.5B)
        types = ",".join(sorted({m.block_type.lower() for m in blocks}))
        gemm += f"+{types}<=" + ",".join(map(str, sorted({m.max_rows for m in blocks})))
        gemm += "".join(sorted({":" + m.kernel_name for m in blocks if m.kernel_name != "fma"}))  # ':int8'; 'fma' unnamed as before
        switched = [m for m in blocks if m.switch is not None]
        if prefill:
            gemm += "".join(sorted({f"+prefill:{m.prefill_kernel_name}" for m in switched}))
        # trees of wide_rows nodes or more on the prefill kernel: part of what a cost curve prices
        gemm += "".join(sorted({f"+rows>={m.switch.wide_rows}:{m.prefill_kernel_name}"
                                for m in switched if m.switch.wide_rows}))
    if kinds & {FusedRMSNorm, FusedMLP}:
        gemm += "+fused"
    return f"{gemm}/{model.config._attn_implementation}"


def prefill_kernel(config: ForwardConfig) -> str | None:
    """The block kernel `config` runs prefills on, or None for its `block_kernel`."""
    if config.prefill_kernel == "auto":
        return "bf16" if kernels().amx_bf16_available() else None
    return None if config.prefill_kernel in ("same", config.block_kernel) else config.prefill_kernel


def tree_model(model: torch.nn.Module, config: ForwardConfig | None = None,
               gguf: GGUFTensors | None = None) -> torch.nn.Module:
    """A copy of `model` that shares its weights and runs the kernels `config` picks.

    Args:
        model: a transformers causal LM in eval mode.
        config: which kernels (default: `ForwardConfig()`).
        gguf: the tensors of the GGUF file `model` was converted from, if any (for `config.q4_rows`).

    Returns:
        The model itself when `config` changes nothing; otherwise a copy of its module tree
        (weights shared, `nn.Linear` -> `SkinnyLinear` or `PackedLinear` where the GEMM is
        skinny or oneDNN, `BlockLinear` over the GGUF's blocks where `config.q4_rows` and `gguf`
        allow, `FusedRMSNorm` and `FusedMLP` where `config.fused` and the float32 kernels allow,
        attention `SKINNY_ATTENTION` or `TREE_ATTENTION` where chosen).

    Raises:
        ValueError: if `config` asks for a kernel this model's device or dtype cannot run.
    """
    config = config or ForwardConfig()
    param = next(model.parameters())
    gemm = resolve_gemm(config, param.device, param.dtype)
    attention = resolve_attention(config, model)
    if gemm == "default" and attention == "sdpa":
        return model  # (q4_rows needs gemm 'skinny')
    # Every parameter and buffer maps to itself: the copy shares all tensors with `model`.
    memo = {id(t): t for t in (*model.parameters(), *model.buffers())}
    fast = copy.deepcopy(model, memo)
    skinny = PairsLinear if param.dtype == torch.bfloat16 else SkinnyLinear
    layer = {"skinny": skinny, "onednn": PackedLinear}.get(gemm)
    if layer is not None:
        for name, module in list(fast.named_modules()):
            if type(module) is torch.nn.Linear:
                fast.set_submodule(name, layer(module))
    if config.q4_rows and gguf and layer is SkinnyLinear and kernels().q4_available():
        try:
            q4_layers(fast, gguf, config.q4_rows, config.block_kernel, prefill_kernel(config),
                      config.wide_rows)  # other layers: float32
        except ValueError as err:  # 'int8' or 'bf16' where the CPU or OS lacks AMX: say so, do not fall back silently
            raise KernelChoiceError(str(err)) from err
    if config.fused and layer is SkinnyLinear:
        fuse_layers(fast)  # modules of another form keep transformers' own
    if attention != "sdpa":
        fast.set_attn_implementation(SKINNY_ATTENTION if attention == "skinny" else TREE_ATTENTION)
    return fast.eval()


def harvest_head(head: torch.nn.Module, want: str, device: torch.device, dtype: torch.dtype):
    """The LM head a prefill harvest runs (GOOSE's and Oilbird's prompt top-k).

    The harvest is draft material only, never what is verified, so it may run in a faster
    dtype than the model's: 'auto' picks bfloat16 on a CPU with bfloat16 GEMM (AVX-512 BF16 or
    AMX; about 3x float32 there), else the model's own head.

    Args:
        head: the model's output embeddings (a Linear or PackedLinear with `.weight`).
        want: 'auto', 'model', or a dtype name ('bfloat16', 'float32').
        device, dtype: the model's.

    Returns:
        hidden [T, d] -> logits [T, V] in the head's dtype (bfloat16 when converted: the caller
        takes the top-k of it, `oilbird.skinny_gemm.topk`, without a float32 copy).
    """
    if want == "auto":
        fast_bf16 = device.type == "cpu" and torch.ops.mkldnn._is_mkldnn_bf16_supported()
        want = "bfloat16" if fast_bf16 else "model"
    if want == "model" or getattr(torch, want) == dtype:
        return head
    weight = head.weight.detach().to(getattr(torch, want))  # [V, d], one copy
    bias = None if getattr(head, "bias", None) is None else head.bias.detach().to(weight.dtype)
    return lambda h: torch.nn.functional.linear(h.to(weight.dtype), weight, bias)
