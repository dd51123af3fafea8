"""APoT kernels (pack_codes, apot_linear, apot_linear_int, apot_conv2d) against bitcompile.reference.

Every test takes the `device` fixture, so the same tests run on CUDA on the GPU machine.
"""

import itertools
import re

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from bitcompile import ops, reference
from conftest import (FLOAT_DTYPES, assert_close_relative, profiled_kernel_counts, profiled_kernels, requires_cuda,
                      skip_without_wgmma)

# Signed schemes of SPEC 2.5: one sign bit above the magnitude index, level = sign * N / D.
SCHEMES = {
    "apot3": (3, 4, [0, 1, 2, 4]),
    "apot4": (4, 10, [0, 1, 2, 3, 4, 6, 8, 10]),
    "apot5": (5, 48, [0, 1, 2, 3, 4, 6, 8, 9, 12, 16, 18, 24, 32, 33, 36, 48]),
}


def signed_numerators(scheme):
    """int32 numerators of the sign-magnitude codes of a scheme: code = sign << (bits-1) | index."""
    bits, denominator, magnitudes = SCHEMES[scheme]
    magnitudes = torch.tensor(magnitudes, dtype=torch.int32)
    return torch.cat((magnitudes, -magnitudes)), denominator


def code_table(bits, kind="random"):
    """float32 code_values of 2**bits entries: a scheme's signed table or random levels."""
    if kind == "scheme":
        scheme = {3: "apot3", 4: "apot4", 5: "apot5"}[bits]
        numerators, denominator = signed_numerators(scheme)
        return numerators.to(torch.float32) / denominator
    return torch.randn(2**bits, dtype=torch.float32)


def random_codes(shape, bits, dtype=torch.int64):
    high = 2**bits
    if dtype == torch.int8:
        high = min(high, 128)
    return torch.randint(0, high, shape, dtype=dtype)


def make_weight(n, k, bits, device, table_kind="random"):
    codes = random_codes((n, k), bits)
    packed = reference.pack_codes(codes, bits).to(device)
    return codes, packed, code_table(bits, table_kind).to(device)


def make_alpha(n, per_channel, device):
    shape = (n,) if per_channel else ()
    return (torch.rand(shape) + 0.5).to(device)


# ----------------------------------------------------------------------------------------------
# pack_codes
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("k", [1, 2, 7, 8, 33])
def test_pack_codes_layout_and_round_trip(device, bits, k):
    for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64):
        codes = random_codes((3, 5, k), bits, dtype)
        packed = ops.pack_codes(codes.to(device), bits)
        assert packed.dtype == torch.uint8 and packed.device.type == device
        assert packed.shape == (3, 5, ops.packed_code_bytes(k, bits))
        assert torch.equal(packed.cpu(), reference.pack_codes(codes, bits)), (bits, k, dtype)
        assert torch.equal(reference.unpack_codes(packed.cpu(), k, bits), codes.to(torch.int64))


def test_pack_codes_exact_nibbles(device):
    codes = torch.tensor([[1, 2, 3, 4, 5], [15, 0, 0, 15, 9]], device=device)
    packed = ops.pack_codes(codes, 4).cpu()
    assert packed.tolist() == [[0x21, 0x43, 0x05], [0x0F, 0xF0, 0x09]]
    assert ops.pack_codes(codes, 5).cpu().tolist() == codes.cpu().tolist()


def test_pack_codes_non_contiguous_and_empty(device):
    codes = random_codes((9, 40), 4).to(device)
    view = codes[::2, 1::3]
    assert torch.equal(ops.pack_codes(view, 4).cpu(), reference.pack_codes(view.cpu(), 4))
    empty = ops.pack_codes(torch.zeros((0, 7), dtype=torch.int64, device=device), 3)
    assert empty.shape == (0, 4)


@pytest.mark.parametrize("bits", [1, 4, 5, 8])
@pytest.mark.parametrize("bad", ["high", "negative"])
def test_pack_codes_out_of_range(device, bits, bad):
    codes = random_codes((4, 9), bits)
    codes[2, 3] = 2**bits if bad == "high" else -1
    with pytest.raises(RuntimeError, match="bitcompile::pack_codes: code out of range"):
        ops.pack_codes(codes.to(device), bits)


# ----------------------------------------------------------------------------------------------
# apot_linear
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [1, 31, 33, 127, 129, 1000])
@pytest.mark.parametrize("m", [0, 1, 7, 64])
@pytest.mark.parametrize("n", [1, 65])
def test_apot_linear(device, dtype, k, m, n):
    # Vary bits, alpha kind and bias over the cases (a full product would be slow on CI's 2 cores).
    case = k + 3 * m + 7 * n + FLOAT_DTYPES.index(dtype)
    bits = [4, 3, 8, 5, 2, 4, 6, 1, 7][case % 9]
    per_channel, with_bias = case % 2 == 0, case % 3 != 0
    _, packed, table = make_weight(n, k, bits, device, "scheme" if bits in (3, 4, 5) else "random")
    alpha = make_alpha(n, per_channel, device)
    bias = torch.randn(n, device=device) if with_bias else None
    x = torch.randn(m, k, device=device).to(dtype)
    y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
    assert y.dtype == dtype and y.shape == (m, n) and y.device.type == device
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), cpu(bias))
    # Few outputs (m = 1, n = 1) can cancel to far below their terms: floor the measure with the
    # root of the sum of the squared terms (conftest.assert_close_relative).
    magnitude = reference.apot_linear(x.cpu().double().square(), packed.cpu(), k, bits, table.cpu().double().square(),
                                      alpha.cpu().double().square()).sqrt()
    if bias is not None:
        magnitude = magnitude + bias.cpu().double().abs()
    assert_close_relative(y, expected, dtype, f"bits={bits} k={k} m={m} n={n}", magnitude)


