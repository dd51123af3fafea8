"""The binary ops (SPEC 2.1-2.4) against bitcompile.reference: exactness of the integer parts,
fp32 epilogues, odd sizes, dtypes, layouts, opcheck, STE gradients and argument errors.

Every test takes the conftest `device` fixture, so the same file checks the CUDA kernels on a GPU
machine. Inputs are fresh random values each run (conftest seeds them and prints the seed).
"""

import re

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from bitcompile import reference
from conftest import FLOAT_DTYPES, assert_close_relative, profiled_kernels, requires_cuda, skip_without_wgmma

ops = torch.ops.bitcompile
K_SIZES = [1, 31, 32, 33, 127, 129, 1000]


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------
def random_input(shape, dtype=torch.float32, device="cpu", zeros=False):
    """Normal values; with `zeros`, about a third of them exactly 0 (what torch.sign outputs)."""
    x = torch.randn(shape, device=device)
    if zeros:
        x = x * (torch.rand(shape, device=device) > 0.33)
    return x.to(dtype)


def packed_weight(n, k, device):
    w = torch.randn(n, k, device=device)
    return w, reference.pack_signs(w)


def assert_matches(actual, expected, dtype, exact, what, magnitude=None):
    """Exact: equal to the float64 reference cast to the dtype; else relative tolerance (with
    `magnitude`, see conftest.assert_close_relative)."""
    assert actual.dtype == dtype, f"{what}: dtype {actual.dtype} != {dtype}"
    if exact:
        expected = expected.to(dtype)
        assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
        assert torch.equal(actual.cpu(), expected.cpu()), (
            f"{what}: max abs difference {(actual.double().cpu() - expected.double().cpu()).abs().max()}"
        )
    else:
        assert_close_relative(actual, expected, dtype, what, magnitude)


def non_contiguous(x):
    """The same values as x, through a view with a doubled last-dimension stride."""
    wide = torch.empty((*x.shape[:-1], 2 * x.shape[-1]), dtype=x.dtype, device=x.device)
    wide[..., ::2] = x
    view = wide[..., ::2]
    assert not view.is_contiguous() or x.shape[-1] <= 1
    return view


def scale_and_bias(kind, n, device):
    scale = {"none": None, "scalar": torch.rand((), device=device) + 0.5,
             "per_channel": torch.rand(n, device=device) + 0.5}[kind]
    bias = None if kind == "none" else torch.randn(n, device=device)
    return scale, bias


# ------------------------------------------------------------------------------------------------
# pack_signs
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("leading", [(), (5,), (2, 3)])
def test_pack_signs_exact(device, k, leading):
    x = random_input((*leading, k), device=device, zeros=True)  # 0 packs as +1 (s(0) = +1)
    x[..., 0] = -0.0  # -0.0 >= 0 as well
    packed = ops.pack_signs(x)
    assert packed.dtype == torch.int32 and packed.shape == (*leading, (k + 31) // 32)
    assert torch.equal(packed.cpu(), reference.pack_signs(x.cpu()))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_pack_signs_dtypes_and_views(device, dtype):
    x = random_input((4, 70), dtype, device)
    expected = reference.pack_signs(x.float().cpu())
    assert torch.equal(ops.pack_signs(x).cpu(), expected)
    assert torch.equal(ops.pack_signs(non_contiguous(x)).cpu(), expected)
    assert torch.equal(ops.pack_signs(x.T.contiguous().T).cpu(), expected)


def test_pack_signs_bit_order(device):
    x = -torch.ones(2, 40, device=device)
    x[0, 0] = x[0, 31] = x[1, 32] = 1.0
    assert ops.pack_signs(x).cpu().tolist() == [[1 | -(2**31), 0], [0, 1]]


# ------------------------------------------------------------------------------------------------
# binary_linear and binary_weight_linear
# ------------------------------------------------------------------------------------------------
LINEAR_OPS = ["binary_linear", "binary_weight_linear"]


def run_linear(op, x, w_packed, k, scale=None, bias=None, **flags):
    """The kernel's output, the float64 reference and the reference's magnitude (the root of the
    sum of the squared terms of each output, scaled, plus |bias|: assert_close_relative's floor)."""
    kernel = getattr(ops, op)(x, w_packed, k, scale, bias, **flags)
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    x, scale, bias = x.cpu(), cpu(scale), cpu(bias)
    expected = getattr(reference, op)(x, w_packed.cpu(), k, scale, bias, **flags)
    x64 = x.double()
    if op == "binary_weight_linear":
        norm = x64.square().sum(-1, keepdim=True).sqrt()
    else:  # terms are s(x) s(w) = +-1 (0 for a zero under sign_zero), times mean |x| with row_scale
        norm = (x64 != 0).sum(-1, keepdim=True).sqrt() if flags.get("sign_zero") else torch.full_like(x64[..., :1], k**0.5)
        if flags.get("row_scale"):
            norm = norm * x64.abs().mean(-1, keepdim=True)
    magnitude = norm.expand(expected.shape)
    if scale is not None:
        magnitude = magnitude * scale.double().abs().reshape(-1)
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    return kernel, expected, magnitude


@pytest.mark.parametrize("op", LINEAR_OPS)
@pytest.mark.parametrize("k", K_SIZES)
@pytest.mark.parametrize("m,n", [(0, 65), (1, 1), (7, 65), (64, 1), (64, 65)])
def test_linear_sizes(device, op, k, m, n):
    x = random_input((m, k), device=device)
    _, w_packed = packed_weight(n, k, device)
    actual, expected, magnitude = run_linear(op, x, w_packed, k)
    assert actual.shape == (m, n)
    # binary_linear is integer valued: exact. binary_weight_linear accumulates floats in fp32.
    assert_matches(actual, expected, torch.float32, op == "binary_linear", f"{op} m={m} n={n} k={k}", magnitude)


@pytest.mark.parametrize("op", LINEAR_OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["contiguous", "strided", "transposed"])
def test_linear_dtypes_layouts_batch_dims(device, op, dtype, layout):
    k, n = 129, 65
    x = random_input((2, 3, k), dtype, device)
    if layout == "strided":
        x = non_contiguous(x)
    elif layout == "transposed":
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
        assert not x.is_contiguous()
    _, w_packed = packed_weight(n, k, device)
    actual, expected, magnitude = run_linear(op, x, w_packed, k)
    assert actual.shape == (2, 3, n)
    assert_matches(actual, expected, dtype, op == "binary_linear", f"{op} {dtype} {layout}", magnitude)


@pytest.mark.parametrize("op", LINEAR_OPS)
@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_channel"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_linear_scale_bias(device, op, scale_kind, dtype):
    k, n = 1000, 65
    x = random_input((7, k), dtype, device)
    _, w_packed = packed_weight(n, k, device)
    scale, bias = scale_and_bias(scale_kind, n, device)
    actual, expected, magnitude = run_linear(op, x, w_packed, k, scale, bias)
    exact = op == "binary_linear" and scale_kind == "none"
    assert_matches(actual, expected, dtype, exact, f"{op} scale={scale_kind}", magnitude)


def test_linear_scale_dtypes_and_shapes(device):
    """scale may be any float dtype, a 0-d or a 1-element tensor; bias any float dtype."""
    k, n = 33, 5
    x = random_input((4, k), device=device)
    _, w_packed = packed_weight(n, k, device)
    for scale in (torch.tensor([0.5], device=device), torch.rand(n, device=device, dtype=torch.float64),
                  torch.rand(n, device=device, dtype=torch.bfloat16)):
        bias = torch.randn(n, device=device, dtype=torch.float16)
        for op in LINEAR_OPS:
            actual, expected, magnitude = run_linear(op, x, w_packed, k, scale, bias)
            assert_matches(actual, expected, torch.float32, False, f"{op} scale {scale.dtype} {tuple(scale.shape)}", magnitude)


@pytest.mark.parametrize("k", [1, 33, 127, 1000])
@pytest.mark.parametrize("sign_zero", [False, True])
@pytest.mark.parametrize("row_scale", [False, True])
@pytest.mark.parametrize("m", [3, 40])  # the CPU kernels take other paths for a few rows and for many
def test_binary_linear_sign_zero_row_scale(device, k, sign_zero, row_scale, m):
    # Rows with and without zeros side by side (a tile mixes both), x as torch.sign outputs it.
    n = 65
    x = random_input((m, k), device=device, zeros=True)
    x[::2] = torch.randn(x[::2].shape, device=device)  # even rows: no zeros
    x[1] = 0.0  # an all-zero row
    if sign_zero:
        x = torch.sign(x) * (1 + torch.rand_like(x))  # signs with magnitudes, zeros kept
    actual, expected, magnitude = run_linear("binary_linear", x, packed_weight(n, k, device)[1], k,
                                  sign_zero=sign_zero, row_scale=row_scale)
    assert_matches(actual, expected, torch.float32, not row_scale, f"sign_zero={sign_zero} row_scale={row_scale}", magnitude)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_binary_linear_all_flags(device, dtype):
    k, n = 300, 65
    x = random_input((2, 5, k), dtype, device, zeros=True)
    scale, bias = scale_and_bias("per_channel", n, device)
    actual, expected, magnitude = run_linear("binary_linear", non_contiguous(x), packed_weight(n, k, device)[1], k, scale, bias,
                                  sign_zero=True, row_scale=True)
    assert_matches(actual, expected, dtype, False, "all flags", magnitude)


def test_binary_linear_large_dot_exact(device):
    """Dots up to +-K stay exact; K = 8233 (129 64-bit words) also crosses the AVX2 kernel's
    widening of its byte counters every 124 words."""
    k = 8233
    w = torch.randn(3, k, device=device)
    w_packed = reference.pack_signs(w)
    x = torch.stack([w[0], -w[0], w[1]]).clone()
    x[2, ::2] *= -1
    out = ops.binary_linear(x, w_packed, k)
    assert out[0, 0].item() == k and out[1, 0].item() == -k
    assert torch.equal(out.cpu(), reference.binary_linear(x.cpu(), w_packed.cpu(), k).float())


@pytest.mark.parametrize("op", LINEAR_OPS)
@pytest.mark.parametrize("m", [1, 8])
def test_linear_ignores_stray_tail_bits(device, op, m):
    """Tail bits past K never contribute (SPEC 2.1), even when a packed weight has them set."""
    k, n = 70, 9
    w_packed = packed_weight(n, k, device)[1]
    w_packed[:, -1] |= torch.tensor(-(2**31), dtype=torch.int32, device=device)  # bit 31 of the last word
    x = random_input((m, k), device=device, zeros=True)
    for flags in ({}, {"sign_zero": True}) if op == "binary_linear" else ({},):
        actual, expected, magnitude = run_linear(op, x, w_packed, k, **flags)
        assert_matches(actual, expected, torch.float32, op == "binary_linear", f"{op} {flags}", magnitude)


# ------------------------------------------------------------------------------------------------
# binary_conv2d
# ------------------------------------------------------------------------------------------------
def run_conv(x, weight, stride, padding, dilation, scale=None, bias=None, pad_value=0.0, sign_zero=False):
    oc, c, kh, kw = weight.shape
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    args = (c, [kh, kw], list(stride), list(padding), list(dilation))
    kernel = ops.binary_conv2d(x, w_packed, *args, scale, bias, pad_value=pad_value, sign_zero=sign_zero)
    expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *args, None if scale is None else scale.cpu(),
                                       None if bias is None else bias.cpu(), pad_value=pad_value, sign_zero=sign_zero)
    return kernel, expected


# (channels, kernel, stride, padding, dilation, pad_value): every kernel size, stride, padding,
# dilation and pad value appears, with channel counts around the 32-bit word boundaries.
CONV_CASES = [
    (1, 1, 1, 0, 1, 0.0),
    (3, 3, 1, 1, 1, 0.0),
    (3, 3, 2, 1, 2, -1.0),
    (33, 3, 1, 2, 2, 1.0),
    (33, 5, 2, 2, 1, 0.0),
    (64, 1, 2, 0, 1, 0.0),
    (64, 3, 1, 1, 1, -1.0),
    (64, 7, 1, 2, 1, 1.0),
    (300, 3, 2, 1, 1, 0.0),
    (300, 5, 1, 0, 2, -1.0),
    (32, 7, 2, 1, 2, 0.0),
    # channel words % 4 == 0 (the cp.async / 16-byte CUDA paths): 4, 8, 12, 20 words a pixel (a stage of 16
    # words spans 4, 2, 1.33, 0.8 taps), and 49 taps (two planes)
    (128, 3, 1, 1, 1, 0.0),
    (256, 3, 2, 1, 2, -1.0),
    (384, 1, 1, 0, 1, 0.0),
    (640, 3, 1, 1, 1, 1.0),
    (128, 7, 1, 3, 1, 0.0),
]


@pytest.mark.parametrize("c,kernel,stride,padding,dilation,pad_value", CONV_CASES)
def test_conv2d_geometry_exact(device, c, kernel, stride, padding, dilation, pad_value):
    x = random_input((2, c, 11, 13), device=device)  # odd H and W
    weight = torch.randn(5, c, kernel, kernel, device=device)
    actual, expected = run_conv(x, weight, (stride, stride), (padding, padding), (dilation, dilation),
                                pad_value=pad_value)
    assert_matches(actual, expected, torch.float32, True, f"conv c={c} k={kernel} s={stride} p={padding} d={dilation}")


@pytest.mark.parametrize("pad_value", [0.0, 1.0, -1.0])
@pytest.mark.parametrize("c", [3, 33, 64, 128])
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_conv2d_sign_zero(device, pad_value, c, memory_format):
    x = torch.sign(random_input((2, c, 9, 7), device=device, zeros=True))
    x[0, :, 2, 3] = 0.0  # a pixel with all channels zero
    x = x.contiguous(memory_format=memory_format)
    weight = torch.randn(4, c, 3, 3, device=device)
    actual, expected = run_conv(x, weight, (1, 2), (1, 2), (2, 1), pad_value=pad_value, sign_zero=True)
    assert_matches(actual, expected, torch.float32, True, f"sign_zero pad_value={pad_value}")


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_channel"])
def test_conv2d_formats_dtypes_scale(device, memory_format, dtype, scale_kind):
    x = random_input((3, 40, 9, 11), dtype, device).contiguous(memory_format=memory_format)
    weight = torch.randn(6, 40, 3, 3, device=device)
    scale, bias = scale_and_bias(scale_kind, 6, device)
    actual, expected = run_conv(x, weight, (2, 1), (1, 0), (1, 1), scale, bias, pad_value=-1.0)
    assert actual.is_contiguous(memory_format=memory_format)
    assert_matches(actual, expected, dtype, scale_kind == "none", f"conv {memory_format} {dtype} {scale_kind}")


