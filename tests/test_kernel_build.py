"""Our C++ kernels (oilbird/skinny_gemm.py, csrc/) build wherever they can run, for every
instruction set they claim: a build failure falls back to PyTorch silently at run time, so these
tests are what notices it."""

import os
import re
import shutil
import subprocess
import sysconfig
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from torch.utils.cpp_extension import include_paths

from oilbird.skinny_gemm import CSRC, SOURCES, flag_sets, flags, flags_for, isa, skinny_available

COMPILER = shutil.which(os.environ.get("CXX", "c++"))


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler here: the kernels are optional and fall back")
def test_the_kernels_build_wherever_the_cpu_can_run_them():
    available, why = skinny_available()
    assert available or isa() is None, f"the CPU has {isa()} and a compiler, yet: {why}"


def _closure(source: Path) -> str:
    """The text of a source and of every header of ours it includes, directly or not."""
    seen, todo, text = set(), [source], []
    while todo:
        path = todo.pop()
        if path in seen or not path.is_file():
            continue
        seen.add(path)
        body = path.read_text()
        text.append(body)
        todo += [CSRC / name for name in re.findall(r'#include "([^"]+)"', body)]
    return "\n".join(text)


def _predefined(isa_flags: list[str]) -> frozenset[str]:
    """The macros the compiler defines for these flags."""
    done = subprocess.run([COMPILER, "-dM", "-E", "-x", "c++", *isa_flags, os.devnull],
                          capture_output=True, text=True, check=True)
    return frozenset(line.split()[1] for line in done.stdout.splitlines() if line.startswith("#define "))


def host_flags() -> list[str] | None:
    """The flags this host builds the kernels with (None: it builds none)."""
    return flags() if isa() else None


def compile_jobs(host: list[str] | None) -> dict[tuple[str, str], list[str]]:
    """(flags, source) -> the flags to check the source with: each source once per distinct set of
    the macros it tests (`#if defined(__AVX512BF16__)` ...) that some CPU's flags (`flag_sets`)
    give it, leaving out the set the host builds with (`host`; the test above builds it). A
    source that tests no macro the flags change is checked once; one that guards an AMX kernel is
    checked with the AMX flags, whichever CPU runs the test."""
    variants = [[f for f in flag_set if f != "-O3"] for flag_set in flag_sets()]
    host = [f for f in host if f != "-O3"] if host else None
    defined = {" ".join(v): _predefined(v) for v in variants + ([host] if host else [])}
    jobs = {}
    for source in SOURCES:
        tested = set(re.findall(r"__[A-Z0-9_]+__", _closure(source)))
        done = {defined[" ".join(host)] & tested} if host else set()
        for variant in variants:
            key = defined[" ".join(variant)] & tested
            if key not in done:
                done.add(key)
                jobs[(" ".join(variant), source.name)] = variant
    return jobs


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler here: the kernels are optional and fall back")
def test_every_source_compiles_for_the_instruction_sets_this_host_does_not_build():
    """Every source compiles with the flags of every CPU kind (AVX2; AVX-512 with or without
    bfloat16 dot products and VNNI; AMX), whichever this host runs (a kernel written for one width
    once broke the other's build); the host's own build is the test above's. Only the code a
    source's own `#if`s select can differ between flag sets, so each source is checked once per
    distinct selection (`compile_jobs`)."""
    headers = [*include_paths(), sysconfig.get_paths()["include"], str(CSRC)]  # PyTorch's, Python's, ours
    includes = [f"-I{path}" for path in headers]
    commands = {job: [COMPILER, "-fsyntax-only", "-std=c++17", *isa_flags, *includes, str(CSRC / job[1])]
                for job, isa_flags in compile_jobs(host_flags()).items()}

    def compile_errors(command: list[str]) -> str | None:
        done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
        return done.stdout[-2000:] if done.returncode else None

    # As many compilers at once as cores: each holds ~0.7 GB (PyTorch's headers), and sixteen at
    # once beside the other test worker filled a 23 GB host's memory and stalled the suite.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        errors = dict(zip(commands, pool.map(compile_errors, commands.values())))
    failed = {job: error for job, error in errors.items() if error is not None}
    assert not failed, failed


@pytest.mark.skipif(COMPILER is None, reason="no C++ compiler here: the kernels are optional and fall back")
@pytest.mark.parametrize("host", ["this host", "AMX", "AVX-512 with VNNI", "AVX2", "none"])
def test_every_kernel_is_checked_under_the_flags_that_compile_it(host):
    """The AMX, VNNI and bfloat16 kernels are compiled with their instruction sets whatever the
    host (by its own build or by a check); a source that tests only the vector width is checked
    once per width at most."""
    built = {"this host": host_flags(), "AMX": flags_for("AMX", True, True, True, True),
             "AVX-512 with VNNI": flags_for("AVX512", vnni=True), "AVX2": flags_for("AVX2"), "none": None}[host]
    jobs = compile_jobs(built)

    def compiled_with(source: str, *wanted: str) -> bool:
        return set(wanted) <= set(built or []) or any(set(wanted) <= set(f.split()) for f, name in jobs if name == source)

    assert compiled_with("amx_blocks.cpp", "-mamx-tile", "-mamx-int8")
    assert compiled_with("amx_bf16_blocks.cpp", "-mamx-bf16", "-mavx512bf16")
    assert compiled_with("int8_head.cpp", "-mavx512vnni", "-mavx512bw")
    assert compiled_with("bf16_dot_gemm.cpp", "-mavx512bf16")
    # q4_gemm.cpp's #ifs test the vector width only: AVX2 and AVX-512, one of them the host's build.
    assert sum(name == "q4_gemm.cpp" for _, name in jobs) == (2 if built is None else 1)
    assert len(jobs) < len(SOURCES) * len(flag_sets())
