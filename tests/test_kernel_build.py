"""Our C++ kernels (oilbird/skinny_gemm.py, csrc/) build wherever they can run, for every
instruction set they claim: a build failure falls back to PyTorch silently at run time, so these
tests are what notices it."""

import os
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor

import pytest
from torch.utils.cpp_extension import include_paths

from oilbird.skinny_gemm import CSRC, ISA_FLAGS, SOURCES, flags, isa, skinny_available

COMPILER = shutil.which(os.environ.get("CXX", "c++"))


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler here: the kernels are optional and fall back")
def test_the_kernels_build_wherever_the_cpu_can_run_them():
    available, why = skinny_available()
    assert available or isa() is None, f"the CPU has {isa()} and a compiler, yet: {why}"


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler here: the kernels are optional and fall back")
def test_every_source_compiles_for_the_instruction_sets_this_host_does_not_build():
    """The AVX2 build, the AVX-512 build and the AVX-512 build with bfloat16 dot products
    (csrc/bf16_dot_gemm.cpp) all compile, whichever this host runs (a kernel written for one
    width once broke the other's build); the host's own is built by the test above."""
    headers = [*include_paths(), sysconfig.get_paths()["include"], str(CSRC)]  # PyTorch's, Python's, ours
    includes = [f"-I{path}" for path in headers]
    variants = [ISA_FLAGS["AVX2"], ISA_FLAGS["AVX512"], [*ISA_FLAGS["AVX512"], "-mavx512bf16"]]
    host = [f for f in flags() if f not in ("-O3", "-fopenmp")] if isa() else None
    others = {" ".join(f): f for f in variants if f != host}
    commands = {(name, source.name): [COMPILER, "-fsyntax-only", "-std=c++17", "-fopenmp", *isa_flags, *includes,
                                      str(source)]
                for name, isa_flags in others.items() for source in SOURCES}

    def compile_errors(command: list[str]) -> str | None:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        return done.stdout[-2000:] if done.returncode else None

    # As many compilers at once as cores: each holds ~0.9 GB (PyTorch's headers), and sixteen at
    # once beside the other test worker filled a 23 GB host's memory and stalled the suite.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        errors = dict(zip(commands, pool.map(compile_errors, commands.values())))
    failed = {job: error for job, error in errors.items() if error is not None}
    assert not failed, failed