@pytest.mark.parametrize("shape", [(2, 1, 5, 5), (1, 8, 1, 1), (2, 5, 1, 9)])
def test_conv2d_memory_format_matches_fake(device, shape):
    """The output's strides equal the fake kernel's, also where the layout is ambiguous."""
    for memory_format in (torch.contiguous_format, torch.channels_last):
        x = random_input(shape, device=device).contiguous(memory_format=memory_format)
        w_packed = ops.pack_signs(torch.randn(3, 1, 1, shape[1], device=device))
        args = (x, w_packed, shape[1], [1, 1], [1, 1], [0, 0], [1, 1])
        out = ops.binary_conv2d(*args)
        with FakeTensorMode() as mode:
            fake = ops.binary_conv2d(*(mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args))
        assert out.stride() == fake.stride(), f"{shape} {memory_format}: {out.stride()} != {fake.stride()}"


@pytest.mark.parametrize("pad_value", [0.0, 1.0])
def test_conv2d_ignores_stray_tail_bits(device, pad_value):
    c = 40
    weight = torch.randn(4, c, 3, 3, device=device)
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    w_packed[..., -1] |= torch.tensor(-(2**31), dtype=torch.int32, device=device)  # past channel 40 of every tap
    x = random_input((2, c, 7, 6), device=device)
    args = (c, [3, 3], [1, 1], [1, 1], [1, 1])
    actual = ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value)
    expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *args, pad_value=pad_value)
    assert_matches(actual, expected, torch.float32, True, "stray tail bits")


@pytest.mark.parametrize("c,kernel,stride,padding,dilation,pad_value", CONV_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_conv2d_packed_equals_conv2d(device, c, kernel, stride, padding, dilation, pad_value, dtype):
    """binary_conv2d_packed on pack_signs(x.permute(0, 2, 3, 1)): binary_conv2d's values, bit for bit, in
    out_dtype and channels_last."""
    x = random_input((2, c, 11, 13), dtype, device).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(5, c, kernel, kernel, device=device)
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    scale, bias = torch.rand(5, device=device) + 0.5, torch.randn(5, device=device)
    args = (c, [kernel, kernel], [stride, stride], [padding, padding], [dilation, dilation], scale, bias)
    expected = ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value)
    x_bits = ops.pack_signs(x.permute(0, 2, 3, 1))
    actual = ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=pad_value)
    assert actual.dtype == dtype and actual.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(actual, expected), f"c={c} k={kernel} {dtype}: max diff {(actual - expected).abs().max()}"
    if dtype == torch.float32:  # out_dtype int32: the sign words of the fp32 values
        words = ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=torch.int32, pad_value=pad_value)
        assert torch.equal(words, ops.pack_signs(expected.permute(0, 2, 3, 1))), f"sign words c={c} k={kernel}"


def test_conv2d_packed_errors(device):
    w_packed = ops.pack_signs(torch.randn(4, 3, 3, 40, device=device))
    x_bits = ops.pack_signs(torch.randn(2, 7, 6, 40, device=device))
    geometry = (40, [3, 3], [1, 1], [1, 1], [1, 1])
    cases = [
        ((x_bits.float(), w_packed, *geometry), {"out_dtype": torch.float32}, "x_bits must be int32"),
        ((x_bits[..., :1], w_packed, *geometry), {"out_dtype": torch.float32}, "x_bits must have shape"),
        ((x_bits, w_packed, *geometry), {"out_dtype": torch.int64}, "out_dtype must be"),
        ((x_bits, w_packed, 40, [3, 1], [1, 1], [1, 1], [1, 1]), {"out_dtype": torch.float16}, "w_packed must have"),
        ((x_bits, w_packed, *geometry), {"out_dtype": torch.float32, "pad_value": 0.5}, "pad_value must be"),
    ]
    for args, kwargs, message in cases:
        with pytest.raises(RuntimeError, match=f"binary_conv2d_packed: {message}"):
            ops.binary_conv2d_packed(*args, **kwargs)


# (C, OC, kernel, batch, size, the CUDA kernel family): every kernel's epilogue (the mma.sync kernels' staged store
# with 2- / 1-word pieces, odd OC (narrower vectors), the two-plane kernel past 32 taps, the 128 x 64 tile of large
# grids; the wgmma kernel's E2 from 3072 output pixels at channel words % 4 == 0 on a 9.0 device)
RESIDUAL_CASES = [
    (40, 24, 3, 2, 9, "pipelined"),
    (96, 37, 3, 2, 9, "pipelined"),
    (64, 40, 7, 2, 9, "mma"),
    (64, 64, 3, 4, 30, "pipelined"),
    (128, 72, 3, 4, 30, "wgmma"),
    (128, 37, 3, 4, 30, "wgmma"),
]


def _residual_like(out, layout):
    """Random values of out's shape and dtype: channels_last, NCHW-contiguous, or channels_last one element past an
    aligned address (the kernels' vectors narrow to 1 element)."""
    values = torch.randn(out.shape, device=out.device).to(out.dtype)
    if layout == "nchw":
        return values.contiguous()
    if layout == "offset":
        n, c, h, w = out.shape
        storage = torch.empty(out.numel() + 1, dtype=out.dtype, device=out.device)
        view = storage[1:].view(n, h, w, c).permute(0, 3, 1, 2)
        view.copy_(values)
        assert view.is_contiguous(memory_format=torch.channels_last)
        return view
    return values.contiguous(memory_format=torch.channels_last)


def _residual_case(device, c, oc, kernel, batch, size, dtype):
    """(x_bits, w_packed, args) of a RESIDUAL_CASES conv: 3x3-style same padding, per-channel scale and bias."""
    if device == "cpu" and size > 9:
        batch = 1  # the CPU op adds after its conv: the shape changes nothing there
    weight = torch.randn(oc, c, kernel, kernel, device=device)
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    scale, bias = torch.randn(oc, device=device), torch.randn(oc, device=device) * 4
    pad = kernel // 2
    args = (c, [kernel, kernel], [1, 1], [pad, pad], [1, 1], scale, bias)
    x = random_input((batch, c, size, size), dtype, device).contiguous(memory_format=torch.channels_last)
    return ops.pack_signs(x.permute(0, 2, 3, 1)), w_packed, args


@pytest.mark.parametrize("c,oc,kernel,batch,size,family", RESIDUAL_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_conv2d_packed_residual(device, c, oc, kernel, batch, size, family, dtype):
    """binary_conv2d_packed(..., residual=r) is binary_conv2d_packed(...) + r in out_dtype (the conv's values rounded,
    then eager's add), bit for bit, on every kernel's epilogue and every residual layout."""
    x_bits, w_packed, args = _residual_case(device, c, oc, kernel, batch, size, dtype)
    y = ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=-1.0)
    for layout in ("channels_last", "nchw", "offset"):
        r = _residual_like(y, layout)
        actual = ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=-1.0, residual=r)
        assert actual.dtype == dtype and actual.is_contiguous(memory_format=torch.channels_last)
        expected = y + r
        assert torch.equal(actual, expected), (
            f"{layout} c={c} oc={oc} k={kernel} {dtype}: max diff {(actual - expected).double().abs().max()}")
    if device == "cuda" and family == "wgmma":
        skip_without_wgmma()
    if device == "cuda":
        names = profiled_kernels(lambda: ops.binary_conv2d_packed(
            x_bits, w_packed, *args, out_dtype=dtype, pad_value=-1.0, residual=r), ("conv2d",))
        assert any(f"binary_conv2d_{family}_kernel" in name for name in names), names


@pytest.mark.parametrize("c,oc,kernel,batch,size,family", RESIDUAL_CASES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_conv2d_packed_with_signs(device, c, oc, kernel, batch, size, family, dtype):
    """binary_conv2d_packed_with_signs: binary_conv2d_packed's output (with and without a residual) and the sign words
    of the values it stored (pack_signs, bit 1 for >= 0), bit for bit, from every kernel's epilogue: on CUDA no
    packing kernel of its own."""
    x_bits, w_packed, args = _residual_case(device, c, oc, kernel, batch, size, dtype)
    y = ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=1.0)
    for r in (None, _residual_like(y, "channels_last"), _residual_like(y, "offset")):
        out, bits = ops.binary_conv2d_packed_with_signs(x_bits, w_packed, *args, r, out_dtype=dtype, pad_value=1.0)
        expected = y if r is None else y + r
        assert out.is_contiguous(memory_format=torch.channels_last) and torch.equal(out, expected)
        assert bits.dtype == torch.int32 and torch.equal(bits, ops.pack_signs(expected.permute(0, 2, 3, 1))), (
            f"sign words c={c} oc={oc} k={kernel} {dtype} residual {r is not None}")
    if device == "cuda":
        if family == "wgmma":
            skip_without_wgmma()
        names = profiled_kernels(lambda: ops.binary_conv2d_packed_with_signs(
            x_bits, w_packed, *args, r, out_dtype=dtype, pad_value=1.0), ("conv2d", "pack"))
        assert any(f"binary_conv2d_{family}_kernel" in name for name in names), names
        assert not any("pack_signs" in name for name in names), names


def test_conv2d_packed_residual_errors(device):
    w_packed = ops.pack_signs(torch.randn(4, 3, 3, 40, device=device))
    x_bits = ops.pack_signs(torch.randn(2, 7, 6, 40, device=device))
    geometry = (40, [3, 3], [1, 1], [1, 1], [1, 1])
    out = torch.zeros(2, 4, 7, 6, device=device)
    cases = [
        (out, torch.int32, "a residual needs a float out_dtype"),
        (out[:, :3], torch.float32, r"residual must have the output's shape \[2, 4, 7, 6\]"),
        (out, torch.float16, "residual must be (Half|torch.float16)"),
    ]
    if device == "cuda":
        cases.append((out.cpu(), torch.float32, "residual is on cpu"))
    for residual, out_dtype, message in cases:
        with pytest.raises(RuntimeError, match=f"binary_conv2d_packed: {message}"):
            ops.binary_conv2d_packed(x_bits, w_packed, *geometry, out_dtype=out_dtype, residual=residual)
    with_signs = ops.binary_conv2d_packed_with_signs
    with pytest.raises(RuntimeError, match="binary_conv2d_packed_with_signs: out_dtype must be float32, float16 or"):
        with_signs(x_bits, w_packed, *geometry, out_dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"binary_conv2d_packed_with_signs: residual must have the output's shape"):
        with_signs(x_bits, w_packed, *geometry, residual=out[:, :3], out_dtype=torch.float32)


def test_conv2d_non_contiguous_and_empty(device):
    weight = torch.randn(4, 6, 3, 3, device=device)
    x = random_input((2, 6, 20, 9), device=device)[:, :, ::2]  # strided view
    actual, expected = run_conv(x, weight, (1, 1), (1, 1), (1, 1))
    assert_matches(actual, expected, torch.float32, True, "strided input")
    empty, expected = run_conv(random_input((0, 6, 8, 8), device=device), weight, (1, 1), (0, 0), (1, 1))
    assert empty.shape == expected.shape == (0, 4, 6, 6)


# ------------------------------------------------------------------------------------------------
# binary_weight_conv2d (x not binarized)
# ------------------------------------------------------------------------------------------------
def run_weight_conv(x, weight, stride, padding, dilation, scale=None, bias=None):
    """The op's output, the float64 reference and its magnitude (the root of the sum of each output's squared terms,
    scaled, plus |bias|), as run_linear."""
    oc, c, kh, kw = weight.shape
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    args = (c, [kh, kw], list(stride), list(padding), list(dilation))
    kernel = ops.binary_weight_conv2d(x, w_packed, *args, scale, bias)
    cpu = lambda t: None if t is None else t.cpu()  # noqa: E731
    expected = reference.binary_weight_conv2d(x.cpu(), w_packed.cpu(), *args, cpu(scale), cpu(bias))
    all_plus = torch.full_like(w_packed.cpu(), -1)  # every bit set: s(W) = +1, so the conv sums the squares
    squares = reference.binary_weight_conv2d(x.cpu().double() ** 2, all_plus, *args)
    magnitude = squares.abs().sqrt()
    if scale is not None:
        magnitude = magnitude * scale.cpu().double().abs().reshape(-1 if scale.numel() > 1 else 1, 1, 1)
    if bias is not None:
        magnitude = magnitude + bias.cpu().double().abs().reshape(-1, 1, 1)
    return kernel, expected, magnitude


# (channels, kernel, stride, padding, dilation): the CPU kernel's table lookups from 3/4 of whole 32-channel words
# (24, 48, 64, 100, 300), oneDNN's dense conv below (3, 23, 47: its switch), output channels past 16-lane blocks.
WEIGHT_CONV_CASES = [
    (3, 7, 2, 3, 1),
    (23, 3, 1, 1, 1),
    (24, 3, 1, 1, 1),
    (47, 3, 2, 1, 2),
    (48, 3, 2, 1, 2),
    (64, 1, 1, 0, 1),
    (64, 3, 1, 2, 2),
    (100, 5, 1, 2, 1),
    (300, 3, 2, 0, 1),
]


def check_weight_conv(x, oc, kernel, stride, padding, dilation, memory_format, what):
    """binary_weight_conv2d of x (in memory_format) with a random weight, per-channel scale and bias against the
    reference, square kernel, stride, padding and dilation."""
    weight = torch.randn(oc, x.shape[1], kernel, kernel, device=x.device)
    scale, bias = scale_and_bias("per_channel", oc, x.device)
    actual, expected, magnitude = run_weight_conv(x, weight, (stride, stride), (padding, padding),
                                                  (dilation, dilation), scale, bias)
    assert actual.is_contiguous(memory_format=memory_format)
    assert_matches(actual, expected, torch.float32, False, what, magnitude)


@pytest.mark.parametrize("c,kernel,stride,padding,dilation", WEIGHT_CONV_CASES)
@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last])
def test_weight_conv2d_geometry(device, c, kernel, stride, padding, dilation, memory_format):
    x = random_input((2, c, 11, 13), device=device).contiguous(memory_format=memory_format)  # odd H and W
    for oc in (5, 16, 37):
        check_weight_conv(x, oc, kernel, stride, padding, dilation, memory_format,
                          f"weight conv c={c} oc={oc} k={kernel}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_channel"])
@pytest.mark.parametrize("c", [40, 64])
def test_weight_conv2d_dtypes_scale(device, dtype, scale_kind, c):
    x = random_input((3, c, 9, 8), dtype, device).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(20, c, 3, 3, device=device)
    scale, bias = scale_and_bias(scale_kind, 20, device)
    actual, expected, magnitude = run_weight_conv(x, weight, (1, 2), (1, 0), (1, 1), scale, bias)
    assert_matches(actual, expected, dtype, False, f"weight conv {dtype} {scale_kind} c={c}", magnitude)


def test_weight_conv2d_composite_and_empty(device):
    """The composite form (CUDA's, and a CPU's without AVX-512) against the op, stray tail bits ignored, and an
    empty batch."""
    from bitcompile import ops as bc_ops

    x = random_input((2, 70, 6, 7), device=device)
    weight = torch.randn(18, 70, 3, 3, device=device)
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    w_packed[..., -1] |= torch.tensor(-(2**31), dtype=torch.int32, device=device)  # channel 95: past C
    scale, bias = torch.rand(18, device=device) + 0.5, torch.randn(18, device=device)
    args = (70, [3, 3], [1, 1], [1, 1], [1, 1], scale, bias)
    actual = ops.binary_weight_conv2d(x, w_packed, *args)
    composite = bc_ops._binary_weight_conv2d_composite(x, w_packed, *args)
    expected = reference.binary_weight_conv2d(x.cpu(), w_packed.cpu(), *[a.cpu() if torch.is_tensor(a) else a
                                                                        for a in args])
    assert_matches(actual, expected, torch.float32, False, "weight conv, stray tail bits")
    assert_matches(composite, expected, torch.float32, False, "weight conv composite")
    empty = ops.binary_weight_conv2d(x[:0], w_packed, *args)
    assert empty.shape == (0, 18, 6, 7)


