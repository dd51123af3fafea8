"""Builds the C++/CUDA kernels with torch.utils.cpp_extension and ninja, on first use.

`import bitcompile` never compiles: ops.py registers a small Python loader for the CPU and CUDA
dispatch keys, and the first call of any op on a device builds (or takes from the cache) the
shared library of that device, whose TORCH_LIBRARY_IMPL blocks then serve every later call
straight from the dispatcher.

The cache is torch's (`TORCH_EXTENSIONS_DIR`, default ~/.cache/torch_extensions); sources and
flags are hashed by cpp_extension, so an edit rebuilds. `python -m bitcompile` (or the
`bitcompile-build` command) prebuilds and says what it built.
"""

from __future__ import annotations

import glob
import os
import shutil
import sys
import time
from pathlib import Path

import torch

# A build killed half way (Ctrl-C, OOM, a timed-out CI job) leaves cpp_extension's `lock` file
# behind, and every later build then waits on it forever. A lock older than this is stale.
STALE_LOCK_SECONDS = float(os.environ.get("BITCOMPILE_STALE_LOCK_SECONDS", 600))


class KernelBuildError(RuntimeError):
    """The C++/CUDA kernels of bitcompile could not be compiled or loaded."""


def source_dir() -> Path:
    """Where the kernel sources are: bitcompile/csrc in a wheel, csrc/ beside the package in a checkout."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "csrc", here.parent / "csrc"):
        if (candidate / "checks.h").is_file():
            return candidate
    raise KernelBuildError(f"bitcompile: kernel sources (csrc/) not found in {here} or beside it")


def _build_directory(name: str) -> Path:
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def _clear_stale_lock(name: str) -> None:
    lock = _build_directory(name) / "lock"
    if lock.exists() and time.time() - lock.stat().st_mtime > STALE_LOCK_SECONDS:
        print(f"bitcompile: removing stale build lock {lock} (a build was interrupted)", file=sys.stderr)
        lock.unlink(missing_ok=True)


def _cpu_flags() -> list[str]:
    # Built on the machine that runs it, so -march=native picks POPCNT/AVX2 (or AVX-512) when the
    # CPU has them; the library name carries torch's CPU capability so a shared cache directory
    # never hands an AVX2 build to a CPU without AVX2.
    # -ffp-contract=off: the epilogues round as the SPEC and eager PyTorch do (dot * scale, then + bias): GCC's
    # default (fast) fuses them into one FMA wherever the target has FMA, 1 ulp off eager on some outputs (an AVX2
    # machine, 2026-12-02: test_backend_folds_under_inductor_only, 216 of 5120). FMAs the kernels mean are intrinsics.
    return ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]  # C++ standard: cpp_extension's (C++20)


def _cuda_arch_flags() -> list[str]:
    """-gencode flags for the visible GPUs; Hopper gets sm_90a (wgmma needs the 'a' target)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return []  # the user chose: cpp_extension reads the variable itself
    flags = []
    for index in range(torch.cuda.device_count()):
        major, minor = torch.cuda.get_device_capability(index)
        arch = f"{major}{minor}" + ("a" if (major, minor) == (9, 0) else "")
        flag = f"-gencode=arch=compute_{arch},code=sm_{arch}"
        if flag not in flags:
            flags.append(flag)
    return flags


def _cuda_defines(arch_flags: list[str]) -> list[str]:
    """-DBITCOMPILE_SM90A=1 where the build has sm_90a device code: binary_linear and binary_weight_linear take their
    wgmma kernels, which have a body only in that code, only then (csrc/cuda/device_common.cuh). The host code cannot
    see which device code a build holds; with TORCH_CUDA_ARCH_LIST, Hopper needs "9.0a" for them."""
    chosen = " ".join(arch_flags) if arch_flags else os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    return ["-DBITCOMPILE_SM90A=1"] if ("sm_90a" in chosen or "9.0a" in chosen) else []


def _load(name: str, sources: list[str], **kwargs) -> None:
    from torch.utils import cpp_extension

    if shutil.which("ninja") is None and not cpp_extension.is_ninja_available():
        raise KernelBuildError("bitcompile: ninja is needed to build the kernels (pip install ninja)")
    _clear_stale_lock(name)
    verbose = os.environ.get("BITCOMPILE_VERBOSE_BUILD", "0") == "1"
    try:
        cpp_extension.load(name=name, sources=sources, is_python_module=False, verbose=verbose, **kwargs)
    except Exception as error:  # compiler missing, compile error, ...: say which build failed
        raise KernelBuildError(
            f"bitcompile: building the {name} kernels failed: {error}. "
            "A C++17 compiler (and nvcc for CUDA) is needed; set BITCOMPILE_VERBOSE_BUILD=1 to see the build."
        ) from error