@pytest.mark.parametrize("bits", range(1, 9))
@pytest.mark.parametrize("m", [1, 5, 16, 17, 32, 33, 40])  # CPU: small-batch kernel up to 32 rows; CUDA: up to 16
def test_apot_linear_every_bits(device, bits, m):
    k, n = 77, 40
    _, packed, table = make_weight(n, k, bits, device)
    alpha = make_alpha(n, True, device)
    x = torch.randn(m, k, device=device)
    y = ops.apot_linear(x, packed, k, bits, table, alpha)
    assert_close_relative(y, reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu()), torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_apot_linear_leading_dims_and_non_contiguous(device, dtype):
    k, n, bits = 129, 33, 4
    _, packed, table = make_weight(n, k, bits, device, "scheme")
    alpha = make_alpha(n, True, device)
    bias = torch.randn(n, device=device)
    for x in (
        torch.randn(2, 3, k, device=device).to(dtype),             # leading dims, small batch
        torch.randn(4, 2 * k, device=device).to(dtype)[:, ::2],    # strided last dim
        torch.randn(k, 40, device=device).to(dtype).t(),           # transposed, large batch
        torch.randn(5, 9, k, device=device).to(dtype).transpose(0, 1),
        torch.randn(k, device=device).to(dtype),                   # 1-D x
    ):
        y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
        assert y.shape == (*x.shape[:-1], n) and y.dtype == dtype
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
        assert_close_relative(y, expected, dtype, f"x shape {tuple(x.shape)}")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [32, 64, 1024, 2080, 3001])
def test_apot_linear_aligned_and_multi_tile(device, bits, k):
    # K a multiple of 32 (nibbles) / 16 (bytes) gives 16-byte aligned weight rows (vector loads in
    # the CUDA small-batch kernel); K > 1024 takes several x tiles there.
    n = 70
    _, packed, table = make_weight(n, k, bits, device)
    alpha = make_alpha(n, True, device)
    bias = torch.randn(n, device=device)
    for m in (1, 5, 16):
        x = torch.randn(m, k, device=device)
        y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
        assert_close_relative(y, expected, torch.float32, f"m={m}")


def test_apot_linear_large_weight(device):
    # Big enough that the CPU GEMM path decodes the weight in several blocks.
    k, n, m, bits = 1000, 1100, 24, 4
    _, packed, table = make_weight(n, k, bits, device, "scheme")
    alpha = make_alpha(n, True, device)
    bias = torch.randn(n, device=device)
    x = torch.randn(m, k, device=device)
    y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
    expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
    assert_close_relative(y, expected, torch.float32)


# ----------------------------------------------------------------------------------------------
# apot_linear at the edges of the CUDA small-batch kernel: 16 rows of 16-bit x a launch, 8 of fp32 (m = 8, 9), the
# switch to the wgmma kernel or dequantize + GEMM past kSmallBatchRows = 16 (m = 16, 17), rows of whole 16-byte
# pieces (k = 256, 2080) or not (k = 300: the byte-load kernel), nibble and byte codes, K split over many blocks (few
# outputs), and values far from 1 (the kernel scales the levels and each 128 columns of x by powers
# of two into fp16).
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [256, 300, 2080])
def test_apot_linear_batch_edges(device, dtype, bits, k):
    n = 100  # not a multiple of the kernel's 16-row tiles
    _, packed, table = make_weight(n, k, bits, device)
    alpha = make_alpha(n, True, device)
    bias = torch.randn(n, device=device)
    for m in (8, 9, 16, 17):
        x = torch.randn(m, k, device=device).to(dtype)
        y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
        assert_close_relative(y, expected, dtype, f"m={m} bits={bits} k={k}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("n", [1, 3])
def test_apot_linear_few_outputs_long_k(device, dtype, n):
    k, bits = 8192, 4
    _, packed, table = make_weight(n, k, bits, device, "scheme")
    alpha = make_alpha(n, False, device)
    for m in (1, 2):
        x = torch.randn(m, k, device=device).to(dtype)
        y = ops.apot_linear(x, packed, k, bits, table, alpha)
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu())
        magnitude = reference.apot_linear(x.cpu().double().square(), packed.cpu(), k, bits,
                                          table.cpu().double().square(), alpha.cpu().double().square()).sqrt()
        assert_close_relative(y, expected, dtype, f"n={n} m={m}", magnitude)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("bits", [4, 8])
def test_apot_linear_wide_range(device, dtype, bits):
    # x spans 10^+-6 (10^+-3 in fp16) within each row; levels near 1e-20 and alpha near 1e17 (1e20).
    k, n, m = 1000, 40, 3
    _, packed, table = make_weight(n, k, bits, device)
    table = table * 1e-20
    alpha = make_alpha(n, True, device) * (1e17 if dtype == torch.float16 else 1e20)
    decades = 3.0 if dtype == torch.float16 else 6.0
    x = (torch.randn(m, k) * torch.pow(10.0, (torch.rand(m, k) * 2 - 1) * decades)).to(dtype).to(device)
    y = ops.apot_linear(x, packed, k, bits, table, alpha)
    expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu())
    assert_close_relative(y, expected, dtype, f"bits={bits}")