# ------------------------------------------------------------------------------------------------
# opcheck
# ------------------------------------------------------------------------------------------------
def opcheck_samples(device):
    """(op name, args, kwargs) for every op; the _ste ops with inputs that require grad."""
    x = random_input((3, 40), device=device)
    x3 = random_input((2, 3, 33), torch.bfloat16, device)
    w = torch.randn(5, 40, device=device)
    w_packed = reference.pack_signs(w)
    w33 = reference.pack_signs(torch.randn(5, 33, device=device))
    scale, bias = torch.rand(5, device=device) + 0.5, torch.randn(5, device=device)
    xc = random_input((2, 3, 7, 9), device=device)
    wc = torch.randn(4, 3, 3, 3, device=device)
    wc_packed = reference.pack_signs(wc.permute(0, 2, 3, 1))
    geometry = ([3, 3], [2, 1], [1, 1], [1, 2])
    grad = dict(requires_grad=True)
    leaf = lambda t: t.detach().clone().requires_grad_(True)  # noqa: E731
    return [
        ("pack_signs", (x,), {}),
        ("pack_signs", (x3,), {}),
        ("binary_linear", (x, w_packed, 40), {}),
        ("binary_linear", (x, w_packed, 40, scale, bias), {"sign_zero": True, "row_scale": True}),
        ("binary_linear", (x3, w33, 33, torch.tensor(0.5, device=device)), {}),
        ("binary_weight_linear", (x, w_packed, 40), {}),
        ("binary_weight_linear", (x3, w33, 33, scale, bias), {}),
        ("binary_conv2d", (xc, wc_packed, 3, *geometry), {}),
        ("binary_conv2d", (xc.contiguous(memory_format=torch.channels_last), wc_packed, 3, *geometry, None,
                           torch.randn(4, device=device)), {"pad_value": -1.0, "sign_zero": True}),
        ("binary_conv2d_packed", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry),
         {"out_dtype": torch.float32}),
        ("binary_conv2d_packed", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry, scale[:4],
                                  torch.randn(4, device=device)), {"out_dtype": torch.bfloat16, "pad_value": 1.0}),
        ("binary_conv2d_packed", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry, None,
                                  torch.randn(4, device=device)), {"out_dtype": torch.int32}),
        # a residual: [2, 4, 4, 7] outputs; channels_last, and NCHW (copied)
        ("binary_conv2d_packed", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry, scale[:4],
                                  None, random_input((2, 4, 4, 7), torch.float16, device).contiguous(
                                      memory_format=torch.channels_last)), {"out_dtype": torch.float16}),
        ("binary_conv2d_packed", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry, None,
                                  None, random_input((2, 4, 4, 7), device=device)),
         {"out_dtype": torch.float32, "pad_value": -1.0}),
        ("binary_conv2d_packed_with_signs", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry,
                                             scale[:4]), {"out_dtype": torch.bfloat16}),
        ("binary_conv2d_packed_with_signs", (reference.pack_signs(xc.permute(0, 2, 3, 1)), wc_packed, 3, *geometry,
                                             None, torch.randn(4, device=device), random_input(
                                                 (2, 4, 4, 7), torch.float16, device).contiguous(
                                                 memory_format=torch.channels_last)), {"out_dtype": torch.float16}),
        ("binary_weight_conv2d", (xc, wc_packed, 3, *geometry), {}),
        ("binary_weight_conv2d", (random_input((2, 64, 5, 6), torch.bfloat16, device).contiguous(
            memory_format=torch.channels_last), reference.pack_signs(torch.randn(4, 3, 3, 64, device=device)), 64,
            *geometry, scale[:4], torch.randn(4, device=device)), {}),
        ("ste_sign", (leaf(x),), {}),
        ("ste_sign", (leaf(x), 0.5), {}),
        ("binary_linear_ste", (leaf(x), leaf(w)), {}),
        ("binary_linear_ste", (leaf(x), leaf(w), leaf(scale), leaf(bias)), {"clip": 1.5, "row_scale": True}),
        ("binary_linear_ste", (x, w, scale, bias), {}),
        ("binary_weight_linear_ste", (leaf(x), leaf(w), leaf(scale), leaf(bias)), {}),
        ("binary_weight_linear_ste", (x, leaf(w)), {"clip": 0.5}),
        ("binary_conv2d_ste", (leaf(xc), leaf(wc), [1, 1], [1, 1], [1, 1]), {}),
        ("binary_conv2d_ste", (leaf(xc), leaf(wc), [2, 1], [1, 0], [1, 2], torch.rand(4, device=device, **grad),
                               torch.randn(4, device=device, **grad)), {"pad_value": 1.0}),
    ]


@pytest.mark.parametrize("index", range(27))
def test_opcheck(device, index):
    samples = opcheck_samples(device)
    assert len(samples) == 27
    name, args, kwargs = samples[index]
    torch.library.opcheck(getattr(ops, name).default, args, kwargs)


# ------------------------------------------------------------------------------------------------
# STE gradients against plain PyTorch autograd
# ------------------------------------------------------------------------------------------------
class StraightThroughSign(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, clip):
        ctx.save_for_backward(x)
        ctx.clip = clip
        return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * (x.abs() <= ctx.clip).to(grad.dtype), None


def ste(x, clip=1.0):
    return StraightThroughSign.apply(x, clip)


def reference_linear(x, w, scale, bias, clip, row_scale, binarize_x=True):
    y = F.linear(ste(x, clip) if binarize_x else x, ste(w, clip))
    if scale is not None:
        y = y * scale
    if row_scale:
        y = y * x.abs().mean(-1, keepdim=True)
    return y if bias is None else y + bias


def reference_conv(x, w, stride, padding, dilation, scale, bias, pad_value, clip):
    sx = F.pad(ste(x, clip), (padding[1], padding[1], padding[0], padding[0]), value=pad_value)
    y = F.conv2d(sx, ste(w, clip), stride=stride, dilation=dilation)
    if scale is not None:
        y = y * (scale.reshape(1, -1, 1, 1) if scale.numel() > 1 else scale)
    return y if bias is None else y + bias.reshape(1, -1, 1, 1)


def compare_grads(run_op, run_reference, inputs, what):
    """Same upstream gradient through both; every input's gradient within fp32 tolerance.

    inputs are [x, w] or [x, w, scale, bias]. The gradient of a scalar scale is one sum of terms
    of both signs, sum(upstream * (y - bias) / scale): its fp32 rounding error is relative to
    sum |terms|, not to a sum that may cancel to near 0, so it gets that absolute bound.
    """
    leaves_op = [t.detach().clone().requires_grad_(True) for t in inputs]
    leaves_ref = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = run_op(*leaves_op)
    expected = run_reference(*leaves_ref)
    assert_close_relative(out.detach(), expected.detach(), torch.float32, f"{what} forward")
    upstream = torch.randn_like(expected)
    grads = torch.autograd.grad(out, leaves_op, upstream)
    expected_grads = torch.autograd.grad(expected, leaves_ref, upstream)
    for index, (g, e) in enumerate(zip(grads, expected_grads)):
        if index == 2 and g.numel() == 1:
            scale, bias = inputs[2], inputs[3]
            bias = bias.reshape(-1, 1, 1) if expected.dim() == 4 else bias
            terms = (upstream * (expected.detach() - bias) / scale).double().abs().sum()
            error = (g.double() - e.double()).abs().item()
            assert error <= 1e-5 * terms.item(), f"{what} grad of the scalar scale: error {error:.3g}, terms {terms:.3g}"
        else:
            assert_close_relative(g, e, torch.float32, f"{what} grad of input {index}")


def optional_inputs(scale_kind, n, device):
    scale, bias = scale_and_bias(scale_kind, n, device)
    return [t for t in (scale, bias) if t is not None]


@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_channel"])
@pytest.mark.parametrize("row_scale", [False, True])
def test_binary_linear_ste_grads(device, scale_kind, row_scale):
    k, n, clip = 70, 9, 1.3
    x = random_input((2, 4, k), device=device) * 1.5  # some |x| beyond clip
    w = torch.randn(n, k, device=device) * 1.5
    extra = optional_inputs(scale_kind, n, device)

    def run_op(x, w, *sb):
        return ops.binary_linear_ste(x, w, *sb, clip=clip, row_scale=row_scale)

    def run_reference(x, w, *sb):
        return reference_linear(x, w, *(sb or (None, None)), clip, row_scale)

    compare_grads(run_op, run_reference, [x, w, *extra], f"binary_linear_ste {scale_kind} row_scale={row_scale}")


@pytest.mark.parametrize("scale_kind", ["none", "scalar", "per_channel"])
def test_binary_weight_linear_ste_grads(device, scale_kind):
    k, n, clip = 70, 9, 0.8
    x = random_input((5, k), device=device)
    w = torch.randn(n, k, device=device)
    extra = optional_inputs(scale_kind, n, device)

    def run_op(x, w, *sb):
        return ops.binary_weight_linear_ste(x, w, *sb, clip=clip)

    def run_reference(x, w, *sb):
        return reference_linear(x, w, *(sb or (None, None)), clip, False, binarize_x=False)

    compare_grads(run_op, run_reference, [x, w, *extra], f"binary_weight_linear_ste {scale_kind}")


@pytest.mark.parametrize("pad_value,scale_kind,padding,stride,dilation", [
    (0.0, "none", (1, 1), (1, 1), (1, 1)),
    (-1.0, "per_channel", (1, 2), (2, 1), (1, 1)),
    (1.0, "scalar", (2, 0), (1, 2), (2, 1)),
    (0.0, "per_channel", (0, 0), (2, 2), (1, 1)),
])
def test_binary_conv2d_ste_grads(device, pad_value, scale_kind, padding, stride, dilation):
    clip = 1.1
    x = random_input((2, 5, 9, 8), device=device) * 1.5
    w = torch.randn(4, 5, 3, 3, device=device) * 1.5
    extra = optional_inputs(scale_kind, 4, device)

    def run_op(x, w, *sb):
        return ops.binary_conv2d_ste(x, w, list(stride), list(padding), list(dilation), *sb,
                                     pad_value=pad_value, clip=clip)

    def run_reference(x, w, *sb):
        return reference_conv(x, w, stride, padding, dilation, *(sb or (None, None)), pad_value, clip)

    compare_grads(run_op, run_reference, [x, w, *extra], f"binary_conv2d_ste pad={pad_value} {scale_kind}")


@pytest.mark.parametrize("clip", [1.0, 0.5])
def test_ste_sign_grads(device, clip):
    x = random_input((6, 17), device=device) * 1.5
    x[0, 0] = 0.0
    x[0, 1] = clip  # the window includes its edge
    compare_grads(lambda t: ops.ste_sign(t, clip), lambda t: ste(t, clip), [x], f"ste_sign clip={clip}")
    assert torch.equal(ops.ste_sign(x, clip), torch.where(x >= 0, 1.0, -1.0))


# ------------------------------------------------------------------------------------------------
# Bad input: RuntimeError naming the op, eagerly and at trace time (fake tensors)
# ------------------------------------------------------------------------------------------------
def bad_calls(device):
    """(op name, expected message fragment, zero-argument call) for each kind of bad input."""
    x = random_input((3, 40), device=device)
    w_packed = reference.pack_signs(torch.randn(5, 40, device=device))
    xc = random_input((1, 3, 8, 8), device=device)
    wc_packed = reference.pack_signs(torch.randn(4, 3, 3, 3, device=device))
    geometry = ([3, 3], [1, 1], [1, 1], [1, 1])
    conv = lambda *a, **k: lambda: ops.binary_conv2d(*a, **k)  # noqa: E731
    calls = [
        ("pack_signs", "must be float32", lambda: ops.pack_signs(x.double())),
        ("pack_signs", "must be float32", lambda: ops.pack_signs(x.to(torch.int32))),
        ("pack_signs", "non-empty last dimension", lambda: ops.pack_signs(x[:, :0])),
    ]
    for op in LINEAR_OPS:
        fn = getattr(ops, op)
        calls += [
            (op, "must be float32", lambda fn=fn: fn(x.double(), w_packed, 40)),
            (op, "must be float32", lambda fn=fn: fn(x.to(torch.int64), w_packed, 40)),
            (op, "wide", lambda fn=fn: fn(random_input((3, 70), device=device), w_packed, 70)),
            (op, "features", lambda fn=fn: fn(x, w_packed, 41)),
            (op, "2-D", lambda fn=fn: fn(x, w_packed.reshape(-1), 40)),
            (op, "w_packed must be", lambda fn=fn: fn(x, w_packed.float(), 40)),
            (op, "scale", lambda fn=fn: fn(x, w_packed, 40, torch.rand(4, device=device))),
            (op, "bias", lambda fn=fn: fn(x, w_packed, 40, None, torch.rand(5, 1, device=device))),
            (op, "bias", lambda fn=fn: fn(x, w_packed, 40, None, torch.rand(6, device=device))),
        ]
    calls += [
        ("binary_conv2d", "must be float32", conv(xc.double(), wc_packed, 3, *geometry)),
        ("binary_conv2d", "must be float32", conv(xc.to(torch.int32), wc_packed, 3, *geometry)),
        ("binary_conv2d", "4-D", conv(xc.reshape(-1), wc_packed, 3, *geometry)),
        ("binary_conv2d", "4-D", conv(xc[0], wc_packed, 3, *geometry)),
        ("binary_conv2d", "w_packed", conv(xc, wc_packed.reshape(-1), 3, *geometry)),
        ("binary_conv2d", "w_packed", conv(xc, wc_packed[:, :2], 3, *geometry)),
        ("binary_conv2d", "channels", conv(xc, wc_packed, 4, *geometry)),
        ("binary_conv2d", "stride", conv(xc, wc_packed, 3, [3, 3], [0, 1], [1, 1], [1, 1])),
        ("binary_conv2d", "stride", conv(xc, wc_packed, 3, [3, 3], [1, -1], [1, 1], [1, 1])),
        ("binary_conv2d", "padding", conv(xc, wc_packed, 3, [3, 3], [1, 1], [-1, 0], [1, 1])),
        ("binary_conv2d", "dilation", conv(xc, wc_packed, 3, [3, 3], [1, 1], [1, 1], [0, 1])),
        ("binary_conv2d", "too small", conv(xc, wc_packed, 3, [3, 3], [1, 1], [0, 0], [4, 4])),
        ("binary_conv2d", "pad_value", conv(xc, wc_packed, 3, *geometry, pad_value=0.5)),
        ("binary_conv2d", "scale", conv(xc, wc_packed, 3, *geometry, torch.rand(3, device=device))),
        ("binary_conv2d", "bias", conv(xc, wc_packed, 3, *geometry, None, torch.rand(5, device=device))),
    ]
    weight_conv = lambda *a: lambda: ops.binary_weight_conv2d(*a)  # noqa: E731
    calls += [
        ("binary_weight_conv2d", "must be float32", weight_conv(xc.double(), wc_packed, 3, *geometry)),
        ("binary_weight_conv2d", "channels", weight_conv(xc, wc_packed, 4, *geometry)),
        ("binary_weight_conv2d", "w_packed", weight_conv(xc, wc_packed[:, :2], 3, *geometry)),
        ("binary_weight_conv2d", "too small", weight_conv(xc, wc_packed, 3, [3, 3], [1, 1], [0, 0], [4, 4])),
        ("binary_weight_conv2d", "bias", weight_conv(xc, wc_packed, 3, *geometry, None, torch.rand(5, device=device))),
    ]
    return calls


