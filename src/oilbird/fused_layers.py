"""Fewer calls per forward: RMSNorm in one kernel, a gated MLP's gate and up projections in one GEMM.

A one-token forward of a small model on a CPU pays PyTorch's per-operation dispatch (a few
microseconds each) hundreds of times: on SmolLM2-135M, two Zen 4 cores, the step's weights take
about 5 ms to stream and its ~1,300 operations and module calls about as long again. Two module
kinds of every model type we serve hold a large share of them and have one standard form:

- transformers' RMSNorm (Llama, Qwen2, Mistral, Qwen3: `weight * (x * rsqrt(mean(x^2) + eps))`,
  seven operations, ~16 us a call, 61 calls a SmolLM2 forward). `FusedRMSNorm` runs the same
  formula in one kernel call (csrc/rms_norm.cpp), ~1.5 us. Its mean of squares is summed in
  float64 and rounded once, where PyTorch sums in float32, so an output differs from
  transformers' by an ulp now and then (as our GEMM's sums already do from MKL's); a row's result
  never depends on the rows beside it, so a tree forward still gives each node a one-token step's bits.
- the gated MLP `down(act(gate(x)) * up(x))`. `FusedMLP` multiplies `x` by the gate's and the up
  projection's weights concatenated, in one kernel call over one pack (the two layers keep views
  of it: no second copy), then applies the model's own activation, product and down projection.
  Each output's sum is the one the separate layer computes: bit-identical.

`fuse_layers` swaps them into a model in place, as `q4_layers` swaps linear layers, and checks
each swap on a random input before keeping it (bit for bit for the MLP, to float32 rounding for
the norm); a module that fails or has another form keeps transformers' own.
"""

from __future__ import annotations

import torch

from oilbird.gguf_weights import BlockLinear
from oilbird.skinny_gemm import SkinnyLinear, kernels, skinny_available

NORM_CLASSES = ("LlamaRMSNorm", "Qwen2RMSNorm", "MistralRMSNorm", "Qwen3RMSNorm")
"""RMSNorm classes whose forward is `weight * (x * rsqrt(mean(x^2) + eps))` in float32."""
MLP_CLASSES = ("LlamaMLP", "Qwen2MLP", "MistralMLP", "Qwen3MLP")
"""Gated MLP classes whose forward is `down_proj(act_fn(gate_proj(x)) * up_proj(x))`."""


class FusedRMSNorm(torch.nn.Module):
    """transformers' RMSNorm on one kernel call (csrc/rms_norm.cpp), float32 on the CPU.

    Args:
        norm: the RMSNorm to replace; its weight is shared and its `variance_epsilon` kept.

    Raises:
        ValueError: if the kernel is unavailable or the weight is not a float32 vector.
    """

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        ok, why = skinny_available()
        if not ok:
            raise ValueError(f"the RMSNorm kernel is unavailable: {why}")
        weight = getattr(norm, "weight", None)
        if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or weight.dtype != torch.float32:
            raise ValueError("FusedRMSNorm needs a float32 weight vector")
        self.weight = weight  # shared with the model
        self.variance_epsilon = float(norm.variance_epsilon)
        self._rms_norm = kernels().rms_norm  # looked up once: 61 calls a SmolLM2 forward

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., d] -> [..., d]
        return self._rms_norm(x, self.weight, self.variance_epsilon)

    def extra_repr(self) -> str:
        return f"{tuple(self.weight.shape)}, eps={self.variance_epsilon}, one kernel call"