# ----------------------------------------------------------------------------------------------
# apot_linear on the Hopper wgmma kernels (apot_wgmma.cu: kSmallBatchRows < m <= kWgmmaMaxRows = 4096, the
# warp-specialized kernel; bf16 / fp16 x, nibble codes, k % 64 == 0, aligned operands; elsewhere dequantize + cuBLAS)
# ----------------------------------------------------------------------------------------------
@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("bits", [2, 3, 4])
def test_apot_linear_wgmma_edges_cuda(dtype, bits):
    """Both sides of every switch: 16 / 17 rows (small-batch kernel / warp-specialized wgmma kernel), 32 / 33 and
    64 / 65 (its 32-, 64- and 128-row tiles), 128 / 129 and 256 / 257 (the cost model's tiles), 512 / 513 (the
    limit until the forty-fifth session), 4096 / 4097 (dequantize + cuBLAS above); N not a multiple of 8; k = 1000
    (not a multiple of 64: the fallback), k = 4096 (the K split) and
    k = 4160 (k % 128 == 64: the warp-specialized kernel's half tile); per-output alpha and bias."""
    n = 100
    for k in (1000, 4096, 4160):
        _, packed, table = make_weight(n, k, bits, "cuda")
        alpha = make_alpha(n, True, "cuda")
        bias = torch.randn(n, device="cuda")
        for m in (16, 17, 32, 33, 64, 65, 128, 129, 256, 257, 512, 513, 4096, 4097):
            x = torch.randn(m, k, device="cuda").to(dtype)
            y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
            expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
            assert_close_relative(y, expected, dtype, f"m={m} k={k} bits={bits}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_apot_linear_wgmma_ws_tiles_cuda(dtype):
    """The warp-specialized kernel's tiles at N = 8192 (64 feature blocks), K = 1024: (192, 1) at 129-384 rows,
    (256, 1) at 448-512, on both sides of each switch; at N = 4096 (32 feature blocks) K split 3 ways (a cluster of 3)
    on every tile, K = 1088 (8.5 tiles: 3 + 3 + 2.5); per-output alpha and bias."""
    bits = 4
    cases = [(8192, 1024, m) for m in (129, 192, 193, 384, 385, 448, 512)]
    cases += [(4096, 1088, m) for m in (17, 32, 64, 96, 160, 256)]
    for n, k, m in cases:
        _, packed, table = make_weight(n, k, bits, "cuda", "scheme")
        alpha = make_alpha(n, True, "cuda")
        bias = torch.randn(n, device="cuda")
        x = torch.randn(m, k, device="cuda").to(dtype)
        y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
        assert_close_relative(y, expected, dtype, f"m={m} n={n} k={k} bits={bits}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_apot_linear_wgmma_wide_range_and_misaligned_cuda(dtype):
    """Levels near 1e-20 with alpha near 1e17 (outside fp16's range as levels: the kernel scales the table by a power
    of two and the accumulators back), and an x 2 bytes off 16-byte alignment (the kernel refuses it: the fallback)."""
    k, n, m = 1024, 40, 40
    _, packed, table = make_weight(n, k, 4, "cuda", "scheme")
    table = table * 1e-20
    alpha = make_alpha(n, True, "cuda") * 1e17
    x = torch.randn(m, k, device="cuda").to(dtype)
    y = ops.apot_linear(x, packed, k, 4, table, alpha)
    expected = reference.apot_linear(x.cpu(), packed.cpu(), k, 4, table.cpu(), alpha.cpu())
    assert_close_relative(y, expected, dtype, "wide range")
    storage = torch.empty(m * k + 1, device="cuda", dtype=dtype)
    shifted = storage[1:].view(m, k)
    shifted.copy_(x)
    assert shifted.data_ptr() % 16 != 0
    assert_close_relative(ops.apot_linear(shifted, packed, k, 4, table, alpha), expected, dtype, "misaligned x")


@requires_cuda
@pytest.mark.parametrize("bits, dtype, k", [(4, torch.float32, 12288), (4, torch.float32, 12289),
                                            (5, torch.bfloat16, 6144), (5, torch.bfloat16, 6208)])
def test_apot_linear_small_batch_split_edges_cuda(bits, dtype, k):
    """Both sides of plan_small_batch's short-K rule (apot_kernels.cu) at N = 6144 on a 132-SM H200: past one wave a
    warp holding 12 chunks of the unsplit K drops the K split (apot4 fp32 x k = 12288, apot5 k = 6144), 13 chunks keep
    it (k = 12289, 6208); m = 1 and 4 rows, per-output alpha and bias."""
    n = 6144
    _, packed, table = make_weight(n, k, bits, "cuda", "scheme")
    alpha = make_alpha(n, True, "cuda")
    bias = torch.randn(n, device="cuda")
    for m in (1, 4):
        x = torch.randn(m, k, device="cuda").to(dtype)
        y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
        assert_close_relative(y, expected, dtype, f"m={m} k={k} bits={bits}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("table_kind", ["scheme", "random", "past_bf16"])
@pytest.mark.parametrize("n, k", [(100, 2080), (100, 300), (24, 8192)])
def test_apot_linear_small_batch_sixteen_rows_cuda(dtype, table_kind, n, k):
    """16-bit x of 9-16 rows in one launch of the small-batch kernel (two 8-row B fragments meet each A fragment), at
    its edges: m = 8 (one fragment), 9, 15, 16. Tables: apot4 (integral: bf16 x on the bf16 MMA, fp16 on fp16),
    random levels (fp16 hi + lo parts), and integer multiples of 1/64 up to 300 (past bf16's exact 256: the hi + lo
    path for bf16 x, the integral one for fp16). Rows of whole 16-byte pieces (1 and 2 tiles a block), the byte-load
    kernel (k = 300) and K split over a cluster (n = 24, k = 8192); per-output alpha and bias."""
    bits = 4
    codes = random_codes((n, k), bits)
    packed = reference.pack_codes(codes, bits).cuda()
    if table_kind == "past_bf16":
        table = torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89, 144, 233, 300, -1, -300]) / 64.0
    else:
        table = code_table(bits, table_kind)
    alpha = make_alpha(n, True, "cuda")
    bias = torch.randn(n, device="cuda")
    for m in (8, 9, 15, 16):
        x = torch.randn(m, k, device="cuda").to(dtype)
        y = ops.apot_linear(x, packed, k, bits, table.cuda(), alpha, bias)
        expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table, alpha.cpu(), bias.cpu())
        assert_close_relative(y, expected, dtype, f"m={m} n={n} k={k} table={table_kind}")