BAD_CALL_COUNT = 3 + 2 * 9 + 15 + 5


@pytest.mark.parametrize("index", range(BAD_CALL_COUNT))
def test_bad_input_raises(device, index):
    calls = bad_calls(device)
    assert len(calls) == BAD_CALL_COUNT
    op, fragment, call = calls[index]
    with pytest.raises(RuntimeError, match=f"bitcompile::{op}:.*{fragment}"):
        call()


@pytest.mark.parametrize("index", range(BAD_CALL_COUNT))
def test_bad_input_raises_in_fake_mode(device, index):
    """The fake kernels reject the same inputs at trace time, with the same op name."""
    op, fragment, _ = bad_calls(device)[index]
    with FakeTensorMode():
        # The inputs are built inside the mode: fake tensors of the same shapes and dtypes.
        _, _, call = bad_calls(device)[index]
        with pytest.raises(RuntimeError, match=f"bitcompile::{op}:.*{fragment}"):
            call()


@requires_cuda
def test_device_mismatch_raises():
    x = random_input((3, 40), device="cuda")
    w_packed = reference.pack_signs(torch.randn(5, 40))
    for op in LINEAR_OPS:
        with pytest.raises(RuntimeError, match=f"bitcompile::{op}:"):
            getattr(ops, op)(x, w_packed, 40)
        with pytest.raises(RuntimeError, match=f"bitcompile::{op}:"):
            getattr(ops, op)(x, w_packed.cuda(), 40, torch.rand(5))
    xc = random_input((1, 3, 8, 8), device="cuda")
    wc_packed = reference.pack_signs(torch.randn(4, 3, 3, 3))
    with pytest.raises(RuntimeError, match="bitcompile::binary_conv2d:"):
        ops.binary_conv2d(xc, wc_packed, 3, [3, 3], [1, 1], [1, 1], [1, 1])


# ------------------------------------------------------------------------------------------------
# Tile edges of the tensor-core CUDA paths (W1A16 pass and wgmma kernels with their split of K, dequantize +
# cuBLAS above 128 rows (bf16/fp16; 4096 where the wgmma kernels apply); b1 MMA binary_linear; implicit-GEMM conv
# with two bit planes). They run on CPU too, against the CPU kernels.
# ------------------------------------------------------------------------------------------------
EDGE_N = [1, 127, 129]
EDGE_K = [1, 255, 257, 2049]


@pytest.mark.parametrize("m", [1, 15, 16, 17, 63, 64, 65, 129])
def test_weight_linear_tile_edges(device, m):
    for n in EDGE_N:
        for k in EDGE_K:
            x = random_input((m, k), device=device)
            _, w_packed = packed_weight(n, k, device)
            actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k)
            assert_matches(actual, expected, torch.float32, False, f"binary_weight_linear m={m} n={n} k={k}", magnitude)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 33, 128, 129, 300])
def test_weight_linear_half_precision_edges(device, dtype, m):
    """bf16/fp16 x: M <= 3 takes the bit-plane kernel (where W rows allow 16-byte loads), up to 128 the
    tensor-core pass kernel (M = 9..16: on x prepared by x_groups_kernel, the switch at 8 / 9 and 16 / 17), 129
    and 300 the dequantize + cuBLAS path (16-byte or value-by-value stores: k % 8); on an sm_90a build on a 9.0
    GPU, k % 64 == 0 ((70, 512), (64, 16384)) from 17 rows the wgmma kernel instead (test_weight_linear_wgmma_edges
    has its edges); K spans several 512-bit chunks (several blocks of one cluster,
    or one block: (70, 512)), x staged from 16-byte loads (K % 8 == 0, with a partial last word at K = 1000) or
    value by value (K % 8 != 0, and x one element off its 16-byte alignment), stray tail bits set, scale and bias."""
    for n, k, x_off in ((129, 4100, False), (300, 1000, False), (300, 1000, True), (5, 33, False), (70, 512, False),
                        (64, 16384, False)):
        x = random_input((m, k), dtype, device)
        if x_off:
            x = one_element_off(x)
        _, w_packed = packed_weight(n, k, device)
        w_packed[:, -1] |= torch.tensor(-(2**31), dtype=torch.int32, device=device)
        scale, bias = scale_and_bias("per_channel", n, device)
        actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
        assert_matches(actual, expected, dtype, False, f"binary_weight_linear {dtype} m={m} n={n} k={k}", magnitude)
        scalar = torch.rand((), device=device) + 0.5
        actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scalar)
        assert_matches(actual, expected, dtype, False, f"binary_weight_linear {dtype} m={m} n={n} k={k} scalar scale", magnitude)


def check_weight_linear_shape(device, dtype, m, n, k):
    """binary_weight_linear of random x (m x k) and W (n x k) with per-channel scale and bias against float64."""
    x = random_input((m, k), dtype, device)
    _, w_packed = packed_weight(n, k, device)
    scale, bias = scale_and_bias("per_channel", n, device)
    actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
    assert_matches(actual, expected, dtype, False, f"binary_weight_linear {dtype} m={m} n={n} k={k}", magnitude)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [256, 257, 259, 272, 273, 385, 513, 1025])
def test_weight_linear_remainder_rows(device, dtype, m):
    """bf16/fp16 x of M > 256 rows whose last 128-row tile holds r <= 16 rows: on the H200 (n = 8192: 64 feature
    blocks) the wgmma tiling of M - r rows costs less at 257, 259, 272, 513 and 1025, so the last r rows (1, 3, 16:
    bit planes or the pass kernel) run in a second launch; 256, 273 (17 past 256) and 385 (384 rows tile as 385)
    stay one launch. Scale and bias reach both parts."""
    check_weight_linear_shape(device, dtype, m, 8192, 1024)


def assert_within_planes_bound(actual, expected, magnitude, dtype, what):
    """The bit-plane kernel's bound: every output within one output ulp of the float64 result, plus 1e-4 of the
    output's magnitude (room for the fixed-point rounding)."""
    error = (actual.double().cpu() - expected).abs()
    allowed = torch.finfo(dtype).eps * expected.abs() + 1e-4 * magnitude
    worst = (error / allowed).max().item()
    assert worst <= 1.0, f"binary_weight_linear {dtype} {what}: error {worst:.3g} of allowed"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 5, 8, 9, 16])
def test_weight_linear_bit_planes(device, dtype, m):
    """bf16/fp16 x of M <= 3 (and M = 4 at K > 4096) runs on CUDA, on these weights (below the planes-wgmma rule's
    sizes: test_weight_linear_planes_wgmma_rule), as 24 fixed-point bit planes of x per 512-value
    chunk through the b1 tensor cores (else the tensor-core pass kernel, checked to the same bound): nearly exact, so
    every output is within one output ulp of the float64 result, plus 1e-4 of the output's magnitude (room for the
    fixed-point rounding). x spans many binades and huge values (bf16: planes scaled by 2^-100, a negative shift); K covers
    1 to 8 slices of up to 16 chunks, slices without a chunk, the largest K of the plane kernel (8 x 16 x 512 =
    65536) and past it, W rows of whole 16-byte words (k % 128 in 97..128) or not (k = 1000, 3000)."""
    octaves = 20 if dtype == torch.bfloat16 else 5
    for n, k in ((1, 128), (65, 4076), (130, 4608), (64, 65536), (3, 66048), (40, 1000), (33, 3000)):
        x = random_input((m, k), device=device) * torch.exp2(torch.randint(-octaves, 4, (m, k), device=device).float())
        if dtype == torch.bfloat16 and k == 4608:
            x = x * 2.0**100
        x = x.to(dtype)
        _, w_packed = packed_weight(n, k, device)
        w_packed[:, -1] |= torch.tensor(-(2**31), dtype=torch.int32, device=device)  # stray tail bit
        scale, bias = scale_and_bias("per_channel", n, device)
        actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
        assert actual.dtype == dtype
        assert_within_planes_bound(actual, expected, magnitude, dtype, f"m={m} n={n} k={k}")


# (m, n, k, planes, tile) around planes_wgmma_pays (binary_weight_linear.cu): 2..8 rows from 2^25 weights, 9..32
# from 2^23; tile = (rows, slabs) of the planes kernel on 132 SMs (the plan of binary_weight_planes_wgmma.cu: past 4
# rows the smallest of 4- and 8-row tiles whose blocks fit one wave, past 16 rows 8-row tiles where they pad less
# than 16-row ones; 2 slabs for tiles under 16 rows past one wave).
PLANES_WGMMA_RULE = [(2, 8192, 8192, True, (2, 1)), (8, 8192, 8192, True, (4, 1)), (9, 8192, 8192, True, (8, 1)),
                     (16, 8192, 8192, True, (8, 1)), (16, 16384, 8192, True, (16, 1)), (17, 8192, 8192, True, (8, 2)),
                     (32, 8192, 8192, True, (16, 1)), (33, 8192, 8192, False, None), (8, 8192, 4096, True, (4, 1)),
                     (9, 8192, 4096, True, (8, 1)), (9, 2048, 4096, True, (4, 1)), (32, 2048, 4096, True, (4, 1)),
                     (9, 2047, 4096, False, None), (8, 2048, 4096, False, None), (16, 4096, 8192, True, (4, 1)),
                     (17, 4096, 8192, True, (8, 1)), (32, 4096, 8192, True, (8, 1)), (33, 4096, 8192, False, None),
                     (8, 4096, 8160, False, None), (1, 8192, 8192, False, None)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m,n,k,planes,tile", PLANES_WGMMA_RULE)
def test_weight_linear_planes_wgmma_rule(device, dtype, m, n, k, planes, tile):
    """bf16/fp16 x of few rows on large weights (the rule above) runs on an sm_90a build as 24 fixed-point bit planes
    a row of x through the b1 wgmma (binary_weight_planes_wgmma.cu: tiles of 1, 2, 4, 8, 16 rows); the rule's edges
    take the other kernels. Each within the bit-plane bound; on CUDA the profiler shows which kernel ran, and on 132
    SMs its tile."""
    x = random_input((m, k), device=device) * torch.exp2(torch.randint(-8, 4, (m, k), device=device).float())
    x = x.to(dtype)
    _, w_packed = packed_weight(n, k, device)
    scale, bias = scale_and_bias("per_channel", n, device)
    actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
    assert_within_planes_bound(actual, expected, magnitude, dtype, f"m={m} n={n} k={k}")
    if device == "cuda" and torch.cuda.get_device_capability() == (9, 0):
        names = profiled_kernels(lambda: ops.binary_weight_linear(x, w_packed, k, scale, bias), ("binary_weight",))
        kernels = [name for name in names if "planes_wgmma_kernel" in name]
        assert bool(kernels) == planes, names
        if planes and torch.cuda.get_device_properties(0).multi_processor_count == 132:
            match = re.search(r"planes_wgmma_kernel<[^,<>]+,\s*(\d+),\s*(\d+)\s*>", kernels[0])
            assert match and (int(match[1]), int(match[2])) == tile, kernels


def check_weight_linear_shapes_cuda(m, dtype, shapes):
    """binary_weight_linear on CUDA at each (N, K) of `shapes` with M = m rows of x spanning 12 binades, per-channel
    scale and bias, within assert_within_planes_bound."""
    for n, k in shapes:
        x = (random_input((m, k), device="cuda") * torch.exp2(torch.randint(-8, 4, (m, k), device="cuda").float())).to(dtype)
        _, w_packed = packed_weight(n, k, "cuda")
        scale, bias = scale_and_bias("per_channel", n, "cuda")
        actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
        assert_within_planes_bound(actual, expected, magnitude, dtype, f"m={m} n={n} k={k}")


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [2, 3, 4])
def test_weight_linear_bit_planes_split_edges_cuda(dtype, m):
    """The bit-plane kernel at M = 2..4 gives a 16-row tile 1, 2 or 4 warps (binary_weight_linear.cu: plane_split). On
    the H200 the rule takes 2 at 12289 x 4096 (a block's slice of 8 chunks, one wave), 11008 x 4096 at M = 3,
    12288 x 3584 at M = 3 (7 chunks: M = 3 needs 4) and 25600 x 4096 (1.52 waves: the last one 0.76 full), and 1 at
    12288 x 3584 at M = 2 (7 chunks of the 8 M = 2 needs), 4096^2 (clusters of 4, 2 chunks a block), 11008 x 4096 at
    M = 2 (2 slices of 4 chunks) and 22016 x 4096 (1.30 waves: 0.65). M = 4: K = 4096 (8 chunks) stays on the pass
    kernel, 8192 x 7680 and 8192^2 take 4 warps (128 blocks, one wave), 12000 x 4608 and 12000 x 8192 2 (188 blocks:
    past a wave of 4-warp blocks, one of 2-warp ones), 18000 x 8192 goes back to the pass kernel (282 blocks: 1.07
    waves of 2-warp blocks). Same bound as test_weight_linear_bit_planes."""
    shapes = ((12289, 4096), (12288, 3584), (4096, 4096), (11008, 4096), (22016, 4096), (25600, 4096))
    if m == 4:
        shapes = ((8192, 4096), (8192, 7680), (8193, 8192), (12000, 4608), (12000, 8192), (18000, 8192))
    check_weight_linear_shapes_cuda(m, dtype, shapes)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [5, 16])
def test_weight_linear_pass_slices_edges_cuda(dtype, m):
    """The tensor-core pass kernel (M = 5..16) splits K over a cluster of 2, 4 or 8 blocks: in one wave of the device as
    many as fit, past one wave only splits of >= 2 chunks a block (binary_weight_linear_tc_launch). On the H200: 12000 x
    4608 (9 chunks: 4 slices, past a wave at 8), 20480 x 5120 (10 chunks: 4), 8192 x 5120 (8 slices in one wave, the
    last ones without a chunk), 12001 x 4736 (a partial feature block and a partial chunk). Same bound as
    test_weight_linear_bit_planes (its pass-kernel rows)."""
    check_weight_linear_shapes_cuda(m, dtype, ((12000, 4608), (20480, 5120), (8192, 5120), (12001, 4736)))


