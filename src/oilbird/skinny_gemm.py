"""Our CPU kernels for few-row forwards (AVX-512 or AVX2, float32), compiled on first use.

A verification forward multiplies 1 to 64 rows (tree nodes) by every weight matrix of the model.
At such row counts the cost is reading the weights, and oneDNN's kernels on this project's CPU pay
the reads and the arithmetic one after the other: 8 rows cost 1.4x one row. The GEMM in
`csrc/skinny_gemm.cpp` (kernels in `csrc/skinny_kernels.h`) streams each weight once and hides the
few rows' FMAs under the loads: 8 rows cost about 1.1x one row, and one row is itself faster than
oneDNN's. `csrc/tree_attention.cpp` is the tree attention on the same footing (used by
`oilbird.tree_attention.skinny_tree_attention`), and `csrc/topk.cpp` the top-k of logit rows
(`topk`: the verifier's and the prefill harvest's). A bfloat16 model's layers run on the
AVX512_BF16 dot products of `csrc/bf16_dot_gemm.cpp` (`PairsLinear`), where the CPU has them.
The measurements: `scripts/forward_cost.py`, docs/RESULTS.md.

The module is C++ written once against a few vector operations (`csrc/simd.h`) and compiled for
the widest instruction set the CPU has, AVX-512 or AVX2 with FMA, by `torch.utils.cpp_extension`
the first time a process asks for it (about 90 s on two Zen 4 cores; cached in the oilbird cache
directory, keyed by the sources, the PyTorch version and the compiler flags). It needs such a CPU, a C++ compiler and
ninja (the `ninja` package is a dependency); where any is missing `skinny_available()` says why and the
verifier uses oneDNN and PyTorch's SDPA instead (`oilbird.kernels.resolve_gemm`,
`resolve_attention`).
"""

from __future__ import annotations

import hashlib
import itertools
import os
import shutil
import sys
import time
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

import torch

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "skinny_gemm.cpp", CSRC / "tree_attention.cpp", CSRC / "topk.cpp",
           CSRC / "certified_topk.cpp", CSRC / "bf16_dot_gemm.cpp", CSRC / "key_search.cpp",
           CSRC / "q4_gemm.cpp", CSRC / "rms_norm.cpp", CSRC / "amx_blocks.cpp",
           CSRC / "amx_bf16_blocks.cpp", CSRC / "int8_head.cpp"]  # the module's translation units
HEADERS = [CSRC / "skinny_kernels.h", CSRC / "simd.h", CSRC / "tree_attention_problem.h",
           CSRC / "tree_attention_avx2.h", CSRC / "tree_attention_lanes.h", CSRC / "topk_scan.h",
           CSRC / "block_layouts.h", CSRC / "amx_quads.h",
           CSRC / "amx_rows.h", CSRC / "amx_tiles.h", CSRC / "amx_bf16_pairs.h"]
# Compiler flags by the instruction set PyTorch detects on this CPU (AMX implies AVX-512).
ISA_FLAGS = {"AVX512": ["-mavx512f", "-mavx2", "-mfma"], "AMX": ["-mavx512f", "-mavx2", "-mfma"],
             "AVX2": ["-mavx2", "-mfma", "-mf16c"]}


# What csrc/amx_blocks.cpp needs, as /proc/cpuinfo names it (Sapphire Rapids and later Xeons).
AMX_FLAGS = ("amx_tile", "amx_int8", "avx512bw", "avx512vbmi", "avx512_vnni", "bmi2")
# What csrc/amx_bf16_blocks.cpp needs besides those.
AMX_BF16_FLAGS = ("amx_bf16", "avx512_bf16")