@requires_cuda
def test_apot_linear_small_batch_launches_cuda():
    """One launch of the small-batch kernel serves up to 16 rows of bf16 / fp16 x (W read once: M = 16 at 8192^2 on
    the H200 37.96 -> 25.14 us against two launches), 8 rows of fp32 x."""
    k, n = 1024, 256
    _, packed, table = make_weight(n, k, 4, "cuda", "scheme")
    alpha = make_alpha(n, True, "cuda")

    def launches(m, dtype):
        x = torch.randn(m, k, device="cuda").to(dtype)
        kernel = "linear_small_batch_kernel"
        counts = profiled_kernel_counts(lambda: ops.apot_linear(x, packed, k, 4, table, alpha), (kernel,))
        return sum(count for name, count in counts.items() if kernel in name)

    for dtype, m, expected in [(torch.bfloat16, 8, 1), (torch.bfloat16, 9, 1), (torch.bfloat16, 16, 1),
                               (torch.float16, 16, 1), (torch.float32, 8, 1), (torch.float32, 9, 2),
                               (torch.float32, 16, 2)]:
        assert launches(m, dtype) == expected, (dtype, m)


@requires_cuda
def test_apot_linear_wgmma_dispatch_cuda():
    """On a 9.0 GPU with sm_90a code the op takes the warp-specialized wgmma kernel from 17 rows up to kWgmmaMaxRows =
    4096 (one row block of 32 rows up to 32, of 64 up to 64), and neither beyond; 16 rows stay on the small-batch
    kernel."""
    skip_without_wgmma()
    k, n = 1024, 256
    _, packed, table = make_weight(n, k, 4, "cuda", "scheme")
    alpha = make_alpha(n, True, "cuda")

    def kernels(m):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        names = profiled_kernels(lambda: ops.apot_linear(x, packed, k, 4, table, alpha),
                                 ("apot", "linear_small_batch", "dequantize"))
        return {"small": any("linear_small_batch" in name for name in names),
                "ws": any("apot_wgmma_ws_kernel" in name for name in names)}

    none = {"small": False, "ws": False}
    assert kernels(16) == {**none, "small": True}
    for m in (17, 64, 65, 256, 512, 513, 4096):
        assert kernels(m) == {**none, "ws": True}, m
    assert kernels(4097) == none
    # N = 8192 (64 feature blocks): one row block of 32 / 64 rows up to 64, (128, 1) up to 128, (192, 1) at 129-384
    # rows (one wave), (256, 1) at 448 and 512.
    k, n = 1024, 8192
    _, packed, table = make_weight(n, k, 4, "cuda", "scheme")
    alpha = make_alpha(n, True, "cuda")
    for m, rows in ((17, 32), (32, 32), (33, 64), (64, 64), (65, 128), (129, 192), (384, 192), (448, 256), (512, 256)):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        names = profiled_kernels(lambda: ops.apot_linear(x, packed, k, 4, table, alpha), ("apot",))
        tiles = [re.search(r"apot_wgmma_ws_kernel<[^,<>]+,\s*(\d+)\s*>", name) for name in names]
        others = ("linear_small_batch", "dequantize")
        assert [int(t.group(1)) for t in tiles if t] == [rows], (m, names)
        assert not any(other in name for name in names for other in others), (m, names)


# ----------------------------------------------------------------------------------------------
# apot_linear_int
# ----------------------------------------------------------------------------------------------
def numerator_table(bits, kind):
    if kind == "scheme":
        scheme = {3: "apot3", 4: "apot4", 5: "apot5"}[bits]
        return signed_numerators(scheme)[0]
    if kind == "int8":
        return torch.randint(-128, 128, (2**bits,), dtype=torch.int32)
    if kind == "mid":  # int32 partial sums flushed to int64 every few dozen products / 2 tiles
        return torch.randint(-(2**17), 2**17, (2**bits,), dtype=torch.int32)
    # "wide": numerators so large that products q * N no longer fit int32 chunks (int64 path)
    return torch.randint(-(2**30), 2**30, (2**bits,), dtype=torch.int32)