@requires_cuda
@pytest.mark.parametrize("m", [1, 2])
def test_weight_linear_bit_planes_weight_written_just_before_cuda(m):
    """The bit-plane path at M = 1 launches x_planes_kernel dependent on the kernel before it, and the weight kernel,
    dependent on x_planes_kernel, loads W before it waits: W written by the kernel just before the call (here a pack
    of a new float weight into the same buffer, then x_planes_kernel's own input made by another kernel) must be
    read as written. Eagerly and in a CUDA graph replayed with a new weight each time."""
    n, k = 8192, 4096
    w = torch.randn(n, k, device="cuda")
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w_packed = ops.pack_signs(w)

    def step():
        w_packed.copy_(ops.pack_signs(w))
        return ops.binary_weight_linear(x * 1.0, w_packed, k)

    def expected():
        return (x.double() @ torch.where(w >= 0, 1.0, -1.0).double().T).cpu()

    def check(actual, what):
        want = expected()
        error = (actual.double().cpu() - want).abs()
        allowed = torch.finfo(torch.bfloat16).eps * want.abs() + 1e-4 * x.double().norm().item()
        assert (error <= allowed).all(), f"{what}: worst {(error / allowed).max().item():.3g} of allowed"

    for i in range(3):
        w.copy_(torch.randn(n, k, device="cuda"))
        check(step(), f"eager {i}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()  # warm-up outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for i in range(5):
        w.copy_(torch.randn(n, k, device="cuda"))
        graph.replay()
        check(out, f"graph replay {i}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("m", [4, 9, 16])
def test_weight_linear_split_past_one_wave(device, dtype, m):
    """N = 12000 (47 blocks of 256 features), K = 4608 (9 chunks of 512): on the H200 the pass kernel splits K 8 ways
    past one wave of clusters (376 blocks, 2 chunks a block, the last 3 slices without a chunk); M = 9 and 16 on x
    prepared by x_groups_kernel, fp32 x at 2 blocks an SM."""
    check_weight_linear_shape(device, dtype, m, 12000, 4608)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", [2, 8, 12, 40])
def test_weight_linear_non_finite_rows(device, dtype, m):
    """An Inf or NaN in a row of x makes that row's outputs non-finite (the bit-plane kernel cannot scale it:
    its outputs become NaN) and leaves the other rows alone."""
    n, k = 70, 1024
    x = random_input((m, k), dtype, device)
    x[0, 17] = float("inf")
    x[m - 1, 900] = float("nan")
    _, w_packed = packed_weight(n, k, device)
    out = ops.binary_weight_linear(x, w_packed, k).cpu()
    assert not torch.isfinite(out[0]).any() and not torch.isfinite(out[m - 1]).any()
    assert torch.isfinite(out[1 : m - 1]).all()


@pytest.mark.parametrize("inputs", ["signed", "relu"])
@pytest.mark.parametrize("m", [1, 17, 2100])
def test_weight_linear_fp32_long_rows(device, m, inputs):
    """fp32 x (three-way bf16 split on the tensor cores up to 2048 rows, fp32 cuBLAS above), of both
    signs and of one sign (ReLU outputs: sums that grow with K)."""
    n, k = 65, 3000
    x = random_input((m, k), device=device) * 100  # magnitudes that need all 24 bits of the split
    if inputs == "relu":
        x = x.relu()
    _, w_packed = packed_weight(n, k, device)
    scale, bias = scale_and_bias("per_channel", n, device)
    actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
    assert_matches(actual, expected, torch.float32, False, f"binary_weight_linear fp32 m={m} {inputs}", magnitude)


@requires_cuda
@pytest.mark.parametrize("inputs", ["uniform", "relu"])
def test_weight_linear_fp32_one_signed_inputs_cuda(inputs):
    """fp32 x of one sign (ReLU outputs) over a long K, on a grid large enough that the tensor-core kernel
    does not split K: its truncating fp32 accumulation must stay within 1e-5 (a numpy model of the kernel
    with {0, 2} even-k weights and a final correction gave 2.4e-5 for uniform x)."""
    m, n, k = 512, 8192, 8192
    x = torch.rand(m, k, device="cuda") if inputs == "uniform" else torch.randn(m, k, device="cuda").relu()
    w = torch.randn(n, k, device="cuda")
    actual = ops.binary_weight_linear(x, ops.pack_signs(w), k)
    expected = x.double() @ torch.where(w >= 0, 1.0, -1.0).double().T  # float64 on the GPU: 69 GFLOP
    magnitude = x.double().square().sum(-1, keepdim=True).sqrt().expand_as(expected)
    assert_close_relative(actual, expected, torch.float32, f"{inputs} x", magnitude)


# ------------------------------------------------------------------------------------------------
# The edges of binary_weight_linear's wgmma dispatch. On a compute capability 9.0 GPU, bf16/fp16 x runs on the pass
# kernel up to M = 16, on the warp-specialized wgmma kernel above (one row block of 32 rows up to M = 32, of 64 up to
# 64, then (128, 1), (192, 1) or (256, 1) tiles by the cost model of wgmma_ws.cuh), where k % 64 == 0, x is 16-byte
# and W 8-byte aligned, and on dequantize + cuBLAS above 4096 rows (128 where wgmma does not apply). Elsewhere (other
# GPUs, the CPU) the same cases check whatever runs there.
# ------------------------------------------------------------------------------------------------
WGMMA_EDGE_M = [16, 17, 32, 33, 64, 65, 128, 129, 160, 161, 1024, 4096, 4097]


def assert_rounded_matches(actual, expected, bias, dtype, what, magnitude):
    """Each output within eps * (|y| + |y - bias| + |bias|) + 1e-4 * magnitude of the float64 y (eps: 2^-7 bf16,
    2^-10 fp16). The eps terms are twice what a path may round: the output to the dtype (half an ulp of |y|), and on
    the dequantize + cuBLAS path the scaled weight (|x @ (s(W) * scale).T| = |y - bias|) and the bias; 1e-4 of the
    magnitude (root of the summed squared terms) is far above fp32 accumulation error at these K. A zero, unwritten
    or misplaced output, a lost K tile or a wrong scale cannot pass: at |y| ~ 30 the bound is ~0.5 (bf16)."""
    assert actual.dtype == dtype and actual.shape == expected.shape, f"{what}: {actual.dtype} {tuple(actual.shape)}"
    actual, expected, magnitude = actual.double().cpu(), expected.double().cpu(), magnitude.double().cpu()
    assert torch.isfinite(actual).all(), f"{what}: non-finite outputs"
    bias = torch.zeros(()) if bias is None else bias.double().cpu()
    eps = torch.finfo(dtype).eps
    allowed = eps * (expected.abs() + (expected - bias).abs() + bias.abs()) + 1e-4 * magnitude
    worst = ((actual - expected).abs() / allowed).max().item()
    assert worst <= 1.0, f"{what}: error {worst:.3g} of allowed"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("m", WGMMA_EDGE_M)
def test_weight_linear_wgmma_edges(device, dtype, m):
    """M at each edge of the dispatch; k = 1024 and 640 (10 tiles of 64: with 8 slices some get none); N = 264 and
    200 (a partial block of features, 16-byte stores), 100 (value-by-value stores: N % 8 != 0) and 1; per-output
    scale with bias and scalar scale with bias."""
    for n, k in ((264, 1024), (200, 640), (100, 1024), (1, 640)):
        x = random_input((m, k), dtype, device)
        _, w_packed = packed_weight(n, k, device)
        for kind in ("per_channel", "scalar"):
            scale, bias = scale_and_bias(kind, n, device)
            actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
            assert_rounded_matches(actual, expected, bias, dtype, f"{dtype} m={m} n={n} k={k} {kind}", magnitude)


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weight_linear_wgmma_ws_tiles_cuda(dtype):
    """The warp-specialized kernel's tiles and two-launch plans at N = 8192 (64 feature blocks), K = 1024, where the
    cost model of wgmma_ws.cuh picks (192, 1) (384 rows: one wave) and two launches (448 and 640 rows: 192 + 256 and
    384 + 256), and one row past each (a second row block, or the last rows split off to the small-M kernels); K
    splits of 3 to 7 at N = 4096; per-output scale and bias."""
    skip_without_wgmma()
    # One row block at M <= 64: N = 8192 takes (32, 1) / (64, 1) (K in two), N = 11008 (32, 1) / (64, 1) (K = 1024
    # is too short to split), N = 28672 (32, 2) / (64, 2) (112 blocks, one wave). N = 4096 and 2048 (32 or 16 feature blocks) split K 3 to 7 ways (clusters that are not
    # a power of two), some slices without a tile: K = 1024 is 8 tiles, 1088 is 8.5 (the last slice with a tile ends
    # on the half one).
    cases = [(8192, 1024, m) for m in (17, 32, 33, 64, 384, 385, 448, 449, 640, 641)]
    cases += [(11008, 1024, m) for m in (17, 32, 33, 64)] + [(28672, 1024, m) for m in (32, 64)]  # (32, 2) / (64, 2)
    cases += [(4096, k, m) for k in (1024, 1088) for m in (17, 32, 64, 96, 160, 192)]
    cases += [(2048, k, m) for k in (1024, 1088) for m in (17, 64)]  # 16 feature blocks: K in 5-7 (rooms permitting)
    for n, k, m in cases:
        _, w_packed = packed_weight(n, k, "cuda")
        x = random_input((m, k), dtype, "cuda")
        scale, bias = scale_and_bias("per_channel", n, "cuda")
        actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
        assert_rounded_matches(actual, expected, bias, dtype, f"{dtype} m={m} n={n} k={k}", magnitude)


def one_element_off(t):
    """t's values in a view that starts one element past an aligned allocation (x: 2 bytes off 16-byte alignment,
    packed W: 4 bytes off 8-byte alignment), contiguous."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    flat[1:] = t.reshape(-1)
    view = flat[1:].view(t.shape)
    assert view.is_contiguous() and view.data_ptr() % 8 != 0
    return view


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_weight_linear_wgmma_refusals(device, dtype):
    """Inputs the wgmma kernels refuse run on the pass kernel, correctly: k % 64 != 0 (k = 1000), x one element off
    its alignment (M = 100; at M = 500 the binding copies x to an aligned buffer for the warp-specialized kernel),
    packed W one word off; and 3-D x of 2 x 150 rows (300 rows: the warp-specialized kernel)."""
    n = 264
    cases = []
    x = random_input((100, 1000), dtype, device)
    cases.append(("k=1000", x, packed_weight(n, 1000, device)[1], 1000))
    for m in (100, 500):
        x = random_input((m, 1024), dtype, device)
        cases.append((f"x off m={m}", one_element_off(x), packed_weight(n, 1024, device)[1], 1024))
    x = random_input((100, 1024), dtype, device)
    cases.append(("w off", x, one_element_off(packed_weight(n, 1024, device)[1]), 1024))
    x = random_input((2, 150, 1024), dtype, device)
    cases.append(("3-D x", x, packed_weight(n, 1024, device)[1], 1024))
    for what, x, w_packed, k in cases:
        scale, bias = scale_and_bias("per_channel", n, device)
        actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, k, scale, bias)
        assert actual.shape == (*x.shape[:-1], n)
        assert_rounded_matches(actual, expected, bias, dtype, f"{dtype} {what}", magnitude)


@requires_cuda
def test_weight_linear_wgmma_dispatch_cuda():
    """Which kernel serves which shape on a compute capability 9.0 GPU, by the kernel names the profiler records."""
    skip_without_wgmma()
    n = 264

    def kernels(x, k, w_packed=None):
        w_packed = packed_weight(n, k, "cuda")[1] if w_packed is None else w_packed
        return profiled_kernels(lambda: ops.binary_weight_linear(x, w_packed, k), ("binary_weight", "dequantize_signs"))

    def wgmma_tiles(names, kernel="binary_weight_wgmma_ws_kernel", tma=True):
        """(rows, slabs, multicast) of each launch; its W by TMA (16-byte rows: k % 128 == 0) or by cp.async."""
        tiles = []
        for name in names:
            if kernel + "<" in name:
                match = re.search(kernel + r"<[^,<>]+,\s*(\d+),\s*(\d+),\s*(\d+),\s*(true|false)\s*>", name)
                assert match, f"cannot read the tile of {name}"
                assert (match.group(4) == "true") == tma, f"W by TMA should be {tma}: {name}"
                tiles.append(tuple(int(v) for v in match.groups()[:3]))
        return tiles

    def uses(names, kernel):
        return any(kernel in name for name in names)

    for dtype in (torch.bfloat16, torch.float16):
        # The warp-specialized kernel from 17 rows, (rows, slabs, multicast): N = 264 is 3 feature blocks, K split
        # 4-8 ways; one row block of 32 / 64 rows up to 64 (1 slab: the fewest features a block), (128, 1) up to 160
        # rows (one wave with the least work a block), at 1024 (256, 1).
        for m, tile in ((17, (32, 1, 1)), (32, (32, 1, 1)), (33, (64, 1, 1)), (64, (64, 1, 1)), (65, (128, 1, 1)),
                        (128, (128, 1, 1)), (129, (128, 1, 1)), (161, (128, 1, 1)), (1024, (256, 1, 1))):
            names = kernels(random_input((m, 1024), dtype, "cuda"), 1024)
            assert wgmma_tiles(names) == [tile], f"{dtype} m={m}: {names}"
            assert not uses(names, "binary_weight_linear_tc_kernel") and not uses(names, "dequantize_signs"), names
        # The plans below count waves of 132 SMs (H100 SXM, H200); another SM count plans other tiles.
        if torch.cuda.get_device_properties(0).multi_processor_count == 132:
            # M <= 64 (ws_small_slabs: waves x (a slice's 128-k tiles + a block's fixed 6.8) x the tile's time a
            # tile), at 64 rows: N = 11008, K = 1024 (8 tiles: the fixed time outweighs a split) 1 slab; N = 4096 1
            # slab; N = 28672 2 slabs (112 blocks in one wave, against 224 in two).
            w_11008, w_8192 = packed_weight(11008, 1024, "cuda")[1], packed_weight(8192, 1024, "cuda")[1]
            w_11008_4096, w_4096 = packed_weight(11008, 4096, "cuda")[1], packed_weight(4096, 1024, "cuda")[1]
            w_28672 = packed_weight(28672, 1024, "cuda")[1]
            for m, k, w, tile in ((64, 1024, w_11008, (64, 1, 1)), (64, 1024, w_4096, (64, 1, 1)),
                                  (64, 1024, w_28672, (64, 2, 1))):
                names = kernels(random_input((m, k), dtype, "cuda"), k, w)
                assert wgmma_tiles(names) == [tile], f"{dtype} m={m} k={k}: {names}"
            # 9..32 rows of x against >= 2^23 weights take the planes-wgmma kernel instead (planes_wgmma_pays, since
            # 37b200d; test_weight_linear_planes_wgmma_rule checks its tiles): 32 rows of these shapes no longer
            # reach the plans above.
            for k, w in ((4096, w_11008_4096), (1024, w_11008), (1024, w_8192)):
                names = kernels(random_input((32, k), dtype, "cuda"), k, w)
                assert uses(names, "binary_weight_planes_wgmma_kernel") and not wgmma_tiles(names), names
            # N = 8192 (64 feature blocks): (192, 1) where its blocks fill one wave (384 rows), two launches where
            # one would leave a partial wave (448 rows: 192 + 256, 640: 384 + 256; the second on (256, 1), K split
            # in two).
            for m, tiles in ((384, [(192, 1, 1)]), (448, [(192, 1, 1), (256, 1, 1)]),
                             (640, [(192, 1, 1), (256, 1, 1)])):
                names = kernels(random_input((m, 1024), dtype, "cuda"), 1024, w_8192)
                assert sorted(wgmma_tiles(names)) == tiles, f"{dtype} m={m}: {names}"
        names = kernels(random_input((16, 1024), dtype, "cuda"), 1024)
        assert uses(names, "binary_weight_linear_tc_kernel") and not wgmma_tiles(names), f"{dtype} m=16: {names}"
        names = kernels(one_element_off(random_input((500, 1024), dtype, "cuda")), 1024)  # copied to aligned memory
        assert wgmma_tiles(names), f"{dtype} x off m=500: {names}"
        assert not uses(names, "binary_weight_linear_tc_kernel"), f"{dtype} x off m=500: {names}"
        names = kernels(random_input((4097, 1024), dtype, "cuda"), 1024)
        assert uses(names, "dequantize_signs") and not wgmma_tiles(names), f"{dtype} m=4097: {names}"
        # k % 128 == 64: 8-byte weight rows, which TMA does not take: the producer's cp.async
        names = kernels(random_input((100, 1088), dtype, "cuda"), 1088)
        assert wgmma_tiles(names, tma=False), f"{dtype} k=1088: {names}"
        for what, x, k in (("k=1000", random_input((100, 1000), dtype, "cuda"), 1000),
                           ("x off", one_element_off(random_input((100, 1024), dtype, "cuda")), 1024)):
            names = kernels(x, k)
            assert uses(names, "binary_weight_linear_tc_kernel") and not wgmma_tiles(names), f"{dtype} {what}: {names}"


@pytest.mark.parametrize("sign_zero", [False, True])
@pytest.mark.parametrize("m", [1, 15, 16, 17, 19, 20, 63, 64, 65, 129])  # 19 / 20: the CPU panel switch
def test_binary_linear_tile_edges(device, m, sign_zero):
    for n in EDGE_N:
        for k in EDGE_K:
            x = random_input((m, k), device=device, zeros=sign_zero)
            _, w_packed = packed_weight(n, k, device)
            actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k, sign_zero=sign_zero)
            assert_matches(actual, expected, torch.float32, True, f"binary_linear m={m} n={n} k={k} sign_zero={sign_zero}", magnitude)


# On sm_90 binary_linear runs wgmma where ceil(k / 32) % 4 == 0 and both operands are 16-byte aligned (block
# tiles of 128 rows x 128 or 256 columns, 1024-bit K stages), the mma.sync kernels elsewhere: k on both sides of
# the word-count rule and of a stage, M and N around the tiles, every output dtype, an unaligned weight.
@requires_cuda
@pytest.mark.parametrize("k", [100, 128, 1000, 1024, 1025, 3968, 4095, 4097])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_binary_linear_wgmma_edges(k, dtype):
    for m, n in [(1, 1), (2, 255), (129, 257), (300, 513)]:
        x = random_input((m, k), dtype, "cuda")
        _, w_packed = packed_weight(n, k, "cuda")
        actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k)
        assert_matches(actual, expected, dtype, True, f"binary_linear m={m} n={n} k={k}", magnitude)
        scale, bias = scale_and_bias("per_channel", n, "cuda")
        actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k, scale, bias, row_scale=True)
        assert_matches(actual, expected, dtype, False, f"binary_linear m={m} n={n} k={k} scale, bias", magnitude)
    # a weight 4 bytes off 16-byte alignment (TMA refuses it; the mma.sync kernels take it)
    _, w_packed = packed_weight(129, k, "cuda")
    shifted = torch.empty(w_packed.numel() + 1, dtype=w_packed.dtype, device="cuda")[1:].view(w_packed.shape)
    shifted.copy_(w_packed)
    x = random_input((200, k), dtype, "cuda")
    actual, expected, magnitude = run_linear("binary_linear", x, shifted, k)
    assert_matches(actual, expected, dtype, True, f"binary_linear unaligned weight k={k}", magnitude)


# binary_linear gives the wgmma kernel pack_signs' row popcounts (x_popcounts): its consumers then read pa per row in
# the epilogue (rows past M read 0) instead of counting the staged rows. M around the 128-row tile and its 8-row
# halves (a thread's rows r and r + 8), rows with no 1 bit and with all K, through each pack kernel (k = 100: the
# any-k kernel; 1024: the short-row kernel; 4096: the 16-byte-load kernel, a row over 4 or 8 warps), with and without
# row_scale (mean |x| reduced in the same pass); ceil(k / 32) % 4 == 0 throughout (the wgmma kernel's shapes).
@requires_cuda
@pytest.mark.parametrize("k", [100, 1024, 4096])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_binary_linear_wgmma_row_popcounts(k, dtype):
    n = 136
    _, w_packed = packed_weight(n, k, "cuda")
    for m in (127, 128, 135, 136, 255):
        x = random_input((m, k), dtype, "cuda", zeros=True)
        x[0] = -1.0  # popcount 0
        x[-1] = 0.5  # popcount k
        actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k)
        assert_matches(actual, expected, dtype, True, f"binary_linear m={m} k={k}", magnitude)
        actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k, row_scale=True)
        assert_matches(actual, expected, dtype, False, f"binary_linear m={m} k={k} row_scale", magnitude)


# The wgmma kernel's epilogue reads every column term the same way (a missing scale reads ones, a missing bias
# zeros, a scalar scale is folded into the row factor) and takes a guarded copy for a tile reaching past N: each
# form of the terms, on whole tiles (N = 512) and on a tail tile (N = 520: 8 columns in the last 256-wide tile, and
# N = 513: the st.global path of an odd N), with and without row_scale.
@requires_cuda
@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
def test_binary_linear_wgmma_column_terms(dtype):
    k = 1024
    for m, n in [(300, 512), (300, 520), (129, 513)]:
        x = random_input((m, k), dtype, "cuda")
        _, w_packed = packed_weight(n, k, "cuda")
        per_channel, bias = scale_and_bias("per_channel", n, "cuda")
        scalar, _ = scale_and_bias("scalar", n, "cuda")
        for what, scale, b in (("scalar scale", scalar, None), ("scalar scale, bias", scalar, bias),
                               ("bias only", None, bias), ("scale only", per_channel, None)):
            for row_scale in (False, True):
                actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k, scale, b, row_scale=row_scale)
                assert_matches(actual, expected, dtype, False, f"m={m} n={n} {what} row_scale={row_scale}", magnitude)


@requires_cuda
@pytest.mark.parametrize("n", [7937, 8192])
def test_binary_linear_wgmma_wide_tiles(n):
    """Enough tiles for the 256-column wgmma tile (M = 512), an odd N (no paired stores), dots of +-K exact."""
    k = 2048
    x = random_input((512, k), torch.float32, "cuda")
    w = torch.randn(n, k, device="cuda")
    w[:2] = x[:2]  # out[0, 0] = +K, out[1, 1] = +K
    w[2] = -x[3]  # out[3, 2] = -K
    w_packed = reference.pack_signs(w)
    actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k)
    assert actual[0, 0].item() == k and actual[1, 1].item() == k and actual[3, 2].item() == -k
    assert_matches(actual, expected, torch.float32, True, f"binary_linear m=512 n={n} k={k}", magnitude)


@pytest.mark.parametrize("c", [1, 31, 32, 33, 128, 256])
@pytest.mark.parametrize("sign_zero", [False, True])
def test_conv2d_channel_edges(device, c, sign_zero):
    """Channel counts around words and around the 4-word vector loads; 130 output pixels (two pixel
    tiles of 128) and 65 output channels (two channel tiles of 64); every pad value."""
    x = random_input((2, c, 9, 8), device=device, zeros=sign_zero)  # 2 * 9 * 8 = 144 pixels at stride 1
    weight = torch.randn(65, c, 3, 3, device=device)
    for pad_value, memory_format in ((0.0, torch.channels_last), (1.0, torch.contiguous_format),
                                     (-1.0, torch.channels_last)):
        xf = x.contiguous(memory_format=memory_format)
        actual, expected = run_conv(xf, weight, (1, 1), (1, 1), (1, 1), pad_value=pad_value, sign_zero=sign_zero)
        assert_matches(actual, expected, torch.float32, True, f"conv c={c} pad={pad_value} sign_zero={sign_zero}")


# The CPU conv computes tiles of 6 output pixels x 4 panels of 16 output channels (2 pixels x 3 panels of 8 with
# AVX2, 2 x 4 of 1 without), in blocks of 36 pixels x 128 channels, over an input image grown by the padding.
# (batch, height, width, kernel, stride, padding, dilation): output pixels around 2, 4, 6 and 32, 36.
CONV_EDGE_GEOMETRIES = [
    (1, 1, 3, 1, 1, 0, 1),  # 3 output pixels
    (1, 2, 2, 3, 1, 1, 1),  # 4
    (1, 1, 5, 1, 1, 0, 1),  # 5
    (1, 2, 3, 1, 1, 0, 1),  # 6
    (1, 1, 7, 1, 1, 0, 1),  # 7
    (1, 4, 8, 3, 1, 1, 1),  # 32
    (1, 3, 11, 3, 1, 1, 1),  # 33
    (1, 5, 7, 3, 1, 1, 1),  # 35
    (3, 7, 5, 5, 2, 2, 1),  # 5x5 kernel, stride 2: 36
    (1, 1, 37, 3, 1, 1, 1),  # 37
    (2, 6, 7, 1, 2, 0, 1),  # 1x1 kernel, stride 2: 24
    (1, 1, 1, 1, 1, 1, 1),  # 9, all but the centre read only padding
    (2, 5, 6, 3, 2, 3, 2),  # padding wider than the kernel reaches, stride 2, dilation 2: 32
]


@pytest.mark.parametrize("geometry", CONV_EDGE_GEOMETRIES)
@pytest.mark.parametrize("sign_zero", [False, True])
def test_conv2d_tile_edges(device, geometry, sign_zero):
    batch, height, width, kernel, stride, padding, dilation = geometry
    cases = [(c, oc) for c in (1, 31, 33, 65) for oc in (1, 15, 16, 17, 63, 64, 65, 129)]
    for index, (c, oc) in enumerate(cases):
        pad_value = (0.0, 1.0, -1.0)[index % 3]
        memory_format = (torch.channels_last, torch.contiguous_format)[index % 2]
        x = random_input((batch, c, height, width), device=device, zeros=sign_zero)
        x[0, :, 0, 0] = 0.0  # a pixel of zeros (counts 0 under sign_zero, +1 otherwise)
        x = x.contiguous(memory_format=memory_format)
        weight = torch.randn(oc, c, kernel, kernel, device=device)
        actual, expected = run_conv(x, weight, (stride, stride), (padding, padding), (dilation, dilation),
                                    pad_value=pad_value, sign_zero=sign_zero)
        assert_matches(actual, expected, torch.float32, True,
                       f"conv {geometry} c={c} oc={oc} pad={pad_value} sign_zero={sign_zero}")


# Under zero padding the CPU conv groups the output pixels in boxes whose valid taps are the same rectangle, and each
# box loops over those taps only. (batch, height, width, kernel, stride, padding, dilation): boxes of no valid tap,
# boxes of fewer rows than a tile, edge boxes spanning images and blocks of 36 rows.
CONV_BOX_GEOMETRIES = [
    (1, 2, 2, 3, 1, 3, 1),  # 6x6 outputs whose outer ring reads only padding (boxes of no tap: out = bias)
    (4, 14, 14, 3, 1, 1, 1),  # edge boxes of 48 rows over 4 images (two blocks)
    (1, 7, 7, 5, 1, 2, 1),  # 5x5: 25 boxes around a 3x3 interior
    (3, 9, 4, 3, 2, 2, 3),  # stride 2, dilation 3: 4x1 outputs
]


@pytest.mark.parametrize("geometry", CONV_BOX_GEOMETRIES)
@pytest.mark.parametrize("sign_zero", [False, True])
def test_conv2d_padding_boxes(device, geometry, sign_zero):
    batch, height, width, kernel, stride, padding, dilation = geometry
    for index, (c, oc) in enumerate([(1, 17), (33, 64), (65, 129), (128, 16)]):
        memory_format = (torch.channels_last, torch.contiguous_format)[index % 2]
        x = random_input((batch, c, height, width), device=device, zeros=sign_zero).contiguous(memory_format=memory_format)
        weight = torch.randn(oc, c, kernel, kernel, device=device)
        scale, bias = scale_and_bias("per_channel", oc, device)
        for pad_value in (0.0, -1.0):
            actual, expected = run_conv(x, weight, (stride, stride), (padding, padding), (dilation, dilation), scale,
                                        bias, pad_value=pad_value, sign_zero=sign_zero)
            assert_matches(actual, expected, torch.float32, False,
                           f"conv {geometry} c={c} oc={oc} pad={pad_value} sign_zero={sign_zero}")


@pytest.mark.parametrize("geometry", CONV_BOX_GEOMETRIES)
def test_weight_conv2d_padding_boxes(device, geometry):
    """binary_weight_conv2d skips the padded taps the same way (the table-lookup kernel from 24 channels)."""
    batch, height, width, kernel, stride, padding, dilation = geometry
    for index, (c, oc) in enumerate([(33, 17), (64, 40), (128, 16)]):
        memory_format = (torch.channels_last, torch.contiguous_format)[index % 2]
        x = random_input((batch, c, height, width), device=device).contiguous(memory_format=memory_format)
        check_weight_conv(x, oc, kernel, stride, padding, dilation, memory_format,
                          f"weight conv {geometry} c={c} oc={oc}")


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_conv2d_cpu_threads(threads):
    """The CPU conv's threads take its blocks (of boxes with different taps) one by one as they finish: every thread
    count gives the reference's values, with enough work (~0.5 M word-dots) to run in parallel."""
    x = random_input((5, 96, 10, 9)).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(70, 96, 3, 3)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        actual, expected = run_conv(x, weight, (1, 1), (1, 1), (1, 1))
    finally:
        torch.set_num_threads(before)
    assert_matches(actual, expected, torch.float32, True, f"conv on {threads} threads")


# (batch, channels, out_channels, height, width, kernel, stride, padding, dilation): the CUDA one-plane kernel's
# narrow cp.async pieces, 2 words a pixel (C = 64, 40, 48: 8-byte copies, a stage of 16 words spans 8 taps) and
# 1 or 3 words (C = 32, 20, 96: 4-byte copies, 16 or 5.33 taps a stage); batch 1 and 3, stride 2, out_channels
# not a multiple of 8, more than one tile of 128 pixels or 64 channels, 1x1, 5x5 and dilated kernels.
NARROW_CONV_CASES = [
    (1, 64, 33, 11, 13, 3, 2, 1, 1),
    (3, 64, 64, 9, 7, 3, 1, 1, 1),
    (3, 64, 70, 8, 9, 1, 1, 0, 1),
    (3, 40, 70, 10, 9, 3, 2, 1, 1),
    (1, 48, 9, 12, 11, 5, 1, 2, 2),
    (1, 32, 17, 11, 13, 3, 1, 1, 1),
    (3, 32, 129, 7, 9, 3, 2, 2, 1),
    (3, 20, 65, 9, 11, 3, 2, 2, 1),
    (1, 20, 7, 13, 12, 5, 1, 2, 1),
    (3, 96, 33, 7, 8, 3, 1, 1, 1),
]


@pytest.mark.parametrize("pad_value", [0.0, 1.0, -1.0])
@pytest.mark.parametrize("case", NARROW_CONV_CASES)
def test_conv2d_narrow_channels(device, case, pad_value):
    batch, c, oc, height, width, kernel, stride, padding, dilation = case
    index = NARROW_CONV_CASES.index(case)
    memory_format = (torch.channels_last, torch.contiguous_format)[index % 2]
    dtype = FLOAT_DTYPES[index % len(FLOAT_DTYPES)]
    scale_kind = ("none", "per_channel", "none", "scalar")[index % 4]
    x = random_input((batch, c, height, width), dtype, device).contiguous(memory_format=memory_format)
    weight = torch.randn(oc, c, kernel, kernel, device=device)
    scale, bias = scale_and_bias(scale_kind, oc, device)
    actual, expected = run_conv(x, weight, (stride, stride), (padding, padding), (dilation, dilation), scale, bias,
                                pad_value=pad_value)
    assert actual.is_contiguous(memory_format=memory_format)
    assert_matches(actual, expected, dtype, scale_kind == "none",
                   f"conv {case} pad={pad_value} {dtype} {scale_kind} {memory_format}")


@pytest.mark.parametrize("c", [992, 993, 1984, 1985])
@pytest.mark.parametrize("sign_zero", [False, True])
def test_conv2d_long_rows(device, c, sign_zero):
    """31, 32, 62 and 63 words a row around the AVX2 kernel's widening of its byte counters every 31 words."""
    x = random_input((2, c, 3, 3), device=device, zeros=sign_zero)
    weight = torch.randn(20, c, 1, 1, device=device)
    actual, expected = run_conv(x, weight, (1, 1), (1, 1), (1, 1), sign_zero=sign_zero)
    assert_matches(actual, expected, torch.float32, True, f"conv c={c} sign_zero={sign_zero}")


def check_linear_packing_flags(x, w_packed, k, flag_sets):
    """binary_linear of x under each set of packing flags (the sign_zero planes, row_scale = mean |x|) against
    the reference: exact without row_scale, within output rounding with it."""
    for flags in flag_sets:
        actual, expected, magnitude = run_linear("binary_linear", x, w_packed, k, **flags)
        exact = "row_scale" not in flags
        assert_matches(actual, expected, x.dtype, exact, f"binary_linear m={x.shape[0]} k={k} {x.dtype} {flags}",
                       magnitude)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [32, 64, 96, 2048, 8192])
def test_pack_signs_whole_words(device, dtype, k):
    """K a multiple of 32 (the CUDA 16-byte-load packing): bits, the sign_zero planes and mean |x| through
    binary_linear's row_scale, rows split over several warps for long K."""
    x = random_input((5, k), dtype, device, zeros=True)
    assert torch.equal(ops.pack_signs(x).cpu(), reference.pack_signs(x.float().cpu()))
    n = 33
    _, w_packed = packed_weight(n, k, device)
    check_linear_packing_flags(x, w_packed, k, ({"sign_zero": True}, {"row_scale": True}, {}))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [64, 1056, 8192])