# One shared library per op family and device: a family builds (and rebuilds) on its own, and a
# compile error in one family's sources names that family. Paths are relative to csrc/.
LIBRARIES = {
    "cpu": {
        "binary": ["cpu/binary_ops.cpp"],
        "apot": ["cpu/apot_ops.cpp"],
    },
    "cuda": {
        # One translation unit per op family of kernels: ninja compiles them in parallel.
        "binary": [
            "cuda/binary_ops.cpp",
            "cuda/pack_signs.cu",
            "cuda/binary_linear.cu",
            "cuda/binary_linear_wgmma.cu",
            "cuda/binary_weight_linear.cu",
            "cuda/binary_weight_wgmma.cu",
            "cuda/binary_weight_planes_wgmma.cu",
            "cuda/binary_conv2d.cu",
            "cuda/binary_conv2d_pipelined.cu",
            "cuda/binary_conv2d_halo.cu",
            "cuda/binary_conv2d_wgmma.cu",
        ],
        "apot": ["cuda/apot_ops.cpp", "cuda/apot_kernels.cu", "cuda/apot_wgmma.cu"],
    },
}


def _families(device: str) -> list[str]:
    # Developers working on one family can build only it: BITCOMPILE_DEV_FAMILIES=binary
    chosen = os.environ.get("BITCOMPILE_DEV_FAMILIES")
    families = list(LIBRARIES[device])
    return [f for f in families if f in chosen.split(",")] if chosen else families


def library_name(device: str, family: str) -> str:
    if device == "cpu":
        # -march=native below: the name carries torch's CPU capability so that a shared cache
        # directory never hands an AVX2 build to a CPU without AVX2.
        capability = torch.backends.cpu.get_cpu_capability().lower()
        return f"bitcompile_cpu_{capability}_{family}"
    return f"bitcompile_cuda_{family}"


def _build_side_by_side(device: str, build_one) -> list[str]:
    """Builds the families of `device` side by side (each is its own ninja build of parallel translation
    units, so the slowest family, not their sum, sets the time); returns the library names in order."""
    from concurrent.futures import ThreadPoolExecutor

    families = _families(device)
    with ThreadPoolExecutor(max_workers=max(1, len(families))) as pool:
        return list(pool.map(build_one, families))


def build_cpu() -> list[str]:
    root = source_dir()

    def build(family: str) -> str:
        name = library_name("cpu", family)
        sources = [str(root / path) for path in LIBRARIES["cpu"][family]]
        _load(name, sources, extra_cflags=_cpu_flags(), extra_ldflags=["-fopenmp"], extra_include_paths=[str(root)])
        return name

    return _build_side_by_side("cpu", build)


# The CUDA kernels run on tensor cores through sm_80 instructions (mma.sync b1 AND.POPC, bf16 mma, cp.async).
MIN_COMPUTE_CAPABILITY = (8, 0)


def check_cuda_devices() -> None:
    """A clear error, before any compiler runs, for a GPU the kernels cannot run on."""
    if not torch.cuda.is_available():
        raise KernelBuildError("bitcompile: CUDA kernels asked for, but torch sees no CUDA GPU")
    for index in range(torch.cuda.device_count()):
        capability = torch.cuda.get_device_capability(index)
        if capability < MIN_COMPUTE_CAPABILITY:
            raise KernelBuildError(
                f"bitcompile: the CUDA kernels need compute capability {MIN_COMPUTE_CAPABILITY[0]}.{MIN_COMPUTE_CAPABILITY[1]} "
                f"or newer; GPU {index} ({torch.cuda.get_device_name(index)}) is {capability[0]}.{capability[1]}. "
                "Run the model on the CPU, or leave its layers unconverted on this GPU."
            )


def build_cuda() -> list[str]:
    check_cuda_devices()
    root = source_dir()

    arch_flags = _cuda_arch_flags()

    def build(family: str) -> str:
        name = library_name("cuda", family)
        sources = [str(root / path) for path in LIBRARIES["cuda"][family]]
        _load(
            name,
            sources,
            extra_cflags=["-O3"],
            extra_cuda_cflags=["-O3", "-lineinfo"] + arch_flags + _cuda_defines(arch_flags),
            extra_include_paths=[str(root)],
        )
        return name

    return _build_side_by_side("cuda", build)


def main() -> None:
    """Prebuild the kernels for this machine and report what was built.

    With a GPU, the CPU libraries compile in a child process while this one compiles the CUDA ones
    (each a ninja build of parallel translation units); both then load from the cache."""
    import subprocess

    start = time.perf_counter()
    from bitcompile import ops

    cpu_child = None
    if torch.cuda.is_available():
        command = [sys.executable, "-c", "from bitcompile import ops; ops.load_kernels('cpu')"]
        cpu_child = subprocess.Popen(command)
        arch = _cuda_arch_flags() or os.environ.get("TORCH_CUDA_ARCH_LIST")
        print(f"bitcompile: building the CPU kernels and the CUDA kernels for {arch} ...", flush=True)
        print(f"  built {', '.join(ops.load_kernels('cuda'))} ({time.perf_counter() - start:.1f} s)", flush=True)
        if cpu_child.wait() != 0:
            print("bitcompile: the CPU build in the child process failed; building here to show the error", flush=True)
    else:
        print("bitcompile: building the CPU kernels ...", flush=True)
    print(f"  built {', '.join(ops.load_kernels('cpu'))} ({time.perf_counter() - start:.1f} s)")
    if not torch.cuda.is_available():
        print("bitcompile: no CUDA GPU visible, CUDA kernels not built")