INT_CASES = [
    (4, "scheme"), (3, "scheme"), (5, "scheme"), (1, "int8"), (2, "int8"), (6, "int8"), (8, "int8"),
    (4, "mid"), (6, "mid"), (4, "wide"), (7, "wide"),
]


@pytest.mark.parametrize("bits,kind", INT_CASES)
@pytest.mark.parametrize("k", [1, 33, 129, 1000])
@pytest.mark.parametrize("m", [0, 1, 7, 64])
def test_apot_linear_int_sums_exact(device, bits, kind, k, m):
    n = 65 if (k + m) % 2 else 1
    numerators = numerator_table(bits, kind)
    codes = random_codes((n, k), bits)
    packed = reference.pack_codes(codes, bits)
    q_x = torch.randint(0, 256, (m, k), dtype=torch.uint8)
    zero_point = torch.tensor(int(torch.randint(0, 256, ())), dtype=torch.int32 if k % 2 else torch.float32)
    sums = reference.apot_linear_int_sums(q_x, zero_point, packed, k, bits, numerators)
    one = torch.ones((), device=device)
    y = ops.apot_linear_int(
        q_x.to(device), one, zero_point.to(device), packed.to(device), k, bits, numerators.to(device), 1.0, one
    )
    assert y.dtype == torch.float32 and y.shape == (m, n)
    if kind in ("scheme", "int8") and sums.numel():
        assert sums.abs().max().item() < 2**24
    # float32(S) is the exact integer below 2**24, and the correctly rounded one above.
    assert torch.equal(y.cpu(), sums.to(torch.float32)), f"bits={bits} kind={kind} k={k} m={m}"


@pytest.mark.parametrize("per_channel", [False, True])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("scheme", ["apot3", "apot4", "apot5"])
def test_apot_linear_int_scaled(device, per_channel, with_bias, scheme):
    bits = SCHEMES[scheme][0]
    numerators, denominator = signed_numerators(scheme)
    k, n = 300, 65
    codes = random_codes((n, k), bits)
    packed = reference.pack_codes(codes, bits)
    q_x = torch.randint(0, 256, (3, 11, k), dtype=torch.uint8)
    x_scale = torch.rand(()) * 0.1 + 0.01
    zero_point = torch.tensor([int(torch.randint(0, 256, ()))])
    alpha = make_alpha(n, per_channel, "cpu")
    bias = torch.randn(n) if with_bias else None
    expected = reference.apot_linear_int(q_x, x_scale, zero_point, packed, k, bits, numerators, float(denominator), alpha, bias)
    q_strided = torch.randint(0, 256, (3, 11, 2 * k), dtype=torch.uint8)
    q_strided[..., ::2] = q_x
    to = lambda t: None if t is None else t.to(device)  # noqa: E731
    y = ops.apot_linear_int(
        to(q_strided)[..., ::2], to(x_scale), to(zero_point), to(packed), k, bits, to(numerators),
        float(denominator), to(alpha), to(bias),
    )
    assert y.shape == (3, 11, n) and y.dtype == torch.float32
    assert_close_relative(y, expected, torch.float32)


def test_apot_linear_int_zero_point_outside_byte_range(device):
    bits, k, n = 4, 50, 9
    numerators = numerator_table(bits, "int8")
    packed = reference.pack_codes(random_codes((n, k), bits), bits)
    q_x = torch.randint(0, 256, (5, k), dtype=torch.uint8)
    for z in (-300, 1000, 2**20):
        zero_point = torch.tensor(z, dtype=torch.int64)
        sums = reference.apot_linear_int_sums(q_x, zero_point, packed, k, bits, numerators)
        one = torch.ones((), device=device)
        y = ops.apot_linear_int(q_x.to(device), one, zero_point.to(device), packed.to(device), k, bits,
                                numerators.to(device), 1.0, one)
        assert torch.equal(y.cpu(), sums.to(torch.float32)), z


# ----------------------------------------------------------------------------------------------
# apot_conv2d
# ----------------------------------------------------------------------------------------------
# (batch, channels, out_channels, H, W, kernel, stride, padding, dilation)
CONV_CASES = [
    (2, 3, 8, 9, 11, 3, 1, 1, 1),
    (1, 1, 1, 5, 5, 1, 1, 0, 1),
    (2, 16, 5, 13, 7, 3, 2, 0, 1),
    (1, 70, 33, 9, 9, 3, 1, 2, 2),
    (3, 5, 7, 15, 10, 5, 2, 2, 1),
    (1, 33, 4, 11, 13, 5, 1, 1, 2),
    (2, 2, 3, 7, 7, 1, 2, 1, 1),
    (1, 8, 16, 6, 17, (3, 5), (1, 2), (0, 2), (2, 1)),
]


def _pair(v):
    return tuple(v) if isinstance(v, tuple) else (v, v)