@lru_cache(maxsize=1)
def isa() -> str | None:
    """The instruction set the kernels are built for here ('AVX512', 'AMX', 'AVX2'), or None."""
    capability = torch.backends.cpu.get_cpu_capability()
    return capability if capability in ISA_FLAGS else None


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo ('flags', 'cpu family', ...); {} where there is none."""
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            name, _, value = line.partition(":")
            fields.setdefault(name.strip(), value.strip())
    except OSError:  # not Linux
        pass
    return fields


def has_bf16_dot() -> bool:
    """True when the CPU reports AVX512_BF16 (bfloat16 dot products: csrc/bf16_dot_gemm.cpp)."""
    return "avx512_bf16" in cpu_info().get("flags", "").split()


def has_vnni() -> bool:
    """True when the CPU reports AVX512-VNNI byte dot products and AVX512BW (csrc/int8_head.cpp)."""
    return {"avx512_vnni", "avx512bw"} <= set(cpu_info().get("flags", "").split())


def has_amx() -> bool:
    """True when the CPU reports AMX int8 tiles and the AVX-512 parts csrc/amx_blocks.cpp uses."""
    return set(AMX_FLAGS) <= set(cpu_info().get("flags", "").split())


def has_amx_bf16() -> bool:
    """True when the CPU also reports AMX bfloat16 tiles and AVX512_BF16 (csrc/amx_bf16_blocks.cpp)."""
    return has_amx() and set(AMX_BF16_FLAGS) <= set(cpu_info().get("flags", "").split())


def flags_for(isa_name: str | None, bf16: bool = False, vnni: bool = False, amx: bool = False,
              amx_bf16: bool = False) -> list[str]:
    """The compiler flags for a CPU of instruction set `isa_name` ('AVX512', 'AMX', 'AVX2') with
    the named extensions (`has_bf16_dot`, `has_vnni`, `has_amx`, `has_amx_bf16`); the extensions
    count only where the set is AVX-512 wide."""
    wide = isa_name in ("AVX512", "AMX")
    bf16_flags = ["-mavx512bf16"] if wide and bf16 else []
    amx_flags = ["-mavx512bw", "-mavx512vbmi", "-mavx512vnni", "-mbmi2", "-mamx-tile", "-mamx-int8"] if wide and amx else []
    amx_flags += ["-mamx-bf16"] if wide and amx and amx_bf16 else []
    vnni_flags = ["-mavx512bw", "-mavx512vnni"] if wide and vnni and not amx else []  # AMX's list has them
    return ["-O3", *ISA_FLAGS.get(isa_name or "", []), *bf16_flags, *amx_flags, *vnni_flags, "-fopenmp"]


def flags() -> list[str]:
    """The compiler flags for this CPU (the kernels are built only where `isa()` is not None)."""
    return flags_for(isa(), has_bf16_dot(), has_vnni(), has_amx(), has_amx_bf16())


def flag_sets() -> list[list[str]]:
    """Every distinct list of flags `flags()` gives on some CPU, in a fixed order (what the build
    test compiles the sources with, so a kernel for a CPU this host is not gets compiled too)."""
    out: list[list[str]] = []
    for isa_name in ISA_FLAGS:
        for bf16, vnni, amx, amx_bf16 in itertools.product((False, True), repeat=4):
            candidate = flags_for(isa_name, bf16, vnni, amx, amx_bf16)
            if candidate not in out:
                out.append(candidate)
    return out


@contextmanager
def _ninja_on_path():
    """Put the `ninja` package's binary on PATH for the build, when none is installed system-wide."""
    if shutil.which("ninja"):
        yield
        return
    import ninja  # the pip package; a dependency of oilbird

    old = os.environ.get("PATH", "")
    os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + old
    try:
        yield
    finally:
        os.environ["PATH"] = old


def source_key() -> str:
    """What the compiled module depends on: its sources, PyTorch's version and the flags (a hash;
    also part of the cost-curve key, so a curve timed with other kernels is measured again)."""
    source = b"".join(path.read_bytes() for path in SOURCES + HEADERS)
    return hashlib.sha256(source + torch.__version__.encode() + " ".join(flags()).encode()).hexdigest()[:16]


def build_directory(key: str) -> Path:
    """Where the module of source key `key` is built and cached: one directory per key and PyTorch
    installation.

    One per installation as well as per key: a build file names the include paths of the
    environment that wrote it, so two virtualenvs (the engine's and vLLM's) sharing one directory
    rebuilt it in turn, 1-2 min each time.
    """
    from oilbird.model_fetch import default_cache_dir

    where = hashlib.sha256(str(Path(torch.__file__).resolve().parent).encode()).hexdigest()[:8]
    return default_cache_dir() / "kernels" / f"skinny_gemm-{key}-{where}"