def test_pack_signs_special_values(device, dtype, k):
    """-0, +0, NaN of both signs, +-Inf and subnormals at every position of a 16-byte vector (a cycle of 9 values
    over 8 a vector), on the short-row (k = 64) and long-row kernels, which compare 16-bit values two at a time:
    bit 1 exactly for x >= 0 (-0 included, NaN never); the sign_zero planes (x > 0, x < 0) without the NaN."""
    tiny = torch.finfo(dtype).tiny / 4 if dtype != torch.float32 else 1e-40  # subnormal in every dtype
    specials = torch.tensor([-0.0, 0.0, float("nan"), -float("nan"), float("inf"), -float("inf"), tiny, -tiny, 1.0])
    x = random_input((3, k), dtype, device, zeros=True)
    count = min(k, 9 * 8 * 2)
    x[:, :count] = specials.repeat(count // 9 + 1)[:count].to(dtype).to(device)
    # -NaN by its bits (a float -> half conversion may drop a NaN's sign)
    bits = {torch.float32: (torch.int32, -(2**22)), torch.float16: (torch.int16, -512), torch.bfloat16: (torch.int16, -64)}
    x[:, 3:count:9].view(bits[dtype][0]).fill_(bits[dtype][1])
    x[1] = x[1].roll(5)  # other offsets within the vectors
    assert x[0, 3:4].view(bits[dtype][0]).item() == bits[dtype][1] and torch.isnan(x[0, 3])
    assert torch.equal(ops.pack_signs(x).cpu(), reference.pack_signs(x.float().cpu()))
    no_nan = torch.where(torch.isnan(x), torch.zeros_like(x), x)
    _, w_packed = packed_weight(9, k, device)
    actual, expected, magnitude = run_linear("binary_linear", no_nan, w_packed, k, sign_zero=True)
    assert_matches(actual, expected, dtype, True, f"binary_linear sign_zero {dtype} k={k}", magnitude)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [32, 64, 96, 992, 1024, 1056])