@pytest.mark.parametrize("case", CONV_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_apot_conv2d(device, case, dtype, channels_last):
    batch, c, oc, h, w, kernel, stride, padding, dilation = case
    kernel, stride, padding, dilation = map(_pair, (kernel, stride, padding, dilation))
    bits = [4, 5, 3, 8, 2][(c + oc) % 5]
    codes = random_codes((oc, kernel[0] * kernel[1] * c), bits)
    packed = reference.pack_codes(codes, bits).to(device)
    table = code_table(bits, "scheme" if bits in (3, 4, 5) else "random").to(device)
    alpha = make_alpha(oc, (c + h) % 2 == 0, device)
    bias = torch.randn(oc, device=device) if (oc + w) % 2 else None
    x = torch.randn(batch, c, h, w, device=device).to(dtype)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    y = ops.apot_conv2d(x, packed, c, kernel, stride, padding, dilation, bits, table, alpha, bias)
    expected = reference.apot_conv2d(x.cpu(), packed.cpu(), c, kernel, stride, padding, dilation, bits, table.cpu(),
                                     alpha.cpu(), None if bias is None else bias.cpu())
    assert y.dtype == dtype
    assert_close_relative(y, expected, dtype, str(case))
    memory_format = torch._prims_common.suggest_memory_format(x)
    assert y.is_contiguous(memory_format=memory_format)
    # The dequantized float weight, as the layer would hold it, gives the same result.
    weight = reference.apot_weight(packed.cpu(), kernel[0] * kernel[1] * c, bits, table.cpu(), alpha.cpu())
    weight = weight.reshape(oc, kernel[0], kernel[1], c).permute(0, 3, 1, 2)
    direct = torch.nn.functional.conv2d(x.cpu().double(), weight, None if bias is None else bias.cpu().double(),
                                        stride, padding, dilation)
    assert_close_relative(y, direct, dtype, str(case))


def test_apot_conv2d_non_contiguous(device):
    c, oc, bits = 6, 4, 4
    codes = random_codes((oc, 9 * c), bits)
    packed = reference.pack_codes(codes, bits).to(device)
    table = code_table(bits, "scheme").to(device)
    alpha = make_alpha(oc, True, device)
    x = torch.randn(2, 2 * c, 10, 12, device=device)[:, ::2, :, 1:]
    y = ops.apot_conv2d(x, packed, c, (3, 3), (1, 1), (1, 1), (1, 1), bits, table, alpha)
    expected = reference.apot_conv2d(x.cpu(), packed.cpu(), c, (3, 3), (1, 1), (1, 1), (1, 1), bits, table.cpu(), alpha.cpu())
    assert_close_relative(y, expected, torch.float32)


# ----------------------------------------------------------------------------------------------
# opcheck: schema, fake kernel, dispatcher registrations
# ----------------------------------------------------------------------------------------------
def test_opcheck_pack_codes(device):
    for bits, k in ((4, 7), (8, 6), (2, 1)):
        torch.library.opcheck(torch.ops.bitcompile.pack_codes.default, (random_codes((3, k), bits).to(device), bits))


def test_opcheck_apot_linear(device):
    k, n, bits = 37, 9, 4
    _, packed, table = make_weight(n, k, bits, device, "scheme")
    for m, alpha, bias in ((3, make_alpha(n, True, device), torch.randn(n, device=device)),
                           (20, make_alpha(n, False, device), None)):
        x = torch.randn(2, m, k, device=device)
        torch.library.opcheck(torch.ops.bitcompile.apot_linear.default, (x, packed, k, bits, table, alpha, bias))


def test_opcheck_apot_linear_int(device):
    k, n, bits = 37, 9, 4
    numerators = numerator_table(bits, "scheme").to(device)
    packed = reference.pack_codes(random_codes((n, k), bits), bits).to(device)
    q_x = torch.randint(0, 256, (2, 3, k), dtype=torch.uint8, device=device)
    args = (q_x, torch.tensor(0.05, device=device), torch.tensor(128, device=device), packed, k, bits, numerators,
            10.0, make_alpha(n, True, device), torch.randn(n, device=device))
    torch.library.opcheck(torch.ops.bitcompile.apot_linear_int.default, args)


@pytest.mark.parametrize("channels_last", [False, True])
def test_opcheck_apot_conv2d(device, channels_last):
    c, oc, bits = 5, 6, 4
    packed = reference.pack_codes(random_codes((oc, 9 * c), bits), bits).to(device)
    table = code_table(bits, "scheme").to(device)
    x = torch.randn(2, c, 8, 9, device=device)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    args = (x, packed, c, [3, 3], [2, 1], [1, 1], [1, 2], bits, table, make_alpha(oc, True, device),
            torch.randn(oc, device=device))
    torch.library.opcheck(torch.ops.bitcompile.apot_conv2d.default, args)


# ----------------------------------------------------------------------------------------------
# Bad input: a RuntimeError naming the op, from the kernels and from the fake kernels alike
# ----------------------------------------------------------------------------------------------
def _linear_args(device, k=10, n=4, bits=4):
    return dict(
        x=torch.randn(3, k, device=device),
        w_packed=reference.pack_codes(random_codes((n, k), bits), bits).to(device),
        in_features=k,
        bits=bits,
        code_values=code_table(bits).to(device),
        alpha=make_alpha(n, True, device),
        bias=torch.randn(n, device=device),
    )


def _int_args(device, k=10, n=4, bits=4):
    return dict(
        q_x=torch.randint(0, 256, (3, k), dtype=torch.uint8, device=device),
        x_scale=torch.tensor(0.1, device=device),
        x_zero_point=torch.tensor(3, device=device),
        w_packed=reference.pack_codes(random_codes((n, k), bits), bits).to(device),
        in_features=k,
        bits=bits,
        code_numerators=torch.randint(-10, 10, (2**bits,), dtype=torch.int32, device=device),
        denominator=10.0,
        alpha=make_alpha(n, False, device),
        bias=None,
    )


def _conv_args(device, c=3, oc=4, bits=4):
    return dict(
        x=torch.randn(2, c, 7, 7, device=device),
        w_packed=reference.pack_codes(random_codes((oc, 9 * c), bits), bits).to(device),
        in_channels=c,
        kernel_size=[3, 3],
        stride=[1, 1],
        padding=[1, 1],
        dilation=[1, 1],
        bits=bits,
        code_values=code_table(bits).to(device),
        alpha=make_alpha(oc, True, device),
        bias=None,
    )


def _bad_cases(device):
    """(op name, op, kwargs with one bad entry, message fragment)."""
    linear, lint, conv = torch.ops.bitcompile.apot_linear.default, torch.ops.bitcompile.apot_linear_int.default, \
        torch.ops.bitcompile.apot_conv2d.default
    cases = []

    def add(name, op, base, match, **changes):
        cases.append((name, op, {**base, **changes}, match))

    base = _linear_args(device)
    add("apot_linear", linear, base, "x must be float32", x=base["x"].to(torch.int32))
    add("apot_linear", linear, base, "bits must be in 1..8", bits=9, code_values=code_table(4).to(device))
    add("apot_linear", linear, base, "code_values must have 2\\*\\*bits = 16 entries", code_values=code_table(3).to(device))
    add("apot_linear", linear, base, r"code_values must be (torch\.)?float32", code_values=code_table(4).double().to(device))
    add("apot_linear", linear, base, "w_packed is 4 wide, 10 features need 5", w_packed=base["w_packed"][:, :4])
    add("apot_linear", linear, base, "w_packed must be 2-D", w_packed=base["w_packed"][0])
    add("apot_linear", linear, base, "w_packed must be (torch.uint8|uint8|Byte)",
        w_packed=base["w_packed"].to(torch.int32))
    add("apot_linear", linear, base, "x has 9 features", x=torch.randn(3, 9, device=device))
    add("apot_linear", linear, base, "w_packed is 5 wide, 10 features need 10", bits=5, code_values=code_table(5).to(device))
    add("apot_linear", linear, base, "alpha must be a scalar or have 4 elements", alpha=torch.ones(3, device=device))
    add("apot_linear", linear, base, "alpha must be floating point", alpha=torch.ones(4, dtype=torch.int32, device=device))
    add("apot_linear", linear, base, "bias must have shape", bias=torch.ones(5, device=device))
    base = _int_args(device)
    add("apot_linear_int", lint, base, "q_x must be uint8", q_x=base["q_x"].to(torch.int32))
    add("apot_linear_int", lint, base, "x_scale and x_zero_point must be scalars", x_scale=torch.ones(2, device=device))
    add("apot_linear_int", lint, base, r"code_numerators must be (torch\.)?int32", code_numerators=base["code_numerators"].long())
    add("apot_linear_int", lint, base, "code_numerators must have 2\\*\\*bits = 16",
        code_numerators=torch.zeros(8, dtype=torch.int32, device=device))
    add("apot_linear_int", lint, base, "denominator must be positive", denominator=0.0)
    add("apot_linear_int", lint, base, "w_packed is 4 wide", w_packed=base["w_packed"][:, :4])
    add("apot_linear_int", lint, base, "x has 11 features",
        q_x=torch.zeros(2, 11, dtype=torch.uint8, device=device))
    base = _conv_args(device)
    add("apot_conv2d", conv, base, "x must be 4-D", x=base["x"][0])
    add("apot_conv2d", conv, base, "x has 4 channels", x=torch.randn(2, 4, 7, 7, device=device))
    add("apot_conv2d", conv, base, "x must be float32", x=base["x"].to(torch.int64))
    add("apot_conv2d", conv, base, "w_packed is 13 wide", w_packed=base["w_packed"][:, :13])
    add("apot_conv2d", conv, base, "w_packed must be 2-D uint8", w_packed=base["w_packed"].to(torch.int32))
    add("apot_conv2d", conv, base, "too small for kernel", x=torch.randn(2, 3, 2, 7, device=device), padding=[0, 0])
    add("apot_conv2d", conv, base, "stride must be >= 1", stride=[0, 1])
    add("apot_conv2d", conv, base, "code_values must have 2\\*\\*bits", code_values=code_table(5).to(device))
    add("apot_conv2d", conv, base, "alpha must be a scalar or have 4", alpha=torch.ones(2, 2, device=device))
    return cases


def test_bad_input_raises(device):
    cases = _bad_cases(device)
    assert len(cases) > 20
    for name, op, kwargs, match in cases:
        with pytest.raises(RuntimeError, match=f"bitcompile::{name}: .*({match})"):
            op(**kwargs)


def test_bad_input_raises_in_fake_mode():
    for name, op, kwargs, match in _bad_cases("cpu"):
        with FakeTensorMode() as mode:
            fake = {key: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v for key, v in kwargs.items()}
            with pytest.raises(RuntimeError, match=f"bitcompile::{name}: .*({match})"):
                op(**fake)


def test_pack_codes_bad_input(device):
    codes = random_codes((3, 5), 4).to(device)
    with pytest.raises(RuntimeError, match="bitcompile::pack_codes: bits must be in 1..8"):
        ops.pack_codes(codes, 0)
    with pytest.raises(RuntimeError, match="bitcompile::pack_codes: codes must be an integer tensor"):
        ops.pack_codes(codes.float(), 4)
    with pytest.raises(RuntimeError, match="bitcompile::pack_codes: codes must have a non-empty last dimension"):
        ops.pack_codes(codes[:, :0], 4)


@requires_cuda
def test_device_mismatch_raises():
    base = _linear_args("cuda")
    for name in ("code_values", "alpha", "bias", "w_packed"):
        kwargs = {**base, name: base[name].cpu()}
        with pytest.raises(RuntimeError, match="bitcompile::apot_linear: .* is on cpu but x is on cuda"):
            torch.ops.bitcompile.apot_linear.default(**kwargs)
    kwargs = {**_int_args("cuda")}
    kwargs["x_zero_point"] = kwargs["x_zero_point"].cpu()
    with pytest.raises(RuntimeError, match="bitcompile::apot_linear_int: x_zero_point is on cpu"):
        torch.ops.bitcompile.apot_linear_int.default(**kwargs)


# ----------------------------------------------------------------------------------------------
# apot_linear: the CPU small-batch kernel's blocks (nibbles in blocks of 128 / 64 codes, bytes in
# blocks of 64 / 32 / 16), zero-padded last blocks, tiles of 8 / 4 / 2 rows plus single rows, and
# codes outside the table (a hand-made w_packed) reading as level 0.
# ----------------------------------------------------------------------------------------------
def assert_apot_linear_matches(device, m, n, k, bits, table_kind):
    """fp32 apot_linear of random x (m rows) on a random n x k weight, per-output alpha and bias, against the float64
    reference."""
    _, packed, table = make_weight(n, k, bits, device, table_kind)
    alpha = make_alpha(n, True, device)
    bias = torch.randn(n, device=device)
    x = torch.randn(m, k, device=device)
    y = ops.apot_linear(x, packed, k, bits, table, alpha, bias)
    expected = reference.apot_linear(x.cpu(), packed.cpu(), k, bits, table.cpu(), alpha.cpu(), bias.cpu())
    assert_close_relative(y, expected, torch.float32, f"bits={bits} m={m} n={n} k={k}")


@pytest.mark.parametrize("bits", [3, 4, 5, 6])
@pytest.mark.parametrize("k", [15, 64, 127, 128, 129, 257, 1000])
def test_apot_linear_small_batch_blocks(device, bits, k):
    for m in (1, 2, 3, 5, 16):  # n = 37: 8-row and 4-row tiles and leftover single rows
        assert_apot_linear_matches(device, m, 37, k, bits, "scheme" if bits <= 5 else "random")


@pytest.mark.parametrize("bits", [3, 4, 5, 6])
def test_apot_linear_small_batch_x_row_blocks(device, bits):
    """The CPU small-batch kernel meets x a block of rows at a time (256 KiB of reordered x: 12 rows at K = 4097):
    13, 31 and 32 rows make whole blocks, a short last block and tails of 1-3 rows past the 4-row groups."""
    for m in (13, 31, 32):
        assert_apot_linear_matches(device, m, 37, 4097, bits, "scheme" if bits <= 5 else "random")


@pytest.mark.parametrize("bits", [4, 5])
def test_apot_linear_gemm_path_blocks(device, bits):
    """The CPU GEMM path (33 rows and up) decodes the weight in blocks of max(4 MiB, min(max(M, 256), 512)) rows into
    one buffer: y.T written by BLAS up to 512 rows of x, y's columns past them. Each form with one block and with a
    short second block (K = 4097: 256 rows at M = 33, 512 at M = 513)."""
    for m, n, k in ((33, 300, 4097), (512, 40, 129), (513, 600, 4097), (513, 40, 129)):
        assert_apot_linear_matches(device, m, n, k, bits, "scheme")


@pytest.mark.parametrize("bits", [3, 5])
@pytest.mark.parametrize("m", [1, 4])
def test_apot_linear_codes_outside_table_read_zero(device, bits, m):
    k, n = 300, 21
    codes = random_codes((n, k), bits)
    if bits <= 4:
        codes[3, 7] = 12  # a nibble >= 2**bits
        packed = reference.pack_codes(codes, 4)
    else:
        packed = reference.pack_codes(codes, bits)
        packed[3, 7] = 200  # a byte >= 2**bits
        packed[11, 290] = 40
    table = code_table(bits, "scheme")
    padded = torch.cat((table, torch.zeros(256 - table.numel())))
    alpha = make_alpha(n, True, device)
    x = torch.randn(m, k, device=device)
    y = ops.apot_linear(x, packed.to(device), k, bits, table.to(device), alpha)
    unpacked_bits = 4 if bits <= 4 else 8
    expected = reference.apot_linear(x.cpu(), packed, k, unpacked_bits, padded[: 2**unpacked_bits], alpha.cpu())
    assert_close_relative(y, expected, torch.float32, f"bits={bits} m={m}")
