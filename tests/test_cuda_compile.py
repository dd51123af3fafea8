"""The CUDA sources compile for the H200 (sm_90a), and for older GPUs, without a GPU (DESIGN.md "Tests").

CI has nvcc but no GPU: every csrc/cuda/*.cu is compiled here with the local nvcc, ptxas must
report no register spills, and binary_linear and binary_conv2d must reach the b1 tensor cores with
AND.POPC (XOR.POPC is emulated on Hopper). The same sources must also build for Ampere (sm_80: no
thread-block clusters), the oldest GPUs the kernels support (_build.py refuses older ones with a
clear error). The .cu files are torch-free so this works with a CPU build of torch; the torch
bindings (csrc/cuda/*.cpp) are built and run on the GPU machine.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import sys
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CUDA_SOURCES = sorted((ROOT / "csrc" / "cuda").glob("*.cu"))
# The flags of bitcompile/_build.py on an H200 (Hopper needs the "a" target for wgmma).
ARCH_FLAG = "-gencode=arch=compute_90a,code=sm_90a"
B1_AND_MMA = "mma.sync.aligned.m16n8k256.row.col.s32.b1.b1.s32.and.popc"
# The oldest target that _build.py builds for.
OLDER_ARCH_FLAGS = {"sm_80": "-gencode=arch=compute_80,code=sm_80"}
# Files whose kernels must not spill (a spill is a failure); the others get a warning until tuned.
NO_SPILL_SOURCES = {"pack_signs.cu", "binary_linear.cu", "binary_linear_wgmma.cu", "binary_weight_linear.cu",
                    "binary_weight_wgmma.cu", "binary_weight_planes_wgmma.cu", "binary_conv2d.cu",
                    "binary_conv2d_pipelined.cu", "binary_conv2d_halo.cu", "binary_conv2d_wgmma.cu", "apot_wgmma.cu"}
# Exactly these spills are allowed (ptxas_summary lines). binary_conv2d_pipelined.cu's fp32 128 x 64 tile of 2-word
# pieces runs three blocks an SM (80 registers): since the residual epilogue (store_staged) it keeps one 4-byte value
# in local memory, stored once before the main loop and loaded once before and once after it (cuobjdump SASS: no
# LDL / STL inside the loop). Every variant tried kept it (the residual's loop not unrolled, called __noinline__, read into
# the staged tile first, 8-byte vectors); the other OutT forms do not spill.
KNOWN_SPILLS = (
    r"\w*binary_conv2d_pipelined_kernelILi128ELi64ELi4ELi2ELi1ELi2EfE\w*: "
    r"8 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads",
)
HGMMA_A_CHECK = ROOT / "benchmarks" / "kernels" / "hgmma_a_check.py"


def _find_tool(name: str) -> Path | None:
    candidates = [Path(os.environ[var]) / "bin" / name for var in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(var)]
    candidates.append(Path("/usr/local/cuda/bin") / name)
    on_path = shutil.which(name)
    if on_path:
        candidates.append(Path(on_path))
    return next((c for c in candidates if c.is_file() and os.access(c, os.X_OK)), None)


NVCC = _find_tool("nvcc")
pytestmark = pytest.mark.skipif(
    NVCC is None, reason="nvcc not found in $CUDA_HOME/bin, $CUDA_PATH/bin, /usr/local/cuda/bin or PATH"
)


class Compiled:
    def __init__(self, source: Path, returncode: int, log: str, obj: Path, keep_dir: Path):
        self.source, self.returncode, self.log, self.obj, self.keep_dir = source, returncode, log, obj, keep_dir

    def ptx(self) -> str:
        """The PTX nvcc kept (-keep)."""
        return "\n".join(path.read_text() for path in self.keep_dir.glob("*.ptx"))

    @functools.cached_property
    def sass(self) -> subprocess.CompletedProcess | None:
        """cuobjdump --dump-sass of the object, run once a source; None where cuobjdump is not installed."""
        cuobjdump = _find_tool("cuobjdump")
        if cuobjdump is None:
            return None
        return subprocess.run([str(cuobjdump), "--dump-sass", str(self.obj)], capture_output=True, text=True)

    def ptxas_summary(self) -> str:
        """One line per kernel: registers, shared memory, spills (from -Xptxas -v)."""
        lines, kernel = [], None
        for line in self.log.splitlines():
            match = re.search(r"Compiling entry function '(\w+)'", line)
            if match:
                kernel = match.group(1)
            elif kernel and ("spill" in line or "Used" in line):
                report = re.sub(r"^ptxas info\s*:", "", line.strip()).strip()
                lines.append(f"{kernel}: {report}")
        return "\n".join(lines)


def _compile_all(out_dir: Path, arch_flag: str) -> dict[str, Compiled]:
    """Compiles every .cu for one target, in parallel (one nvcc call per file)."""

    def build(source: Path) -> Compiled:
        keep_dir = out_dir / source.stem
        keep_dir.mkdir()
        obj = out_dir / f"{source.stem}.o"
        command = [
            str(NVCC), "-std=c++17", "-O3", arch_flag, "-Xptxas", "-v", "-keep", "-keep-dir", str(keep_dir),
            "-I", str(ROOT / "csrc"), "-c", str(source), "-o", str(obj),
        ]
        process = subprocess.run(command, capture_output=True, text=True, timeout=900)
        return Compiled(source, process.returncode, process.stdout + process.stderr, obj, keep_dir)

    workers = max(1, min(len(CUDA_SOURCES), os.cpu_count() or 1))
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return {c.source.name: c for c in pool.map(build, CUDA_SOURCES)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, Compiled]:
    return _compile_all(tmp_path_factory.mktemp("cuda_objects"), ARCH_FLAG)


@pytest.mark.parametrize("name", [source.name for source in CUDA_SOURCES])
def test_cuda_source_compiles_for_sm90a(compiled, name):
    result = compiled[name]
    assert result.returncode == 0, f"nvcc failed on {name}:\n{result.log}"
    print(f"\n{name}:\n{result.ptxas_summary()}")


@pytest.mark.parametrize("name", [source.name for source in CUDA_SOURCES])
def test_cuda_kernels_do_not_spill(compiled, name):
    result = compiled[name]
    assert result.returncode == 0, f"nvcc failed on {name}:\n{result.log}"
    spills = re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", result.log)
    assert spills, f"no ptxas -v report for {name}:\n{result.log}"
    spilling = [line for line in result.ptxas_summary().splitlines() if re.search(r"[1-9]\d* bytes spill", line)
                and not any(re.fullmatch(known, line) for known in KNOWN_SPILLS)]
    message = f"{name}: kernels spill registers to local memory:\n" + "\n".join(spilling)
    if name in NO_SPILL_SOURCES:
        assert not spilling, message
    elif spilling:
        warnings.warn(message)


@pytest.mark.parametrize("name", ["binary_linear.cu", "binary_conv2d.cu", "binary_conv2d_pipelined.cu",
                                  "binary_conv2d_halo.cu"])
def test_binary_ops_use_b1_and_popc_tensor_cores(compiled, name):
    result = compiled[name]
    assert result.returncode == 0, result.log
    ptx = result.ptx()
    assert B1_AND_MMA in ptx, f"{name} does not use mma.sync m16n8k256 b1 AND.POPC"
    assert "xor.popc" not in ptx, "XOR.POPC is emulated on Hopper (7x slower): use AND.POPC"
    sass = result.sass
    if sass is not None and sass.returncode == 0:  # the SASS too, where the disassembler is installed
        assert "BMMA.168256.AND.POPC" in sass.stdout


def test_binary_linear_wgmma_uses_b1_wgmma(compiled):
    """binary_linear's sm_90 kernel (the persistent one) reaches wgmma b1 AND.POPC (SASS BGMMA), and ptxas does not
    serialize it."""
    result = compiled["binary_linear_wgmma.cu"]
    assert result.returncode == 0, result.log
    ptx = result.ptx()
    for n in (128, 256):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k256.s32.b1.b1.and.popc" in ptx
    assert "serialized" not in result.log, f"ptxas serialized the wgmma pipeline:\n{result.log}"
    sass = result.sass
    if sass is not None and sass.returncode == 0:
        assert "BGMMA.64x256x256.AND.POPC" in sass.stdout and "BGMMA.64x128x256.AND.POPC" in sass.stdout


def test_binary_weight_planes_wgmma_uses_b1_wgmma(compiled):
    """binary_weight_planes_wgmma.cu (W1A16 at M <= 32 as bit planes of x): wgmma b1 AND.POPC at each plane tile's N
    (24, 48, 96, 192: 24 planes a row of x, 1 to 16 rows a block), TMA loads, and ptxas does not serialize it."""
    result = compiled["binary_weight_planes_wgmma.cu"]
    assert result.returncode == 0, result.log
    assert not re.search(r"C751[0-9]|serializ", result.log), result.log
    ptx = result.ptx()
    for n in (24, 48, 96, 192):
        assert f"wgmma.mma_async.sync.aligned.m64n{n}k256.s32.b1.b1.and.popc" in ptx, n
    assert "cp.async.bulk.tensor.2d" in ptx
    sass = result.sass
    if sass is not None and sass.returncode == 0:
        assert "BGMMA.64x192x256.AND.POPC" in sass.stdout and "BGMMA.64x24x256.AND.POPC" in sass.stdout


def test_binary_conv2d_wgmma_uses_b1_wgmma(compiled):
    """binary_conv2d's sm_90a kernel (binary_conv2d_wgmma_kernel) reaches wgmma b1 AND.POPC (SASS BGMMA) at its
    128-channel tile, fits two blocks an SM (<= 102 registers for 320 threads), ptxas neither serializes its wgmmas (C7510 / C7513 / C7520) nor injects warpgroup arrives into its
    step-count branches (C7519), and its producer publishes the cp.async gather to the async proxy."""
    result = compiled["binary_conv2d_wgmma.cu"]
    assert result.returncode == 0, result.log
    assert not re.search(r"C751[0-9]|C752[0-9]|serializ", result.log), result.log
    ptx = result.ptx()
    assert "wgmma.mma_async.sync.aligned.m64n128k256.s32.b1.b1.and.popc" in ptx
    assert "fence.proxy.async.shared::cta" in ptx and "cp.async.bulk.tensor.2d" in ptx
    registers = re.findall(r"Compiling entry function '\w*binary_conv2d_wgmma_kernel\w*'.*?Used (\d+) registers",
                           result.log, re.S)
    assert registers and all(int(r) <= 102 for r in registers), registers
    sass = result.sass
    if sass is not None and sass.returncode == 0:
        assert "BGMMA.64x128x256.AND.POPC" in sass.stdout


def test_binary_weight_wgmma_runs_asynchronously(compiled):
    """binary_weight_wgmma.cu: wgmma.mma_async in the PTX, no "wgmma serialized" ptxas warning (C7510 / C7513: ptxas
    then waits for every wgmma, most of the speed gone), and, where cuobjdump is installed, no instruction writing
    the A registers of an HGMMA still in flight (undefined behaviour; benchmarks/kernels/hgmma_a_check.py)."""
    result = compiled["binary_weight_wgmma.cu"]
    assert result.returncode == 0, result.log
    assert not re.search(r"C751[03]|serializ", result.log), result.log
    ptx = result.ptx()
    assert "wgmma.mma_async.sync.aligned.m64n" in ptx
    sass = result.sass
    if sass is not None:
        assert sass.returncode == 0 and "HGMMA" in sass.stdout, sass.stderr
        listing = result.keep_dir / "wgmma.sass"
        listing.write_text(sass.stdout)
        check = subprocess.run([sys.executable, str(HGMMA_A_CHECK), str(listing)], capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_binary_linear_persistent_kernel_sass(compiled):
    """The persistent wgmma kernel: per instantiation BGMMA, TMA loads, TMA stores and the
    setmaxnreg register hand-over reach the SASS."""
    result = compiled["binary_linear_wgmma.cu"]
    assert result.returncode == 0, result.log
    sass = result.sass
    if sass is None:
        pytest.skip("cuobjdump not installed")
    if sass.returncode != 0:
        pytest.skip(f"cuobjdump failed: {sass.stderr}")
    functions = [f for f in re.split(r"\n\s+Function : ", sass.stdout)[1:] if "binary_linear_persistent_kernel" in f]
    assert len(functions) == 6, f"expected 6 persistent instantiations (2 tile widths x 3 outputs), got {len(functions)}"
    for body in functions:
        name = body.split("\n", 1)[0]
        n = 256 if "ILi256E" in name else 128
        for op in (f"BGMMA.64x{n}x256.AND.POPC", "UTMALDG", "UTMASTG", "USETMAXREG"):
            assert op in body, f"{op} missing from {name}"


@pytest.mark.parametrize("arch", sorted(OLDER_ARCH_FLAGS))
def test_cuda_sources_compile_for_older_gpus(tmp_path, arch):
    results = _compile_all(tmp_path, OLDER_ARCH_FLAGS[arch])
    for name, result in results.items():
        assert result.returncode == 0, f"nvcc failed on {name} for {arch}:\n{result.log}"


@pytest.mark.parametrize("check", ["wgmma_fragment_check.cpp", "wgmma_ws_layout_check.cpp", "apot_fragment_check.cpp"])
def test_wgmma_host_checks(tmp_path, check):
    """The host checks of the W1A16 wgmma kernels' layouts (benchmarks/kernels: the A fragment expansion, and one
    emulated block of the warp-specialized kernel: TMA / descriptor / W-word / accumulator index arithmetic)."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found")
    binary = tmp_path / "check"
    build = subprocess.run([compiler, "-std=c++17", "-O2", "-I", str(ROOT / "csrc"),
                            str(ROOT / "benchmarks" / "kernels" / check), "-o", str(binary)],
                           capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr
    run = subprocess.run([str(binary)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.startswith("OK"), run.stdout + run.stderr