@pytest.mark.parametrize("m", [1, 7, 257])
def test_pack_signs_short_rows(device, dtype, k, m):
    """Rows of k % 32 == 0 up to 1024 take the CUDA short-row kernel (tiles of whole rows: 256 words a tile
    for bf16/fp16, 128 for fp32), 1056 the long-row kernel: row counts that leave a partial tile, words per
    row that do not divide a tile (3, 31), the sign_zero planes and mean |x| through binary_linear."""
    x = random_input((m, k), dtype, device, zeros=True)
    x[0, 0] = -0.0  # -0.0 >= 0: bit 1, and 0 in both sign_zero planes
    assert torch.equal(ops.pack_signs(x).cpu(), reference.pack_signs(x.float().cpu()))
    _, w_packed = packed_weight(17, k, device)
    check_linear_packing_flags(x, w_packed, k, ({"sign_zero": True}, {"row_scale": True},
                                                {"sign_zero": True, "row_scale": True}))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("k", [64, 1024])
def test_pack_signs_many_short_rows(device, dtype, k):
    """More tiles than the short-row kernel's grid holds (its grid-stride loop), rows of 64 (a ResNet-18
    layer1 pixel) and of 1024 values; an odd row count; mean |x| deterministic over repeated calls."""
    m = 300007 if k == 64 else 20001
    x = random_input((m, k), dtype, device, zeros=True)
    assert torch.equal(ops.pack_signs(x).cpu(), reference.pack_signs(x.float().cpu()))
    _, w_packed = packed_weight(5, k, device)
    check_linear_packing_flags(x, w_packed, k, ({"sign_zero": True}, {"row_scale": True}))
    again = ops.binary_linear(x, w_packed, k, row_scale=True)
    assert torch.equal(again, ops.binary_linear(x, w_packed, k, row_scale=True)), "row_scale not deterministic"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("c", [64, 96, 1024])
@pytest.mark.parametrize("sign_zero", [False, True])
def test_conv2d_short_pixel_rows(device, dtype, c, sign_zero):
    """channels_last half-precision activations, a row of c channels per pixel (ResNet-18's 64 and the largest
    short row, 1024): 2 * 13 * 11 = 286 pixels, not a whole number of tiles."""
    x = random_input((2, c, 13, 11), dtype, device, zeros=sign_zero).contiguous(memory_format=torch.channels_last)
    x[1, :, 4, 5] = 0.0  # a pixel of zeros
    weight = torch.randn(9, c, 3, 3, device=device)
    actual, expected = run_conv(x, weight, (1, 1), (1, 1), (1, 1), pad_value=0.0, sign_zero=sign_zero)
    assert_matches(actual, expected, dtype, True, f"conv c={c} {dtype} sign_zero={sign_zero}")


# ------------------------------------------------------------------------------------------------
# The edges of binary_conv2d's wgmma dispatch. On a compute capability 9.0 GPU with sm_90a code, one-plane
# convolutions (no sign_zero, <= 32 taps) of at least 3072 output pixels run on binary_conv2d_wgmma_kernel where
# the channel words are a multiple of 4 and the operands 16-byte aligned, the mma.sync kernels elsewhere. The same
# cases run everywhere (the CPU kernels on CPU).
# ------------------------------------------------------------------------------------------------
# (batch, channels, height, width, out_channels, kernel, stride, padding, dilation, pad_value): 3072 pixels exactly
# and 3071; 1x1, 3x3, 5x5 (25 taps) and 4x8 (32 taps: the most one plane takes); stride 2 and dilation 2; channel
# words 4 (C = 97: a tail word), 8, 12 and 5 (not a multiple of 4: the mma.sync kernels); output channels 1, 65,
# 129 and 257 (tails of the 128 and 256 tiles). The kernel's pa counts the input rows a block reads in windows of
# (taps + 1) x 128 pixels: 1x1 over 1600-pixel rows (7 windows) and 3x3 over 800-pixel rows (2 windows); padding 4
# with dilation 2 (rows whose first inside tap is not the lowest pixel).
CONV_WGMMA_CASES = [
    (16, 128, 12, 16, 65, (3, 3), (1, 1), (1, 1), (1, 1), 0.0),
    (1, 128, 37, 83, 65, (3, 3), (1, 1), (1, 1), (1, 1), 1.0),
    (3, 256, 32, 32, 257, (1, 1), (1, 1), (0, 0), (1, 1), 0.0),
    (4, 97, 30, 30, 129, (5, 5), (1, 1), (2, 2), (1, 1), -1.0),
    (2, 384, 40, 40, 1, (4, 8), (1, 1), (2, 3), (1, 1), 1.0),
    (12, 128, 33, 34, 64, (3, 3), (2, 2), (1, 1), (2, 2), -1.0),
    (16, 160, 12, 16, 33, (3, 3), (1, 1), (1, 1), (1, 1), 0.0),
    (1, 128, 2, 1600, 65, (1, 1), (1, 1), (0, 0), (1, 1), 0.0),
    (1, 128, 4, 800, 33, (3, 3), (1, 1), (1, 1), (1, 1), 1.0),
    (3, 128, 30, 30, 65, (3, 3), (1, 1), (4, 4), (2, 2), -1.0),
]


@pytest.mark.parametrize("case", CONV_WGMMA_CASES, ids=lambda c: f"b{c[0]}c{c[1]}h{c[2]}w{c[3]}oc{c[4]}k{c[5][0]}x{c[5][1]}")
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_conv2d_wgmma_edges(device, case, dtype):
    """Exact integer results (no scale) in both memory formats; scale and bias per channel on a bf16 / fp16 copy."""
    b, c, h, w, oc, kernel, stride, padding, dilation, pad_value = case
    weight = torch.randn(oc, c, *kernel, device=device)
    for memory_format in (torch.channels_last, torch.contiguous_format):
        x = random_input((b, c, h, w), dtype, device).contiguous(memory_format=memory_format)
        actual, expected = run_conv(x, weight, stride, padding, dilation, pad_value=pad_value)
        assert actual.is_contiguous(memory_format=memory_format)
        assert_matches(actual, expected, dtype, True, f"conv {case} {dtype} {memory_format}")
    x = random_input((b, c, h, w), torch.bfloat16, device).contiguous(memory_format=torch.channels_last)
    scale, bias = scale_and_bias("per_channel", oc, device)
    actual, expected = run_conv(x, weight, stride, padding, dilation, scale, bias, pad_value=pad_value)
    assert_matches(actual, expected, torch.bfloat16, False, f"conv {case} bf16 scale+bias")


@requires_cuda
def test_conv2d_wgmma_dispatch_cuda():
    """Which kernel serves which convolution on a compute capability 9.0 GPU, by the names the profiler records."""
    skip_without_wgmma()

    def kernels(b, c, h, w, sign_zero=False):
        x = random_input((b, c, h, w), torch.float16, "cuda").contiguous(memory_format=torch.channels_last)
        w_packed = ops.pack_signs(torch.randn(64, 3, 3, c, device="cuda"))
        args = (c, [3, 3], [1, 1], [1, 1], [1, 1])
        return " ".join(profiled_kernels(lambda: ops.binary_conv2d(x, w_packed, *args, sign_zero=sign_zero), ("conv2d",)))

    assert "binary_conv2d_wgmma_kernel" in kernels(16, 128, 12, 16)  # 3072 pixels
    assert "binary_conv2d_wgmma_kernel" not in kernels(1, 128, 37, 83)  # 3071
    assert "binary_conv2d_wgmma_kernel" not in kernels(16, 160, 12, 16)  # 5 channel words
    assert "binary_conv2d_wgmma_kernel" not in kernels(16, 128, 12, 16, sign_zero=True)  # two planes


