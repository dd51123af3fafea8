"""The warp-specialized wgmma kernels' plans (csrc/cuda/wgmma_ws.cuh, wgmma_rs.cuh): the K split, the slabs of the
M <= 64 tiles, the tile and the two-launch split of larger M, computed on the host from an SM count and the blocks
that clusters of 2-8 hold at once. No GPU: tests/wgmma_plans_probe.cu is built with nvcc (skipped without it) and
asked one plan a run. The GPU tests check that the launches follow these plans (the dispatch tests of
test_binary_ops.py / test_apot_ops.py) and are correct."""

from __future__ import annotations

import re
import subprocess

import pytest

from test_cuda_compile import NVCC, ROOT

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found")

# An H200-like device: 132 SMs; clusters of 2 hold 132 blocks, of 4 and 8 only 120 (measured); 3, 5, 6, 7 as given.
H200 = "132,126,120,120,120,112,120"


def _constant(name: str) -> tuple[str, ...]:
    """The numbers of `constexpr ... name{a, b, ...};` in binary_weight_wgmma.cu (the kernel's fitted times)."""
    source = (ROOT / "csrc" / "cuda" / "binary_weight_wgmma.cu").read_text()
    match = re.search(name + r"\{([^}]*)\}", source)
    assert match, f"{name} not found in binary_weight_wgmma.cu"
    return tuple(v.strip() for v in match.group(1).split(","))


SIGN_SMALL = _constant("kSignSmallTimes")
SIGN_BLOCKS = _constant("kSignBlockTimes")


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    binary = tmp_path_factory.mktemp("probe") / "wgmma_plans_probe"
    build = subprocess.run([str(NVCC), "-std=c++17", "-O1", "-I", str(ROOT / "csrc"),
                            str(ROOT / "tests" / "wgmma_plans_probe.cu"), "-o", str(binary)],
                           capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stderr[-4000:]

    def ask(*args) -> int:
        run = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, f"probe {args}: {run.stderr}"
        return int(run.stdout)

    return ask


@pytest.mark.parametrize("blocks, tiles, rooms, slices", [
    (32, 86, H200, 3),                        # x 4 = 128 > 120 (clusters of 4); x 3 = 96 fits: not a power of two
    (43, 32, H200, 2),                        # x 3 = 129 > 126: a second wave
    (43, 32, "132,132,120,120,120,112,120", 3),  # ... unless clusters of 3 hold 129
    (16, 86, H200, 7),                        # x 7 = 112 fits, x 8 = 128 does not
    (16, 86, "132,126,120,120,120,105,120", 6),  # clusters of 7 hold only 105
    (16, 5, H200, 5),                         # at most one slice a 128-k tile
    (64, 64, H200, 2),
    (66, 64, H200, 2),                        # 132 blocks: exactly one wave
    (67, 64, H200, 1),
    (200, 64, H200, 1),                       # past one wave without a split: no split
    (32, 86, "0,0,0,0,0,0,0", 1),             # no clusters (before sm_90, or refused)
    (1, 86, "132,0,0,0,0,0,0", 2),            # only pairs
])
def test_split_k_slices_plan(probe, blocks, tiles, rooms, slices):
    assert probe("split", blocks, tiles, 132, 0, rooms) == slices


@pytest.mark.parametrize("wanted, tiles, rooms, slices", [
    (3, 86, H200, 3),                         # as asked, whatever the waves
    (6, 86, H200, 6),
    (8, 6, H200, 6),                          # at most one slice a tile
    (12, 86, H200, 8),                        # at most a portable cluster
    (5, 86, "132,126,120,0,120,112,120", 4),  # clusters of 5 refused: the next size down that the device holds
    (6, 86, "0,0,0,0,0,0,0", 1),
    (1, 86, H200, 1),
])
def test_split_k_slices_forced(probe, wanted, tiles, rooms, slices):
    assert probe("split", 32, tiles, 132, wanted, rooms) == slices


@pytest.mark.parametrize("rows, n, k, slabs", [
    (32, 8192, 8192, 1),    # 64 blocks x 2 (one wave) against 32 x 3: the shorter blocks win
    (64, 8192, 8192, 1),
    (32, 11008, 4096, 2),   # 43 blocks of 256 features x 2 (86 SMs) against 86 x 1 over the whole K
    (64, 11008, 4096, 1),   # (64, 2) costs more a tile: 86 x 1 of (64, 1)
    (32, 11008, 1024, 1),   # 8 tiles: a block's fixed time outweighs the split
    (32, 28672, 1024, 2),   # 224 blocks of 128 features take two waves, 112 of 256 one
    (64, 28672, 8192, 2),
    (32, 4096, 4096, 1),    # 32 blocks x 3 against 16 x 7
    (64, 4096, 1024, 1),
])
def test_small_m_slabs(probe, rows, n, k, slabs):
    assert probe("slabs", rows, n, k, 132, *SIGN_SMALL, H200) == slabs


@pytest.mark.parametrize("m, n, k, rows", [
    (129, 8192, 8192, 192),   # one (192, 1) row block x 64 feature blocks, K in two, against two (128, 1) ones
    (256, 8192, 8192, 256),
    (384, 8192, 1024, 192),   # 2 x 64 blocks of 192 rows: one wave
    (512, 8192, 8192, 256),
    (160, 4096, 11008, 192),  # 32 blocks x 3 against (128, 1): 64 x 2
    (96, 4096, 11008, 128),
])
def test_tile_by_cost(probe, m, n, k, rows):
    assert probe("rows", m, n, k, 132, *SIGN_BLOCKS, H200) == rows


@pytest.mark.parametrize("m, n, k, head", [
    (384, 8192, 1024, 0),     # one wave in one launch
    (448, 8192, 1024, 192),   # 192 + 256 (the dispatch test's plan on the H200)
    (640, 8192, 1024, 384),   # 384 + 256
    (300, 8192, 1024, 0),     # both launches would keep more than 160 rows: not here
])
def test_two_launch_split(probe, m, n, k, head):
    assert probe("head", m, n, k, 132, *SIGN_BLOCKS, H200) == head