@lru_cache(maxsize=1)
def _load():
    """(the compiled module, None) or (None, why it is unavailable); built once per process."""
    if isa() is None:
        return None, f"the CPU lacks AVX2 and AVX-512 (PyTorch reports {torch.backends.cpu.get_cpu_capability()})"
    from torch.utils.cpp_extension import load

    key = source_key()
    build = build_directory(key)
    try:
        # The build compiles copies kept beside it: every checkout of the same sources then
        # writes the same build file and reuses the same library, instead of rebuilding it for
        # its own source paths under another process's feet.
        copies = build / "src"
        copies.mkdir(parents=True, exist_ok=True)
        for path in SOURCES + HEADERS:
            if not (copies / path.name).exists():
                tmp = copies / f".{path.name}.{os.getpid()}"
                tmp.write_bytes(path.read_bytes())
                tmp.replace(copies / path.name)  # atomic: a concurrent build never reads half a file
        name = f"oilbird_skinny_gemm_{key}"
        notice = build_notice(build, name)
        if notice:
            print(notice, file=sys.stderr, flush=True)
        started = time.perf_counter()
        with _ninja_on_path():
            module = load(name=name, sources=[str(copies / p.name) for p in SOURCES],
                          extra_cflags=flags(), extra_ldflags=["-fopenmp"], build_directory=str(build),
                          verbose=False)
        if notice:
            print(f"oilbird: kernels built in {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
    except Exception as err:  # no compiler, no ninja, a failed build: oneDNN serves instead
        return None, f"building the kernels in {CSRC} failed ({type(err).__name__}: {str(err).strip()[-300:]})"
    return module, None


def build_notice(build: Path, name: str) -> str | None:
    """What to tell the user before a build that will compile, or None when the library is there.

    A cold build takes 1-3 minutes (about 90 s on two Zen 4 cores, twice that inside a vLLM worker,
    whose threads are bound to one core): said once, on stderr, so a first `oilbird generate` or
    `oilbird serve` does not look hung.

    Args:
        build: the build directory of this source key and PyTorch installation.
        name: the extension's name; its library is `build/<name>.so` once built.

    Returns:
        One line for stderr, or None where the library is already built.
    """
    if any(build.glob(f"{name}.*")):
        return None
    return (f"oilbird: compiling the CPU kernels for this CPU and PyTorch installation, once "
            f"(1-3 min; cached in {build})")


def kernels():
    """The compiled module (`pack`, `linear`, `tree_attention`); call only where `skinny_available()`."""
    return _load()[0]


def skinny_available() -> tuple[bool, str]:
    """(True, '') when the kernel runs here (building it on the first call), else (False, why)."""
    module, why = _load()
    return module is not None, why or ""


def topk(logits: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k of each row of [M, V] logits: (values [M, k] float32, ids [M, k]), descending.

    On a CPU, for float32 or bfloat16 logits, our kernel (csrc/topk.cpp: one vectorized scan per
    row, ties to the lower id, bfloat16 read without a float32 copy); elsewhere `torch.topk`
    (whose order among exactly tied values is unspecified).
    """
    if (logits.device.type == "cpu" and logits.dim() == 2 and logits.dtype in (torch.float32, torch.bfloat16)
            and 1 <= k <= logits.shape[1] and skinny_available()[0]):
        return kernels().topk_rows(logits, k)
    top = logits.topk(k, dim=-1)
    return top.values.float(), top.indices


def _adopt(layer: torch.nn.Module, linear: torch.nn.Linear) -> None:
    """Give a packed layer the shape and the (shared, not copied) tensors of the linear it replaces."""
    layer.in_features, layer.out_features = linear.in_features, linear.out_features
    layer.weight = linear.weight  # kept for code that reads it (e.g. tied embeddings)
    layer.bias = linear.bias


class SkinnyLinear(torch.nn.Module):
    """`nn.Linear` in float32 computed by the skinny kernel from weights packed once.

    The packed copy is made on the first forward, not here: a layer whose forwards all read its
    GGUF blocks instead (`oilbird.gguf_weights.BlockLinear`, which wraps this one for larger
    forwards) then never holds it, and SmolLM2's decoder keeps 425 MB less.

    Args:
        linear: the layer to pack (float32 on the CPU); its weight and bias tensors are shared, not
            copied, and the packed copy is the only new memory.

    Raises:
        ValueError: if the kernel is unavailable here or the layer is not float32.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        module, why = _load()
        if module is None:
            raise ValueError(f"the skinny GEMM is unavailable: {why}")
        if linear.weight.dtype != torch.float32:
            raise ValueError(f"the skinny GEMM runs float32 only, not {linear.weight.dtype}")
        _adopt(self, linear)
        self._packed: torch.Tensor | None = None  # [out padded/16, in, 16], made by `packed`
        padded = -self.out_features % 16  # the kernel works in blocks of 16 outputs
        bias = None if linear.bias is None else linear.bias.detach()  # [out]
        if bias is not None and padded:
            bias = torch.cat([bias, bias.new_zeros(padded)])
        self.register_buffer("packed_bias", bias, persistent=False)  # [out padded] or None

    @property
    def packed(self) -> torch.Tensor:
        """The weight in the kernel's layout [out padded/16, in, 16], packed on first use."""
        if self._packed is None:
            with torch.no_grad():
                weight = self.weight.detach()  # [out, in]
                padded = -self.out_features % 16
                if padded:
                    weight = torch.cat([weight, weight.new_zeros(padded, self.in_features)])
                self._packed = kernels().pack(weight)
        return self._packed

    def share_packed(self, packed: torch.Tensor) -> None:
        """Use `packed` (this layer's weight in the kernel's layout, e.g. a slice of a larger pack
        that `oilbird.fused_layers.FusedMLP` made) instead of packing a copy of its own."""
        blocks = (self.out_features + 15) // 16
        if packed.shape != (blocks, self.in_features, 16) or packed.dtype != torch.float32:
            raise ValueError(f"a pack of shape {(blocks, self.in_features, 16)} float32 expected, "
                             f"got {tuple(packed.shape)} {packed.dtype}")
        self._packed = packed

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] -> [..., out]
        out = kernels().linear(x, self.packed, self.packed_bias)  # [..., out padded]
        return out[..., : self.out_features] if out.shape[-1] != self.out_features else out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, skinny {isa()}"


def bf16_dot_ready() -> tuple[bool, str]:
    """(True, '') when the AVX512_BF16 GEMM (`PairsLinear`) runs here, else (False, why)."""
    module, why = _load()
    if module is None:
        return False, why
    if not module.bf16_dot_available():
        return False, "the CPU has no AVX512_BF16 (or the kernels were built without it)"
    return True, ""


class PairsLinear(torch.nn.Module):
    """`nn.Linear` of a bfloat16 model on AVX512_BF16 dot products (csrc/bf16_dot_gemm.cpp).

    Every product of a bfloat16 input and weight is exact and every sum float32, each row's
    over the inputs in one order whatever rows share its tile; the output is rounded to bfloat16
    once, as PyTorch's bfloat16 linear does. So a row's
    result does not depend on the rows beside it: a tree forward gives each node the bits a
    one-token step would, which bfloat16 needs for speculation to be lossless (its logits tie often,
    and oneDNN's kernels, which change with the row count, broke such ties differently).

    Args:
        linear: a bfloat16 layer on the CPU; weight and bias shared, the packed copy the only new memory.

    Raises:
        ValueError: if the kernel cannot run here or the layer is not bfloat16.
    """

    def __init__(self, linear: torch.nn.Linear) -> None:
        super().__init__()
        ok, why = bf16_dot_ready()
        if not ok:
            raise ValueError(f"the bfloat16 dot-product GEMM is unavailable: {why}")
        if linear.weight.dtype != torch.bfloat16:
            raise ValueError(f"PairsLinear runs bfloat16 layers only, not {linear.weight.dtype}")
        _adopt(self, linear)
        with torch.no_grad():
            weight = linear.weight.detach()  # [out, in]
            padded = -self.out_features % 16  # the kernel works in blocks of 16 outputs
            if padded:
                weight = torch.cat([weight, weight.new_zeros(padded, self.in_features)])
            self.register_buffer("packed", kernels().pack_pairs(weight), persistent=False)  # [out/16, in/2, 32]
            bias = None if linear.bias is None else linear.bias.detach().float()  # [out]
            self.register_buffer("bias_f32", bias, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # [..., in] bfloat16 -> [..., out] bfloat16
        rows = x.reshape(-1, self.in_features)  # [M, in] bfloat16, taken as it is by the kernel
        out = kernels().linear_pairs(rows, self.packed)  # [M, out padded] float32
        if out.shape[1] != self.out_features:
            out = out[:, : self.out_features]
        if self.bias_f32 is not None:
            out = out + self.bias_f32
        return out.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, AVX512_BF16 dot products"