@requires_cuda
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])
def test_conv2d_pipelined_tile_switch_cuda(dtype):
    """The one-plane mma.sync kernel takes 64 x 32 tiles in two K groups while those blocks are one wave (3 an SM),
    and 128 x 64 tiles from one block more: both sides of the switch exact (C = OC = 64: two channel words, never the
    wgmma kernel; 3x3 dilation 2 pad 2, never the halo kernel; 128 output pixels an image, so 4 blocks of 64 x 32 an
    image), and served by the kernel the switch names (template arguments BM, BN, WARPS_M, WARPS_N, K groups)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    weight = torch.randn(64, 64, 3, 3, device="cuda")
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    args = (64, [3, 3], [1, 1], [2, 2], [2, 2])
    last_small = 3 * sms // 4
    for batch, tile in ((last_small, "binary_conv2d_pipelined_kernel<64, 32, 2, 1, 2,"),
                        (last_small + 1, "binary_conv2d_pipelined_kernel<128, 64, 4, 2, 1,")):
        x = random_input((batch, 64, 16, 8), dtype, "cuda").contiguous(memory_format=torch.channels_last)
        actual, expected = run_conv(x, weight, (1, 1), (2, 2), (2, 2), pad_value=-1.0)
        assert_matches(actual, expected, dtype, True, f"conv batch={batch} {dtype}")
        names = profiled_kernels(lambda: ops.binary_conv2d(x, w_packed, *args, pad_value=-1.0), ("conv2d",))
        assert any(tile in name for name in names), f"batch {batch}: no {tile} in {names}"


@requires_cuda
@pytest.mark.parametrize("channels", [48, 80])
def test_conv2d_tap_table_cuda(channels):
    """The 128 x 64 tile's three-block build (8-byte pieces: 2 channel words here) reads D_t from a table made once a
    launch (conv_tap_table_kernel); the other builds (4-byte pieces: 3 words) tabulate it in each block. Both exact
    just past the 64 x 32 tile's wave (100 images on 132 SMs) and past one wave of their own, with stray weight bits
    past the channels (the table masks them), padded taps of every pad value and OC = 70 (past one 32-column block of
    the table kernel, not a multiple of 64). 128 output pixels an image; 3x3 dilation 2 pad 2 (never the halo kernel)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    weight = torch.randn(70, channels, 3, 3, device="cuda")
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    w_packed[..., -1] |= torch.tensor(-1 << (channels % 32), dtype=torch.int32)
    args = (channels, [3, 3], [1, 1], [2, 2], [2, 2])
    table = channels <= 64
    for batch, pad_value in ((3 * sms // 4 + 1, -1.0), (3 * sms + 1, 1.0), (3 * sms + 1, 0.0)):
        x = random_input((batch, channels, 16, 8), torch.float16, "cuda").contiguous(memory_format=torch.channels_last)
        actual = ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value)
        expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *args, None, None, pad_value=pad_value)
        assert_matches(actual, expected, torch.float16, True, f"conv batch={batch} C={channels} pad {pad_value}")
        names = profiled_kernels(lambda: ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value), ("conv2d",))
        tile = f"binary_conv2d_pipelined_kernel<128, 64, 4, 2, 1, {2 if table else 1},"
        assert any(tile in name for name in names), f"batch {batch}: no {tile} in {names}"
        assert any("conv_tap_table_kernel" in name for name in names) == table, f"batch {batch}: {names}"


# (batch, channels, height, width, out_channels, pad_value): the halo kernel's edges (3x3 stride 1 pad 1, 33..64
# channels, no residual): tiles of 128 output pixels within one image (partial last tiles: 9x9, 13x11, 5x7), images
# 1 and 300 pixels wide (halo rows of 4 and 304 pixels), output channels past a 64 tile (70, 72, 130) and under 8,
# 33 and 64 channels (a tap's first word only / both), and 600 / 300 images: more m tiles than each n tile's blocks
# (two an SM), so blocks walk several tiles through both halo buffers.
HALO_CASES = [  # (batch, channels, height, width, out channels, pad value, stride)
    (3, 64, 9, 9, 64, -1.0, 1),
    (2, 40, 13, 11, 72, 0.0, 1),
    (2, 33, 5, 7, 37, 1.0, 1),
    (2, 64, 17, 1, 8, -1.0, 1),
    (2, 64, 6, 300, 70, 1.0, 1),
    (600, 40, 5, 7, 37, 0.0, 1),
    (300, 64, 8, 8, 130, -1.0, 1),
    (2, 64, 17, 13, 128, -1.0, 2),
    (3, 40, 8, 8, 70, 1.0, 2),
    (2, 64, 1, 9, 8, 0.0, 2),
    (2, 64, 6, 300, 64, 1.0, 2),
    (300, 48, 9, 10, 72, -1.0, 2),
]


@requires_cuda
@pytest.mark.parametrize("case", HALO_CASES, ids=lambda c: f"b{c[0]}c{c[1]}h{c[2]}w{c[3]}oc{c[4]}s{c[6]}")
def test_conv2d_halo_cuda(case):
    """binary_conv2d_halo_kernel serves 3x3 stride 1 or 2 pad 1 convs of 33..64 channels: exact integer
    results in fp16 and fp32, channels_last and NCHW; per-channel scale and bias on bf16; binary_conv2d_packed's sign
    words (int32 out) equal to pack_signs of its fp32 values; and the kernel the profiler records is the halo one."""
    b, c, h, w, oc, pad_value, stride = case
    weight = torch.randn(oc, c, 3, 3, device="cuda")
    geometry = ((stride, stride), (1, 1), (1, 1))
    for dtype in (torch.float16, torch.float32):
        for memory_format in (torch.channels_last, torch.contiguous_format):
            x = random_input((b, c, h, w), dtype, "cuda").contiguous(memory_format=memory_format)
            actual, expected = run_conv(x, weight, *geometry, pad_value=pad_value)
            assert actual.is_contiguous(memory_format=memory_format)
            assert_matches(actual, expected, dtype, True, f"halo {case} {dtype} {memory_format}")
    x = random_input((b, c, h, w), torch.bfloat16, "cuda").contiguous(memory_format=torch.channels_last)
    scale, bias = scale_and_bias("per_channel", oc, "cuda")
    actual, expected = run_conv(x, weight, *geometry, scale, bias, pad_value=pad_value)
    assert_matches(actual, expected, torch.bfloat16, False, f"halo {case} bf16 scale+bias")
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    x_bits = ops.pack_signs(x.permute(0, 2, 3, 1))
    args = (c, [3, 3], [stride, stride], [1, 1], [1, 1], scale, bias)

    def packed(dtype):
        return ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=pad_value)

    values = packed(torch.float32)
    assert torch.equal(packed(torch.int32), ops.pack_signs(values.permute(0, 2, 3, 1))), f"halo {case} sign words"
    # The kernel takes sign words from integer thresholds on the dot (halo_sign_threshold): signed per-channel scales
    # with zeros among them, a negative scalar scale and no epilogue give the signs of its fp32 values too.
    signed = torch.randn(oc, device="cuda")
    signed[::5] = 0.0
    for s, b_ in ((signed, bias), (torch.tensor(-0.75, device="cuda"), bias), (None, None)):
        epilogue_args = (c, [3, 3], [stride, stride], [1, 1], [1, 1], s, b_)
        fp32 = ops.binary_conv2d_packed(x_bits, w_packed, *epilogue_args, out_dtype=torch.float32, pad_value=pad_value)
        expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *epilogue_args[:5],
                                           None if s is None else s.cpu(), None if b_ is None else b_.cpu(),
                                           pad_value=pad_value)
        assert_matches(fp32, expected, torch.float32, s is None, f"halo {case} fp32, signed scale")
        words = ops.binary_conv2d_packed(x_bits, w_packed, *epilogue_args, out_dtype=torch.int32, pad_value=pad_value)
        assert torch.equal(words, ops.pack_signs(fp32.permute(0, 2, 3, 1))), f"halo {case} sign words, signed scale"
    # a residual (fp16 / bf16, 16-byte rows: staged with the tile's halo), with the sum's sign words
    y = packed(torch.bfloat16)
    r = _residual_like(y, "channels_last")
    if oc * 2 % 16 == 0:
        out, bits = ops.binary_conv2d_packed_with_signs(x_bits, w_packed, *args, r, out_dtype=torch.bfloat16,
                                                        pad_value=pad_value)
        assert torch.equal(out, y + r), f"halo {case} residual"
        assert torch.equal(bits, ops.pack_signs(out.permute(0, 2, 3, 1))), f"halo {case} residual sign words"
        names = profiled_kernels(lambda: ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=torch.bfloat16,
                                                                  pad_value=pad_value, residual=r), ("conv2d",))
        assert any("binary_conv2d_halo_kernel" in name for name in names), names
    for run in (lambda: packed(torch.int32), lambda: ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value)):
        names = profiled_kernels(run, ("conv2d",))
        assert any("binary_conv2d_halo_kernel" in name for name in names), names


@requires_cuda
def test_conv2d_halo_dispatch_cuda():
    """The halo kernel's limits: a residual it cannot stage (one element past an aligned address, or an fp32 output),
    500-pixel rows (the halo past its shared memory), 65 channels or stride 3 go to the other kernels, exact all the
    same; stride 2 stays on it, with a residual too."""
    def served(c, h, w, stride, residual, dtype=torch.float16):
        weight = torch.randn(64, c, 3, 3, device="cuda")
        w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
        x = random_input((2, c, h, w), torch.float16, "cuda").contiguous(memory_format=torch.channels_last)
        x_bits = ops.pack_signs(x.permute(0, 2, 3, 1))
        args = (c, [3, 3], [stride, stride], [1, 1], [1, 1])
        y = ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=-1.0)
        expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *args, None, None, pad_value=-1.0)
        assert_matches(y, expected, dtype, True, f"c={c} {h}x{w} stride {stride}")
        r = _residual_like(y, residual) if residual else None
        run = lambda: ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=-1.0, residual=r)
        if residual:
            assert torch.equal(run(), y + r)
        return " ".join(profiled_kernels(run, ("conv2d",)))

    assert "binary_conv2d_halo_kernel" in served(64, 12, 12, 1, False)
    assert "binary_conv2d_halo_kernel" in served(64, 12, 12, 1, "channels_last")
    assert "binary_conv2d_halo_kernel" not in served(64, 12, 12, 1, "offset")
    assert "binary_conv2d_halo_kernel" not in served(64, 12, 12, 1, "channels_last", torch.float32)
    assert "binary_conv2d_halo_kernel" in served(64, 2, 450, 1, False)
    assert "binary_conv2d_halo_kernel" not in served(64, 2, 500, 1, False)
    assert "binary_conv2d_halo_kernel" not in served(65, 12, 12, 1, False)
    assert "binary_conv2d_halo_kernel" in served(64, 12, 12, 2, False)
    assert "binary_conv2d_halo_kernel" in served(64, 12, 12, 2, "channels_last")
    assert "binary_conv2d_halo_kernel" not in served(64, 12, 12, 3, False)


@requires_cuda
@pytest.mark.parametrize("pad_value", [-1.0, 0.0, 1.0])
def test_conv2d_wgmma_tap_table_cuda(pad_value):
    """The wgmma conv reads its columns' D_t from conv_tap_table_kernel's table: launched ahead of the packing of x
    (binary_conv2d: the table, pack_signs launched dependent on it, the conv) or by the conv's own launch
    (binary_conv2d_packed, and sign words out). Exact on every path with stray weight bits past the channels (the
    table masks them), C = 100 (4 channel words, 4 real bits in the last), OC = 200 (a partial second block of 128
    columns), every pad value, at 3072 output pixels (the wgmma kernel's first size)."""
    skip_without_wgmma()
    c, oc = 100, 200
    weight = torch.randn(oc, c, 3, 3, device="cuda")
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    w_packed[..., -1] |= torch.tensor(-1 << (c % 32), dtype=torch.int32, device="cuda")
    args = (c, [3, 3], [1, 1], [1, 1], [1, 1])
    x = random_input((16, c, 12, 16), torch.float16, "cuda").contiguous(memory_format=torch.channels_last)
    x_bits = ops.pack_signs(x.permute(0, 2, 3, 1))
    expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *args, None, None, pad_value=pad_value)

    def packed(dtype):
        return ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=pad_value)

    actual = ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value)
    assert_matches(actual, expected, torch.float16, True, f"binary_conv2d pad {pad_value}")
    assert_matches(packed(torch.float16), expected, torch.float16, True, f"binary_conv2d_packed pad {pad_value}")
    values = packed(torch.float32)
    assert_matches(values, expected, torch.float32, True, f"binary_conv2d_packed fp32 pad {pad_value}")
    assert torch.equal(packed(torch.int32), ops.pack_signs(values.permute(0, 2, 3, 1))), f"sign words pad {pad_value}"
    for call in (lambda: ops.binary_conv2d(x, w_packed, *args, pad_value=pad_value), lambda: packed(torch.float16)):
        names = profiled_kernels(call, ("conv2d",))
        assert any("binary_conv2d_wgmma_kernel" in name for name in names), names
        assert any("conv_tap_table_kernel" in name for name in names), names


@requires_cuda
@pytest.mark.parametrize("pad_value", [-1.0, 0.0, 1.0])
@pytest.mark.parametrize("epilogue", ["column", "scalar", "bias"])
def test_conv2d_wgmma_sign_words_epilogue_cuda(pad_value, epilogue):
    """The wgmma conv writes sign words from its accumulators, by a threshold on the integer dot a column (16- and
    32-bit outputs go through its E1 / E2 tile instead): the words are the signs of the fp32 values of the same conv
    (epilogue_value's fma), bit for bit, and those values the reference's (to fp32 rounding). Scales of both signs (a
    negative scale flips a sign) with zeros among them, one per column, one for all, or a bias alone; OC = 200 (a
    partial second block of 128 columns, the last word's bits past OC zero); 3x3 at 3456 output pixels (the wgmma
    kernel's sizes)."""
    skip_without_wgmma()
    c, oc = 128, 200
    weight = torch.randn(oc, c, 3, 3, device="cuda")
    w_packed = ops.pack_signs(weight.permute(0, 2, 3, 1))
    scale = {"column": torch.randn(oc, device="cuda"), "scalar": -torch.rand(1, device="cuda") - 0.5,
             "bias": None}[epilogue]
    if epilogue == "column":
        scale[::7] = 0.0  # constant columns: the bias's sign
    bias = torch.randn(oc, device="cuda") * 8
    args = (c, [3, 3], [1, 1], [1, 1], [1, 1], scale, bias)
    x = random_input((24, c, 12, 12), torch.float16, "cuda").contiguous(memory_format=torch.channels_last)
    x_bits = ops.pack_signs(x.permute(0, 2, 3, 1))

    def packed(dtype):
        return ops.binary_conv2d_packed(x_bits, w_packed, *args, out_dtype=dtype, pad_value=pad_value)

    values = packed(torch.float32)
    expected = reference.binary_conv2d(x.cpu(), w_packed.cpu(), *args[:5], scale.cpu() if scale is not None else None,
                                       bias.cpu(), pad_value=pad_value)
    assert_matches(values, expected, torch.float32, False, f"fp32 values {epilogue} pad {pad_value}")
    words = packed(torch.int32)
    assert torch.equal(words, ops.pack_signs(values.permute(0, 2, 3, 1))), f"sign words {epilogue} pad {pad_value}"
    names = profiled_kernels(lambda: packed(torch.int32), ("conv2d",))
    assert any("binary_conv2d_wgmma_kernel" in name for name in names), names


@requires_cuda
def test_weight_linear_cublas_path_keeps_reduction_flags_cuda():
    """Above 4096 rows binary_weight_linear runs cuBLAS with its split-K sums in fp32 (fp32 accumulation) and gives
    torch's reduced-precision-reduction flags back as the user set them."""
    matmul = torch.backends.cuda.matmul
    saved = (matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction)
    try:
        for flags in ((True, True), (False, True), (True, False)):
            matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction = flags
            x = random_input((4097, 1024), torch.bfloat16, "cuda")
            _, w_packed = packed_weight(100, 1024, "cuda")
            scale, bias = scale_and_bias("per_channel", 100, "cuda")
            actual, expected, magnitude = run_linear("binary_weight_linear", x, w_packed, 1024, scale, bias)
            assert_rounded_matches(actual, expected, bias, torch.bfloat16, f"flags {flags}", magnitude)
            after = (matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction)
            assert after == flags, f"flags {flags} came back as {after}"
    finally:
        matmul.allow_fp16_reduced_precision_reduction, matmul.allow_bf16_reduced_precision_reduction = saved