class FusedMLP(torch.nn.Module):
    """A gated MLP whose gate and up projections run as one GEMM over one pack.

    Both projections must be `BlockLinear` (the GGUF's blocks) or both `SkinnyLinear` (float32),
    without bias or both with one; they keep views of the concatenated pack, so it costs no
    memory. Forwards of more rows than the layers' `max_rows` (Q4) run the layers as before.

    Args:
        mlp: the model's MLP (`gate_proj`, `up_proj`, `down_proj`, `act_fn`); its layers are kept.

    Raises:
        ValueError: if the projections are not such a pair.
    """

    def __init__(self, mlp: torch.nn.Module) -> None:
        super().__init__()
        gate, up = mlp.gate_proj, mlp.up_proj
        self.gate_proj, self.up_proj, self.down_proj, self.act_fn = gate, up, mlp.down_proj, mlp.act_fn
        if type(gate) is not type(up) or type(gate) not in (BlockLinear, SkinnyLinear):
            raise ValueError(f"gate and up projections on our kernels expected, got {type(gate).__name__} "
                             f"and {type(up).__name__}")
        if (gate.in_features, gate.out_features) != (up.in_features, up.out_features) or gate.out_features % 16:
            raise ValueError("gate and up projections of one shape, out_features a multiple of 16, expected")
        if (gate.bias is None) != (up.bias is None):
            raise ValueError("gate and up projections must both have a bias or neither")
        self.intermediate = gate.out_features
        blocks = gate.out_features // 16
        with torch.no_grad():
            if isinstance(gate, BlockLinear):
                if gate.max_rows != up.max_rows:
                    raise ValueError("gate and up projections read their blocks up to different row counts")
                if gate.bits != up.bits:  # one call runs one block layout
                    raise ValueError(f"gate and up projections in {gate.bits}- and {up.bits}-bit blocks")
                if ((gate.kernel_name, gate.prefill_kernel_name, gate.center, gate.switch)
                        != (up.kernel_name, up.prefill_kernel_name, up.center, up.switch)):  # and one kernel
                    raise ValueError("gate and up projections on different block kernels or offsets")
                packed = torch.cat([gate.packed_q4, up.packed_q4])  # [2 * blocks, K/G, bytes]
                gate.packed_q4, up.packed_q4 = packed[:blocks], packed[blocks:]  # views: one copy in all
                self._linear = gate.run  # the step's kernel, or the prefill's while its switch is on
                self._max_elements = gate.max_rows * gate.in_features
            else:
                packed = kernels().pack(torch.cat([gate.weight.detach(), up.weight.detach()]))  # [2 * blocks, K, 16]
                gate.share_packed(packed[:blocks])
                up.share_packed(packed[blocks:])
                self._linear = kernels().linear
                self._max_elements = None  # the float32 kernel serves every row count
            self.register_buffer("packed", packed, persistent=False)
            bias = None if gate.bias is None else torch.cat([gate.bias.detach(), up.bias.detach()]).float()
            self.register_buffer("bias", bias, persistent=False)  # [2 * intermediate] or None

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., hidden] -> [..., hidden]
        if self._max_elements is not None and x.numel() > self._max_elements:
            return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        both = self._linear(x, self.packed, self.bias)  # [..., 2 * intermediate]: gate's outputs, then up's
        i = self.intermediate
        return self.down_proj(self.act_fn(both[..., :i]) * both[..., i:])

    def extra_repr(self) -> str:
        return "gate and up projections in one GEMM"


def _norm_matches(fused: FusedRMSNorm, norm: torch.nn.Module, hidden: int) -> bool:
    """True when `fused` gives `norm`'s outputs to float32 rounding on a random input."""
    x = torch.randn(3, hidden, generator=torch.Generator().manual_seed(0)) * 4  # [3, d]
    return torch.allclose(fused(x), norm(x), rtol=1e-5, atol=1e-6)


def _mlp_matches(fused: FusedMLP, mlp: torch.nn.Module, hidden: int) -> bool:
    """True when `fused` gives `mlp`'s outputs bit for bit on random inputs of 1 and 5 rows."""
    generator = torch.Generator().manual_seed(0)
    return all(torch.equal(fused(x), mlp(x)) for x in (torch.randn(1, 1, hidden, generator=generator),
                                                        torch.randn(1, 5, hidden, generator=generator)))


def fuse_layers(model: torch.nn.Module) -> dict[str, str]:
    """Swap `model`'s RMSNorms for `FusedRMSNorm` and its gated MLPs for `FusedMLP`, in place.

    Args:
        model: a float32 causal LM on the CPU whose linear layers already run our kernels
            (`oilbird.kernels.tree_model`); only its modules of `NORM_CLASSES` and `MLP_CLASSES`
            are considered.

    Returns:
        module name -> why it kept transformers' module, for every such module not swapped
        (empty when all were).

    Raises:
        ValueError: if our kernels cannot run here.
    """
    ok, why = skinny_available()
    if not ok:
        raise ValueError(f"fused layers need our CPU kernels: {why}")
    hidden = model.config.hidden_size
    kept = {}
    with torch.inference_mode():
        for name, module in list(model.named_modules()):
            kind = type(module).__name__
            if kind not in NORM_CLASSES + MLP_CLASSES:
                continue
            try:
                fused = FusedRMSNorm(module) if kind in NORM_CLASSES else FusedMLP(module)
            except ValueError as err:
                kept[name] = str(err)
                continue
            size = module.weight.shape[0] if kind in NORM_CLASSES else hidden
            matches = (_norm_matches if kind in NORM_CLASSES else _mlp_matches)(fused, module, size)
            if matches:
                model.set_submodule(name, fused)
            else:
                kept[name] = "its outputs differ from the fused module's on a random input"
    return kept
