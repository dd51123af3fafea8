"""The bitcompile op catalogue: every custom op's schema, fake kernel, autograd and Python wrapper.

Kernels live in csrc/cpu and csrc/cuda and register themselves for the CPU and CUDA dispatch keys
(TORCH_LIBRARY_IMPL); the pure PyTorch math each op must agree with is in reference.py.

Storage formats (SPEC.md 2.1, 2.5):
- signs: int32 words along the reduction dimension, value `32*w + j` at bit `j` of word `w`
  (LSB first), bit = 1 for +1 (x >= 0). Tail bits are 0. `pack_signs` makes them.
- APoT codes: uint8, two codes a byte (element 2j in the low nibble, 2j+1 in the high one) for
  schemes of 4 bits or less, one code a byte above. `pack_codes` makes them.
- conv2d weights are packed as `pack_signs(W.permute(0, 2, 3, 1))`: [OC, KH, KW, ceil(C/32)]
  for binary, and `pack_codes(codes.permute(0, 2, 3, 1).reshape(OC, -1))` for APoT.

Two kinds of linear/conv op:
- inference ops take packed weights (binary_linear, binary_weight_linear, binary_conv2d,
  binary_weight_conv2d, apot_linear, apot_linear_int, apot_conv2d). They are not differentiable: called with inputs
  that require grad (a quantize_'d model run without torch.no_grad) they return the same result
  as without, and a backward through them raises an error naming the op and its training form
  ("Inference ops under autograd" below). A training graph uses
- the `*_ste` ops, which take the float latent weight, binarize and pack it inside, run the same
  kernels forward and give the straight-through-estimator gradients backward.

The backend's run-time weight ops (linear_of_weight, ...) are in weight_ops.py, above this file
and quantize.py, whose conversion they reuse. This file imports nothing of bitcompile but _build:
it is the bottom layer every other module builds on.
"""

from __future__ import annotations

import math
import threading
from typing import Optional, Sequence

import torch
from torch import Tensor

from bitcompile import _build

_FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

# ----------------------------------------------------------------------------------------------
# Schemas
# ----------------------------------------------------------------------------------------------
_lib = torch.library.Library("bitcompile", "DEF")

# Ops served by the C++/CUDA kernels (the lazy loader below stands in for them until first use).
KERNEL_OPS = (
    "pack_signs",
    "binary_linear",
    "binary_weight_linear",
    "binary_conv2d",
    "binary_conv2d_packed",
    "binary_conv2d_packed_with_signs",
    "pack_codes",
    "apot_linear",
    "apot_linear_int",
    "apot_conv2d",
)
# Ops whose C++ kernel is the CPU's alone (AVX-512 builds): elsewhere their composite form below runs.
CPU_KERNEL_OPS = ("binary_weight_conv2d",)

_lib.define("ste_sign(Tensor x, float clip=1.0) -> Tensor")
_lib.define("pack_signs(Tensor x) -> Tensor")
# sign_zero: x came through torch.sign, so an exact zero of x contributes 0 (not +1).
# row_scale: multiply each output row by mean(|x|) over the in_features (XNOR-Net's beta).
_lib.define(
    "binary_linear(Tensor x, Tensor w_packed, SymInt in_features, Tensor? scale=None, "
    "Tensor? bias=None, *, bool sign_zero=False, bool row_scale=False) -> Tensor"
)
_lib.define(
    "binary_weight_linear(Tensor x, Tensor w_packed, SymInt in_features, Tensor? scale=None, "
    "Tensor? bias=None) -> Tensor"
)
# pad_value: what a padded position of s(x) is: 0 (F.conv2d zero padding), or -1 / +1 (an
# explicit F.pad(s(x), value=...) folded into the conv, as larq and bitorch-engine pad).
_lib.define(
    "binary_conv2d(Tensor x, Tensor w_packed, SymInt in_channels, SymInt[2] kernel_size, "
    "SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, Tensor? scale=None, "
    "Tensor? bias=None, *, float pad_value=0.0, bool sign_zero=False) -> Tensor"
)
# A binary-weight conv (x not binarized: BinaryConnect / XNOR-Net's BWN layers, quantize_("binary_weight")):
# conv2d(x, s(W)) * scale[OC] + bias, fp32 sums, zero padding, the weight packed as binary_conv2d's.
_lib.define(
    "binary_weight_conv2d(Tensor x, Tensor w_packed, SymInt in_channels, SymInt[2] kernel_size, "
    "SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None) -> Tensor"
)
# binary_conv2d on activations packed already: x_bits = pack_signs(x.permute(0, 2, 3, 1)), int32 [N, H, W,
# ceil(C / 32)] (bit 1 for x >= 0, so no torch.sign zeros). The same values as binary_conv2d(x, ...) (sign_zero
# False), in out_dtype, channels_last; without binary_conv2d's packing pass over x, which the passes hand to
# inductor to fuse into whatever produces x. out_dtype int32: the output's sign words instead, in the same layout
# (pack_signs of y.permute(0, 2, 3, 1), bit 1 for a value >= 0 in fp32, before any rounding), for a next binary conv.
# residual (a float out_dtype): a tensor of the output's shape and dtype added to it, as `y + residual` of two
# out_dtype tensors (y rounded first, the fp32 sum rounded once): a ResNet block's shortcut, added in the conv's
# epilogue instead of a pass of its own over three activations.
_lib.define(
    "binary_conv2d_packed(Tensor x_bits, Tensor w_packed, SymInt in_channels, SymInt[2] kernel_size, "
    "SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None, "
    "Tensor? residual=None, *, ScalarType out_dtype, float pad_value=0.0) -> Tensor"
)
# binary_conv2d_packed with a float out_dtype, and the output's sign words beside it: (out, out_bits), out_bits =
# pack_signs(out.permute(0, 2, 3, 1)) of the stored values (after the residual and the rounding), int32 [N, OH, OW,
# ceil(OC / 32)]. A ResNet block's sum read by the next block's shortcut and, as signs, by its first conv: one
# epilogue writes both (passes/residual.py).
_lib.define(
    "binary_conv2d_packed_with_signs(Tensor x_bits, Tensor w_packed, SymInt in_channels, SymInt[2] kernel_size, "
    "SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None, "
    "Tensor? residual=None, *, ScalarType out_dtype, float pad_value=0.0) -> (Tensor, Tensor)"
)
# Training forms. sign_zero / weight_sign_zero: x / the weight came through torch.sign rather than
# ste_sign: an exact zero contributes 0, and that operand gets torch.sign's gradient, exactly 0
# (training graphs with torch.sign layers); scale, bias and the other operand keep theirs.
_lib.define(
    "binary_linear_ste(Tensor x, Tensor weight, Tensor? scale=None, Tensor? bias=None, *, "
    "float clip=1.0, bool row_scale=False, bool sign_zero=False, bool weight_sign_zero=False) -> Tensor"
)
_lib.define(
    "binary_weight_linear_ste(Tensor x, Tensor weight, Tensor? scale=None, Tensor? bias=None, *, "
    "float clip=1.0, bool weight_sign_zero=False) -> Tensor"
)
_lib.define(
    "binary_conv2d_ste(Tensor x, Tensor weight, SymInt[2] stride, SymInt[2] padding, "
    "SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None, *, float pad_value=0.0, "
    "float clip=1.0, bool sign_zero=False, bool weight_sign_zero=False) -> Tensor"
)
# APoT: `code_values[c]` is the value of code c relative to alpha (level / alpha, signed), a
# table of 2**bits float32; `alpha` is a scalar or one per output channel.
_lib.define("pack_codes(Tensor codes, int bits) -> Tensor")
_lib.define(
    "apot_linear(Tensor x, Tensor w_packed, SymInt in_features, int bits, Tensor code_values, "
    "Tensor alpha, Tensor? bias=None) -> Tensor"
)
# Integer activations x = x_scale * (q_x - x_zero_point), q_x uint8; weight = alpha / denominator *
# code_numerators[code] with integer numerators: exact int32 accumulation, fp32 output.
_lib.define(
    "apot_linear_int(Tensor q_x, Tensor x_scale, Tensor x_zero_point, Tensor w_packed, "
    "SymInt in_features, int bits, Tensor code_numerators, float denominator, Tensor alpha, "
    "Tensor? bias=None) -> Tensor"
)
_lib.define(
    "apot_conv2d(Tensor x, Tensor w_packed, SymInt in_channels, SymInt[2] kernel_size, "
    "SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, int bits, Tensor code_values, "
    "Tensor alpha, Tensor? bias=None) -> Tensor"
)


# ----------------------------------------------------------------------------------------------
# Lazy kernel loading: `import bitcompile` compiles nothing (DESIGN.md "Build").
# ----------------------------------------------------------------------------------------------
class _LazyKernels:
    """Stands in for one device's C++ kernels until the first call builds and loads them.

    The stand-ins are Python kernels on a Library of their own. The first call removes them
    (`_destroy`), loads the shared library (its TORCH_LIBRARY_IMPL registers the real kernels)
    and calls the op again; from then on the dispatcher goes straight to C++.
    """

    def __init__(self, dispatch_key: str, build, ops: Sequence[str]):
        self.dispatch_key = dispatch_key
        self.build = build
        self.ops = ops
        self.loaded = False
        self.built: list[str] = []
        self.lock = threading.Lock()
        self.library = None
        self._register_stand_ins()

    def _register_stand_ins(self) -> None:
        self.library = torch.library.Library("bitcompile", "IMPL")
        for name in self.ops:
            self.library.impl(name, self._stand_in(name), self.dispatch_key)

    def _stand_in(self, name: str):
        def call_after_loading(*args, **kwargs):
            self.load()
            return getattr(torch.ops.bitcompile, name).default(*args, **kwargs)

        return call_after_loading

    def load(self) -> list[str]:
        with self.lock:
            if self.loaded:
                return self.built
            self.library._destroy()
            try:
                self.built = self.build()
            except Exception:
                self._register_stand_ins()  # keep a clear error for the next call too
                raise
            self.loaded = True
            return self.built


_lazy_kernels = {
    "cpu": _LazyKernels("CPU", _build.build_cpu, KERNEL_OPS + CPU_KERNEL_OPS),
    "cuda": _LazyKernels("CUDA", _build.build_cuda, KERNEL_OPS),
}


def load_kernels(device: str = "cpu") -> list[str]:
    """Build (or take from the cache) and load the kernels of `device` ("cpu" or "cuda") now;
    returns the names of the libraries loaded."""
    return _lazy_kernels[torch.device(device).type].load()


# ----------------------------------------------------------------------------------------------
# Shape checks shared by the fake kernels (the C++ kernels check the same in csrc/checks.h)
# ----------------------------------------------------------------------------------------------
def _check(cond, op: str, message) -> None:
    if cond is True:  # the common case, without torch._check's call (host time: the weight ops run it per call)
        return
    torch._check(cond, lambda: f"bitcompile::{op}: {message() if callable(message) else message}")


def packed_words(in_features) -> int:
    """Number of int32 words that hold `in_features` signs."""
    return (in_features + 31) // 32


def packed_code_bytes(in_features, bits: int) -> int:
    """Number of bytes that hold `in_features` APoT codes of `bits` bits."""
    return (in_features + 1) // 2 if bits <= 4 else in_features


def _check_float_input(op: str, x: Tensor, name: str = "x") -> None:
    _check(x.dtype in _FLOAT_DTYPES, op, lambda: f"{name} must be float32, float16 or bfloat16, got {x.dtype}")


def _check_same_device(op: str, x: Tensor, **others: Optional[Tensor]) -> None:
    for name, tensor in others.items():
        if tensor is not None:
            _check(
                tensor.device == x.device,
                op,
                lambda: f"{name} is on {tensor.device} but x is on {x.device}",
            )


def _check_scale_bias(op: str, x: Tensor, out_features, scale: Optional[Tensor], bias: Optional[Tensor]) -> None:
    _check_same_device(op, x, scale=scale, bias=bias)
    if scale is not None:
        _check(
            scale.numel() == 1 or (scale.dim() == 1 and scale.shape[0] == out_features),
            op,
            lambda: f"scale must be a scalar or have {out_features} elements (one per output), got shape {tuple(scale.shape)}",
        )
        _check(scale.is_floating_point(), op, lambda: f"scale must be floating point, got {scale.dtype}")
    if bias is not None:
        _check(
            bias.dim() == 1 and bias.shape[0] == out_features,
            op,
            lambda: f"bias must have shape ({out_features},), got {tuple(bias.shape)}",
        )
        _check(bias.is_floating_point(), op, lambda: f"bias must be floating point, got {bias.dtype}")


def _check_packed_linear(op: str, x: Tensor, w_packed: Tensor, in_features, expected_width, dtype) -> None:
    _check(x.dim() >= 1, op, "x must have at least one dimension")
    _check(w_packed.dim() == 2, op, lambda: f"w_packed must be 2-D (out_features, words), got {w_packed.dim()}-D")
    _check(w_packed.dtype == dtype, op, lambda: f"w_packed must be {dtype}, got {w_packed.dtype}")
    _check(in_features >= 1, op, lambda: f"in_features must be positive, got {in_features}")
    _check(
        x.shape[-1] == in_features,
        op,
        lambda: f"x has {x.shape[-1]} features, the weight was packed for {in_features}",
    )
    _check(
        w_packed.shape[1] == expected_width,
        op,
        lambda: f"w_packed is {w_packed.shape[1]} wide, {in_features} features need {expected_width}",
    )
    _check_same_device(op, x, w_packed=w_packed)


def _conv_output_size(op, size, kernel, stride, padding, dilation):
    out = (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1
    _check(out >= 1, op, lambda: f"input of size {size} is too small for kernel {kernel} (dilation {dilation}, padding {padding})")
    return out


def _check_conv_geometry(op, x, in_channels, kernel_size, stride, padding, dilation):
    _check(x.dim() == 4, op, lambda: f"x must be 4-D (N, C, H, W), got {x.dim()}-D")
    _check(x.shape[1] == in_channels, op, lambda: f"x has {x.shape[1]} channels, the weight was packed for {in_channels}")
    _check_conv_parameters(op, kernel_size, stride, padding, dilation)


def _check_conv_weight(op, w_packed, in_channels, kernel_size):
    """w_packed = pack_signs(W.permute(0, 2, 3, 1)): int32 [OC, KH, KW, ceil(C / 32)]."""
    _check(w_packed.dtype == torch.int32, op, lambda: f"w_packed must be int32, got {w_packed.dtype}")
    expected = (kernel_size[0], kernel_size[1], packed_words(in_channels))
    _check(
        w_packed.dim() == 4 and tuple(w_packed.shape[1:]) == expected,
        op,
        lambda: f"w_packed must have shape (out_channels, {expected[0]}, {expected[1]}, {expected[2]}), got {tuple(w_packed.shape)}",
    )


def _check_conv_parameters(op, kernel_size, stride, padding, dilation):
    for name, values, low in (("kernel_size", kernel_size, 1), ("stride", stride, 1), ("dilation", dilation, 1), ("padding", padding, 0)):
        _check(len(values) == 2, op, lambda: f"{name} must have 2 values, got {len(values)}")
        _check(all(v >= low for v in values), op, lambda: f"{name} must be >= {low}, got {list(values)}")


def _conv_output(op, x, out_channels, kernel_size, stride, padding, dilation, dtype=None):
    height = _conv_output_size(op, x.shape[2], kernel_size[0], stride[0], padding[0], dilation[0])
    width = _conv_output_size(op, x.shape[3], kernel_size[1], stride[1], padding[1], dilation[1])
    memory_format = torch._prims_common.suggest_memory_format(x)
    return x.new_empty((x.shape[0], out_channels, height, width), dtype=dtype).contiguous(memory_format=memory_format)


# ----------------------------------------------------------------------------------------------
# ste_sign (SPEC 2.1): s(x) = +1 if x >= 0 else -1; grad = grad * (|x| <= clip)
# ----------------------------------------------------------------------------------------------
@torch.library.impl(_lib, "ste_sign", "CompositeExplicitAutograd")
def _ste_sign_impl(x: Tensor, clip: float = 1.0) -> Tensor:
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


@torch.library.register_fake("bitcompile::ste_sign")
def _ste_sign_fake(x, clip=1.0):
    _check(x.is_floating_point(), "ste_sign", lambda: f"x must be floating point, got {x.dtype}")
    return torch.empty_like(x)


def _ste_sign_setup(ctx, inputs, output):
    x, *rest = inputs
    ctx.clip = rest[0] if rest else 1.0
    ctx.save_for_backward(x)


def _ste_sign_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    return grad * (x.abs() <= ctx.clip).to(grad.dtype), None


torch.library.register_autograd("bitcompile::ste_sign", _ste_sign_backward, setup_context=_ste_sign_setup)


# ----------------------------------------------------------------------------------------------
# Packing
# ----------------------------------------------------------------------------------------------
@torch.library.register_fake("bitcompile::pack_signs")
def _pack_signs_fake(x):
    _check_float_input("pack_signs", x)
    _check(x.dim() >= 1 and x.shape[-1] >= 1, "pack_signs", "x must have a non-empty last dimension")
    return x.new_empty((*x.shape[:-1], packed_words(x.shape[-1])), dtype=torch.int32)


@torch.library.register_fake("bitcompile::pack_codes")
def _pack_codes_fake(codes, bits):
    _check(1 <= bits <= 8, "pack_codes", lambda: f"bits must be in 1..8, got {bits}")
    _check(codes.dtype in (torch.uint8, torch.int32, torch.int64, torch.int16, torch.int8), "pack_codes",
           lambda: f"codes must be an integer tensor, got {codes.dtype}")
    _check(codes.dim() >= 1 and codes.shape[-1] >= 1, "pack_codes", "codes must have a non-empty last dimension")
    return codes.new_empty((*codes.shape[:-1], packed_code_bytes(codes.shape[-1], bits)), dtype=torch.uint8)


# ----------------------------------------------------------------------------------------------
# Binary inference ops (packed weights)
# ----------------------------------------------------------------------------------------------
@torch.library.register_fake("bitcompile::binary_linear")
def _binary_linear_fake(x, w_packed, in_features, scale=None, bias=None, *, sign_zero=False, row_scale=False):
    op = "binary_linear"
    _check_float_input(op, x)
    _check_packed_linear(op, x, w_packed, in_features, packed_words(in_features), torch.int32)
    _check_scale_bias(op, x, w_packed.shape[0], scale, bias)
    return x.new_empty((*x.shape[:-1], w_packed.shape[0]))


@torch.library.register_fake("bitcompile::binary_weight_linear")
def _binary_weight_linear_fake(x, w_packed, in_features, scale=None, bias=None):
    op = "binary_weight_linear"
    _check_float_input(op, x)
    _check_packed_linear(op, x, w_packed, in_features, packed_words(in_features), torch.int32)
    _check_scale_bias(op, x, w_packed.shape[0], scale, bias)
    return x.new_empty((*x.shape[:-1], w_packed.shape[0]))


def _binary_conv_operands_fake(op, x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias):
    """binary_conv2d / binary_weight_conv2d: float x, the packed weight, scale and bias checked (as checks.h's
    check_binary_conv_operands); the output's fake tensor."""
    _check_float_input(op, x)
    _check_conv_geometry(op, x, in_channels, kernel_size, stride, padding, dilation)
    _check_conv_weight(op, w_packed, in_channels, kernel_size)
    _check_same_device(op, x, w_packed=w_packed)
    _check_scale_bias(op, x, w_packed.shape[0], scale, bias)
    return _conv_output(op, x, w_packed.shape[0], kernel_size, stride, padding, dilation)


@torch.library.register_fake("bitcompile::binary_conv2d")
def _binary_conv2d_fake(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale=None, bias=None,
                        *, pad_value=0.0, sign_zero=False):
    op = "binary_conv2d"
    out = _binary_conv_operands_fake(op, x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias)
    _check(pad_value in (0.0, 1.0, -1.0), op, lambda: f"pad_value must be 0, 1 or -1, got {pad_value}")
    return out


@torch.library.register_fake("bitcompile::binary_weight_conv2d")
def _binary_weight_conv2d_fake(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale=None,
                               bias=None):
    return _binary_conv_operands_fake("binary_weight_conv2d", x, w_packed, in_channels, kernel_size, stride, padding,
                                      dilation, scale, bias)


@torch.library.impl(_lib, "binary_weight_conv2d", "CompositeExplicitAutograd")
def _binary_weight_conv2d_composite(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale=None,
                                    bias=None):
    """Where no kernel is registered (CUDA, a CPU build without AVX-512): the weight dequantized to x's dtype, the
    dense conv (cuDNN / oneDNN; fp32 without TF32), the bias in fp32 after it."""
    _binary_weight_conv2d_fake(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias)
    weight = unpack_signs(w_packed, in_channels, torch.float32).permute(0, 3, 1, 2)  # [OC, C, KH, KW]
    if scale is not None:
        weight = weight * scale.to(torch.float32).reshape(-1, 1, 1, 1)
    memory_format = torch._prims_common.suggest_memory_format(x)
    cudnn = torch.backends.cudnn  # the user's settings, TF32 off (as apot_conv2d's CUDA kernel)
    y = torch.ops.aten._convolution(x, weight.to(x.dtype).contiguous(memory_format=memory_format), None,
                                    list(stride), list(padding), list(dilation), False, [0, 0], 1, cudnn.benchmark,
                                    cudnn.deterministic, cudnn.enabled, False)
    if bias is not None:
        y = (y.float() + bias.to(torch.float32).reshape(1, -1, 1, 1)).to(x.dtype)
    return y.contiguous(memory_format=memory_format)


@torch.library.register_fake("bitcompile::binary_conv2d_packed")
def _binary_conv2d_packed_fake(x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation, scale=None,
                               bias=None, residual=None, *, out_dtype, pad_value=0.0, op="binary_conv2d_packed"):
    _check(x_bits.dtype == torch.int32, op, lambda: f"x_bits must be int32 (pack_signs words), got {x_bits.dtype}")
    words = packed_words(in_channels)
    _check(x_bits.dim() == 4 and x_bits.shape[3] == words, op,
           lambda: f"x_bits must have shape (N, H, W, {words}) for {in_channels} channels, got {tuple(x_bits.shape)}")
    _check(out_dtype in (torch.float32, torch.float16, torch.bfloat16, torch.int32), op,
           lambda: f"out_dtype must be float32, float16, bfloat16 or int32 (sign words), got {out_dtype}")
    _check_conv_parameters(op, kernel_size, stride, padding, dilation)
    _check_conv_weight(op, w_packed, in_channels, kernel_size)
    _check(pad_value in (0.0, 1.0, -1.0), op, lambda: f"pad_value must be 0, 1 or -1, got {pad_value}")
    _check_same_device(op, x_bits, w_packed=w_packed)
    _check_scale_bias(op, x_bits, w_packed.shape[0], scale, bias)
    height = _conv_output_size(op, x_bits.shape[1], kernel_size[0], stride[0], padding[0], dilation[0])
    width = _conv_output_size(op, x_bits.shape[2], kernel_size[1], stride[1], padding[1], dilation[1])
    if residual is not None:
        _check(out_dtype != torch.int32, op, lambda: "a residual needs a float out_dtype (int32 outputs are sign words)")
        shape = (x_bits.shape[0], w_packed.shape[0], height, width)
        _check(tuple(residual.shape) == shape, op,
               lambda: f"residual must have the output's shape {list(shape)}, got {list(residual.shape)}")
        _check(residual.dtype == out_dtype, op,
               lambda: f"residual must be {out_dtype} (out_dtype), got {residual.dtype}")
        _check_same_device(op, x_bits, residual=residual)
    if out_dtype == torch.int32:
        return x_bits.new_empty((x_bits.shape[0], height, width, packed_words(w_packed.shape[0])))
    out = x_bits.new_empty((x_bits.shape[0], w_packed.shape[0], height, width), dtype=out_dtype)
    return out.contiguous(memory_format=torch.channels_last)


def _with_sign_words_fake(op, x_bits, out_dtype, float_out):
    """(out, out_bits) of a with_signs op: out = float_out() (the float op's fake, out_dtype checked float first) and
    its sign words' int32 [N, OH, OW, ceil(OC / 32)]."""
    _check(out_dtype in (torch.float32, torch.float16, torch.bfloat16), op,
           lambda: f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    out = float_out()
    return out, x_bits.new_empty((out.shape[0], out.shape[2], out.shape[3], packed_words(out.shape[1])))


@torch.library.register_fake("bitcompile::binary_conv2d_packed_with_signs")
def _binary_conv2d_packed_with_signs_fake(x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation,
                                          scale=None, bias=None, residual=None, *, out_dtype, pad_value=0.0):
    op = "binary_conv2d_packed_with_signs"
    return _with_sign_words_fake(op, x_bits, out_dtype, lambda: _binary_conv2d_packed_fake(
        x_bits, w_packed, in_channels, kernel_size, stride, padding, dilation, scale, bias, residual,
        out_dtype=out_dtype, pad_value=pad_value, op=op))


# ----------------------------------------------------------------------------------------------
# Binary training ops: float latent weight in, packed inside, STE gradients out
# ----------------------------------------------------------------------------------------------
def _sign(t: Tensor) -> Tensor:
    return torch.where(t >= 0, 1.0, -1.0).to(t.dtype)


def _window(t: Tensor, clip: float) -> Tensor:
    return (t.abs() <= clip).to(t.dtype)


def _reduce_to(grad: Tensor, like: Tensor) -> Tensor:
    """Sum a broadcast gradient back to the shape of a scale/bias operand."""
    if like.numel() == 1:
        return grad.sum().reshape(like.shape).to(like.dtype)
    return grad.reshape(-1, grad.shape[-1]).sum(0).reshape(like.shape).to(like.dtype)


def _signs(t: Tensor, sign_zero: bool) -> Tensor:
    """torch.sign(t) (0 at 0) when t came through torch.sign, else s(t) (+1 at 0)."""
    return torch.sign(t) if sign_zero else _sign(t)


def _has_zero(weight: Tensor, weight_sign_zero: bool) -> bool:
    """A torch.sign weight with an exact zero: packed signs cannot hold its 0 (SPEC 2.1), so that
    call runs dense (one check a call: a training step changes the weight)."""
    return weight_sign_zero and bool((weight == 0).any())


def _scaled(y: Tensor, scale: Optional[Tensor], bias: Optional[Tensor], channel_dim: int) -> Tensor:
    """y * scale + bias, scale / bias per output channel (dimension channel_dim of y) or scalar."""
    shape = [1] * y.dim()
    shape[channel_dim] = -1
    if scale is not None:
        y = y * (scale.to(torch.float32).reshape(shape) if scale.numel() > 1 else scale.to(torch.float32).reshape(()))
    return y if bias is None else y + bias.to(torch.float32).reshape(shape)


@torch.library.impl(_lib, "binary_linear_ste", "CompositeExplicitAutograd")
def _binary_linear_ste_impl(x, weight, scale=None, bias=None, *, clip=1.0, row_scale=False, sign_zero=False,
                            weight_sign_zero=False):
    if _has_zero(weight, weight_sign_zero):
        xf = x.to(torch.float32)
        y = _signs(xf, sign_zero) @ torch.sign(weight).to(torch.float32).T
        if row_scale:
            y = y * xf.abs().mean(-1, keepdim=True)
        return _scaled(y, scale, bias, -1).to(x.dtype)
    packed = torch.ops.bitcompile.pack_signs(weight)
    return torch.ops.bitcompile.binary_linear(x, packed, weight.shape[1], scale, bias, sign_zero=sign_zero,
                                              row_scale=row_scale)


@torch.library.register_fake("bitcompile::binary_linear_ste")
def _binary_linear_ste_fake(x, weight, scale=None, bias=None, *, clip=1.0, row_scale=False, sign_zero=False,
                            weight_sign_zero=False):
    op = "binary_linear_ste"
    _check_float_input(op, x)
    _check(weight.dim() == 2, op, lambda: f"weight must be 2-D, got {weight.dim()}-D")
    _check(x.shape[-1] == weight.shape[1], op, lambda: f"x has {x.shape[-1]} features, weight has {weight.shape[1]}")
    _check_scale_bias(op, x, weight.shape[0], scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _binary_linear_ste_setup(ctx, inputs, keyword_only_inputs, output):
    x, weight, scale, bias = (list(inputs) + [None, None])[:4]
    ctx.clip = keyword_only_inputs.get("clip", 1.0)
    ctx.row_scale = keyword_only_inputs.get("row_scale", False)
    ctx.sign_zero = keyword_only_inputs.get("sign_zero", False)
    ctx.weight_sign_zero = keyword_only_inputs.get("weight_sign_zero", False)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, scale)


def _binary_linear_ste_backward(ctx, grad):
    x, weight, scale = ctx.saved_tensors
    compute = torch.float32
    g = grad.to(compute)
    sx, sw = _signs(x, ctx.sign_zero).to(compute), _signs(weight, ctx.weight_sign_zero).to(compute)
    dot = sx @ sw.T  # integer valued
    factor = torch.ones((), dtype=compute, device=x.device)
    if scale is not None:
        factor = scale.to(compute).reshape(-1) if scale.numel() > 1 else scale.to(compute).reshape(())
    row = x.to(compute).abs().mean(-1, keepdim=True) if ctx.row_scale else None
    g_dot = g * factor if row is None else g * factor * row  # dL/d dot
    # torch.sign's gradient is 0: a torch.sign operand gets 0 from the dot product
    grad_x = torch.zeros_like(x, dtype=compute) if ctx.sign_zero else (g_dot @ sw) * _window(x, ctx.clip).to(compute)
    if row is not None:  # d mean|x| / dx = sign(x) / K (0 at x = 0, as autograd's abs)
        g_row = (g * factor * dot).sum(-1, keepdim=True)
        grad_x = grad_x + g_row * torch.sign(x).to(compute) / x.shape[-1]
    if ctx.weight_sign_zero:
        grad_w = torch.zeros_like(weight, dtype=compute)
    else:
        grad_w = (g_dot.reshape(-1, g.shape[-1]).T @ sx.reshape(-1, x.shape[-1])) * _window(weight, ctx.clip).to(compute)
    grad_scale = None
    if scale is not None and ctx.needs_input_grad[2]:
        grad_scale = _reduce_to(g * dot * (1 if row is None else row), scale)
    grad_bias = _reduce_to(g, torch.empty(g.shape[-1])).to(grad.dtype) if ctx.has_bias else None
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), grad_scale, grad_bias


torch.library.register_autograd(
    "bitcompile::binary_linear_ste", _binary_linear_ste_backward, setup_context=_binary_linear_ste_setup
)


@torch.library.impl(_lib, "binary_weight_linear_ste", "CompositeExplicitAutograd")
def _binary_weight_linear_ste_impl(x, weight, scale=None, bias=None, *, clip=1.0, weight_sign_zero=False):
    if _has_zero(weight, weight_sign_zero):
        y = x.to(torch.float32) @ torch.sign(weight).to(torch.float32).T
        return _scaled(y, scale, bias, -1).to(x.dtype)
    packed = torch.ops.bitcompile.pack_signs(weight)
    return torch.ops.bitcompile.binary_weight_linear(x, packed, weight.shape[1], scale, bias)


@torch.library.register_fake("bitcompile::binary_weight_linear_ste")
def _binary_weight_linear_ste_fake(x, weight, scale=None, bias=None, *, clip=1.0, weight_sign_zero=False):
    return _binary_linear_ste_fake(x, weight, scale, bias)


def _binary_weight_linear_ste_setup(ctx, inputs, keyword_only_inputs, output):
    x, weight, scale, bias = (list(inputs) + [None, None])[:4]
    ctx.clip = keyword_only_inputs.get("clip", 1.0)
    ctx.weight_sign_zero = keyword_only_inputs.get("weight_sign_zero", False)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, scale)


def _binary_weight_linear_ste_backward(ctx, grad):
    x, weight, scale = ctx.saved_tensors
    compute = torch.float32
    g = grad.to(compute)
    sw = _signs(weight, ctx.weight_sign_zero).to(compute)
    factor = torch.ones((), dtype=compute, device=x.device)
    if scale is not None:
        factor = scale.to(compute).reshape(-1) if scale.numel() > 1 else scale.to(compute).reshape(())
    g_dot = g * factor
    grad_x = g_dot @ sw
    x2 = x.to(compute).reshape(-1, x.shape[-1])
    if ctx.weight_sign_zero:  # torch.sign's gradient
        grad_w = torch.zeros_like(weight, dtype=compute)
    else:
        grad_w = (g_dot.reshape(-1, g.shape[-1]).T @ x2) * _window(weight, ctx.clip).to(compute)
    grad_scale = None
    if scale is not None and ctx.needs_input_grad[2]:
        grad_scale = _reduce_to(g * (x.to(compute) @ sw.T), scale)
    grad_bias = _reduce_to(g, torch.empty(g.shape[-1])).to(grad.dtype) if ctx.has_bias else None
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), grad_scale, grad_bias


torch.library.register_autograd(
    "bitcompile::binary_weight_linear_ste",
    _binary_weight_linear_ste_backward,
    setup_context=_binary_weight_linear_ste_setup,
)


def _padded_signs(x: Tensor, padding: Sequence[int], pad_value: float, sign_zero: bool = False) -> Tensor:
    """s(x) (torch.sign(x) with sign_zero) with the conv's padding made explicit (value 0, +1 or -1)."""
    signs = _signs(x, sign_zero)
    if padding[0] == 0 and padding[1] == 0:
        return signs
    return torch.nn.functional.pad(signs, (padding[1], padding[1], padding[0], padding[0]), value=pad_value)


@torch.library.impl(_lib, "binary_conv2d_ste", "CompositeExplicitAutograd")
def _binary_conv2d_ste_impl(x, weight, stride, padding, dilation, scale=None, bias=None, *, pad_value=0.0, clip=1.0,
                            sign_zero=False, weight_sign_zero=False):
    if _has_zero(weight, weight_sign_zero):
        signs = _padded_signs(x.to(torch.float32), padding, pad_value, sign_zero)
        y = torch.nn.functional.conv2d(signs, torch.sign(weight).to(torch.float32), None, list(stride), 0,
                                       list(dilation))
        y = _scaled(y, scale, bias, 1).to(x.dtype)
        return y.contiguous(memory_format=torch._prims_common.suggest_memory_format(x))
    packed = torch.ops.bitcompile.pack_signs(weight.permute(0, 2, 3, 1))
    return torch.ops.bitcompile.binary_conv2d(
        x, packed, weight.shape[1], [weight.shape[2], weight.shape[3]], stride, padding, dilation, scale, bias,
        pad_value=pad_value, sign_zero=sign_zero,
    )


@torch.library.register_fake("bitcompile::binary_conv2d_ste")
def _binary_conv2d_ste_fake(x, weight, stride, padding, dilation, scale=None, bias=None, *, pad_value=0.0, clip=1.0,
                            sign_zero=False, weight_sign_zero=False):
    op = "binary_conv2d_ste"
    _check_float_input(op, x)
    _check(weight.dim() == 4, op, lambda: f"weight must be 4-D, got {weight.dim()}-D")
    kernel_size = [weight.shape[2], weight.shape[3]]
    _check_conv_geometry(op, x, weight.shape[1], kernel_size, stride, padding, dilation)
    _check_scale_bias(op, x, weight.shape[0], scale, bias)
    return _conv_output(op, x, weight.shape[0], kernel_size, stride, padding, dilation)


def _binary_conv2d_ste_setup(ctx, inputs, keyword_only_inputs, output):
    x, weight, stride, padding, dilation, scale, bias = (list(inputs) + [None, None])[:7]
    ctx.geometry = (list(stride), list(padding), list(dilation))
    ctx.pad_value = keyword_only_inputs.get("pad_value", 0.0)
    ctx.clip = keyword_only_inputs.get("clip", 1.0)
    ctx.sign_zero = keyword_only_inputs.get("sign_zero", False)
    ctx.weight_sign_zero = keyword_only_inputs.get("weight_sign_zero", False)
    ctx.has_bias = bias is not None
    ctx.save_for_backward(x, weight, scale)


def _binary_conv2d_ste_backward(ctx, grad):
    x, weight, scale = ctx.saved_tensors
    stride, padding, dilation = ctx.geometry
    compute = torch.float32
    g = grad.to(compute)
    sx = _padded_signs(x.to(compute), padding, ctx.pad_value, ctx.sign_zero)
    sw = _signs(weight, ctx.weight_sign_zero).to(compute)
    factor = None
    if scale is not None:
        factor = scale.to(compute).reshape(1, -1, 1, 1) if scale.numel() > 1 else scale.to(compute).reshape(())
    g_dot = g if factor is None else g * factor
    if ctx.sign_zero:  # torch.sign's gradient
        grad_x = torch.zeros_like(x, dtype=compute)
    else:
        grad_sx = torch.nn.grad.conv2d_input(sx.shape, sw, g_dot, stride=stride, padding=0, dilation=dilation)
        grad_sx = grad_sx[:, :, padding[0]: padding[0] + x.shape[2], padding[1]: padding[1] + x.shape[3]]
        grad_x = grad_sx * _window(x, ctx.clip).to(compute)
    if ctx.weight_sign_zero:
        grad_w = torch.zeros_like(weight, dtype=compute)
    else:
        grad_w = torch.nn.grad.conv2d_weight(sx, sw.shape, g_dot, stride=stride, padding=0, dilation=dilation)
        grad_w = grad_w * _window(weight, ctx.clip).to(compute)
    grad_scale = None
    if scale is not None and ctx.needs_input_grad[5]:
        dot = torch.nn.functional.conv2d(sx, sw, stride=stride, dilation=dilation)
        per_channel = (g * dot).sum((0, 2, 3))
        grad_scale = (per_channel.sum() if scale.numel() == 1 else per_channel).reshape(scale.shape).to(scale.dtype)
    grad_bias = g.sum((0, 2, 3)).to(grad.dtype) if ctx.has_bias else None
    return grad_x.to(x.dtype), grad_w.to(weight.dtype), None, None, None, grad_scale, grad_bias


torch.library.register_autograd(
    "bitcompile::binary_conv2d_ste", _binary_conv2d_ste_backward, setup_context=_binary_conv2d_ste_setup
)


# ----------------------------------------------------------------------------------------------
# APoT inference ops
# ----------------------------------------------------------------------------------------------
def _check_code_table(op: str, bits: int, table: Tensor, name: str, x: Tensor) -> None:
    _check(1 <= bits <= 8, op, lambda: f"bits must be in 1..8, got {bits}")
    _check(table.dim() == 1 and table.shape[0] == 2 ** bits, op,
           lambda: f"{name} must have 2**bits = {2 ** bits} entries, got shape {tuple(table.shape)}")
    _check_same_device(op, x, **{name: table})


def _check_alpha(op: str, x: Tensor, alpha: Tensor, out_features) -> None:
    _check(alpha.is_floating_point(), op, lambda: f"alpha must be floating point, got {alpha.dtype}")
    _check(alpha.numel() == 1 or (alpha.dim() == 1 and alpha.shape[0] == out_features), op,
           lambda: f"alpha must be a scalar or have {out_features} elements, got shape {tuple(alpha.shape)}")
    _check_same_device(op, x, alpha=alpha)


@torch.library.register_fake("bitcompile::apot_linear")
def _apot_linear_fake(x, w_packed, in_features, bits, code_values, alpha, bias=None):
    op = "apot_linear"
    _check_float_input(op, x)
    _check_code_table(op, bits, code_values, "code_values", x)
    _check(code_values.dtype == torch.float32, op, lambda: f"code_values must be float32, got {code_values.dtype}")
    _check_packed_linear(op, x, w_packed, in_features, packed_code_bytes(in_features, bits), torch.uint8)
    _check_alpha(op, x, alpha, w_packed.shape[0])
    _check_scale_bias(op, x, w_packed.shape[0], None, bias)
    return x.new_empty((*x.shape[:-1], w_packed.shape[0]))


@torch.library.register_fake("bitcompile::apot_linear_int")
def _apot_linear_int_fake(q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators, denominator,
                          alpha, bias=None):
    op = "apot_linear_int"
    _check(q_x.dtype == torch.uint8, op, lambda: f"q_x must be uint8, got {q_x.dtype}")
    _check(x_scale.numel() == 1 and x_zero_point.numel() == 1, op, "x_scale and x_zero_point must be scalars (per-tensor)")
    _check_code_table(op, bits, code_numerators, "code_numerators", q_x)
    _check(code_numerators.dtype == torch.int32, op, lambda: f"code_numerators must be int32, got {code_numerators.dtype}")
    _check(denominator > 0, op, lambda: f"denominator must be positive, got {denominator}")
    _check_packed_linear(op, q_x, w_packed, in_features, packed_code_bytes(in_features, bits), torch.uint8)
    _check_alpha(op, q_x, alpha, w_packed.shape[0])
    _check_same_device(op, q_x, x_scale=x_scale, x_zero_point=x_zero_point)
    _check_scale_bias(op, q_x, w_packed.shape[0], None, bias)
    return q_x.new_empty((*q_x.shape[:-1], w_packed.shape[0]), dtype=torch.float32)


@torch.library.register_fake("bitcompile::apot_conv2d")
def _apot_conv2d_fake(x, w_packed, in_channels, kernel_size, stride, padding, dilation, bits, code_values, alpha,
                      bias=None):
    op = "apot_conv2d"
    _check_float_input(op, x)
    _check_conv_geometry(op, x, in_channels, kernel_size, stride, padding, dilation)
    _check_code_table(op, bits, code_values, "code_values", x)
    _check(code_values.dtype == torch.float32, op, lambda: f"code_values must be float32, got {code_values.dtype}")
    _check(w_packed.dtype == torch.uint8 and w_packed.dim() == 2, op,
           lambda: f"w_packed must be 2-D uint8, got {w_packed.dim()}-D {w_packed.dtype}")
    reduction = in_channels * kernel_size[0] * kernel_size[1]
    _check(w_packed.shape[1] == packed_code_bytes(reduction, bits), op,
           lambda: f"w_packed is {w_packed.shape[1]} wide, {reduction} codes of {bits} bits need {packed_code_bytes(reduction, bits)}")
    _check_same_device(op, x, w_packed=w_packed)
    _check_alpha(op, x, alpha, w_packed.shape[0])
    _check_scale_bias(op, x, w_packed.shape[0], None, bias)
    return _conv_output(op, x, w_packed.shape[0], kernel_size, stride, padding, dilation)


# ----------------------------------------------------------------------------------------------
# Inference ops under autograd: a result, never an internal error; no gradient
# ----------------------------------------------------------------------------------------------
# Without an Autograd kernel the dispatcher's fallback calls the CPU/CUDA kernel with autograd
# still on for the ATen calls inside it, and a GEMM path's at::mm_out / at::addmm_out on an input
# that requires grad fails ("mm(): functions with out=... arguments don't support automatic
# differentiation"; issue 12: apot_linear above 16 rows on CPU, binary_weight_linear's cuBLAS
# path on CUDA). register_autograd gives each op an Autograd kernel that runs the device kernel
# below autograd (torch.library's `_AutoDispatchBelowAutograd`), on CPU and CUDA alike, so every
# path returns what it returns without grad. The ops have no gradient: a backward that reaches
# one gets `not_differentiable`, which raises with the op's name and what to use instead. It is
# an op, not a Python raise, so that AOTAutograd can trace a training graph around a
# quantize_'d layer (the forward runs; only a backward that really needs the gradient fails).
#
# The dispatcher runs that kernel on every call, under no_grad too, and in Python it cost more
# than a small kernel (5-10 us on the CPU; eager GPU calls were host-bound). So each KERNEL_OPS
# library registers the same kernel in C++ for its backend key (AutogradCPU / AutogradCUDA,
# csrc/inference_autograd.h), which the dispatcher prefers to this one at the Autograd alias key:
# this one serves until a device's library loads (fake-tensor tracing, opcheck, the lazy
# loader's first call) and on other backends (Meta). The C++ copy of _TRAINING_FORMS must agree
# (tests/test_requires_grad.py). A lean Python kernel instead (grad checks first, then a plain
# redispatch) still pays for the Python call: 7.5 us a tiny CPU binary_weight_linear against
# 3.1 us with the C++ one, which is what the call costs below autograd.
_lib.define("not_differentiable(Tensor grad, SymInt[] size, ScalarType dtype, str op, str instead) -> Tensor")


@torch.library.impl(_lib, "not_differentiable", "CompositeExplicitAutograd")
def _not_differentiable_impl(grad, size, dtype, op, instead):
    raise RuntimeError(
        f"bitcompile::{op}: this inference op (packed weight) has no gradient, and a backward pass "
        f"needs one; train with {instead}, or run the model under torch.no_grad() / torch.inference_mode()"
    )


@torch.library.register_fake("bitcompile::not_differentiable")
def _not_differentiable_fake(grad, size, dtype, op, instead):
    return grad.new_empty(size, dtype=dtype)


def register_not_differentiable(name: str, instead: str) -> None:
    """Give inference op `name` an Autograd kernel: forward below autograd, backward raises."""

    def setup(ctx, inputs, output, keyword_only_inputs=None):
        ctx.metas = [(t.shape, t.dtype) if isinstance(t, Tensor) else None for t in inputs]

    def backward(ctx, *grads):  # an op with two outputs (the output and its sign words) gets two
        grad = next(g for g in grads if g is not None)
        return tuple(
            torch.ops.bitcompile.not_differentiable(grad, list(meta[0]), meta[1], name, instead)
            if meta is not None and needed else None
            for meta, needed in zip(ctx.metas, ctx.needs_input_grad)
        )

    torch.library.register_autograd(f"bitcompile::{name}", backward, setup_context=setup)


_TRAINING_FORMS = {
    "pack_signs": "a float weight (pack_signs gives integers)",
    "pack_codes": "a float weight (pack_codes gives integers)",
    "binary_linear": "binary_linear_ste (or ste_sign + F.linear)",
    "binary_weight_linear": "binary_weight_linear_ste (or F.linear(x, ste_sign(W)))",
    "binary_conv2d": "binary_conv2d_ste (or ste_sign + F.conv2d)",
    "binary_conv2d_packed": "binary_conv2d_ste (or ste_sign + F.conv2d)",
    "binary_conv2d_packed_with_signs": "binary_conv2d_ste (or ste_sign + F.conv2d)",
    "binary_weight_conv2d": "F.conv2d(x, ste_sign(W)) (the backend rewrites it in inference graphs)",
    "apot_linear": "bitcompile.nn.APoTLinear (fake quantization with an STE)",
    "apot_linear_int": "bitcompile.nn.APoTLinear (fake quantization with an STE)",
    "apot_conv2d": "bitcompile.nn.APoTConv2d (fake quantization with an STE)",
}
assert set(_TRAINING_FORMS) == set(KERNEL_OPS + CPU_KERNEL_OPS)
for _name, _instead in _TRAINING_FORMS.items():
    register_not_differentiable(_name, _instead)


# ----------------------------------------------------------------------------------------------
# Python wrappers (what users and the passes call)
# ----------------------------------------------------------------------------------------------
def ste_sign(x: Tensor, clip: float = 1.0) -> Tensor:
    """+1 where x >= 0, else -1; straight-through gradient inside |x| <= clip (SPEC 2.1)."""
    return torch.ops.bitcompile.ste_sign(x, clip)


def pack_signs(x: Tensor) -> Tensor:
    """Signs of x packed along the last dimension: int32 words, LSB first, bit 1 for x >= 0."""
    return torch.ops.bitcompile.pack_signs(x)


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """APoT codes packed along the last dimension: nibbles for bits <= 4, bytes above."""
    return torch.ops.bitcompile.pack_codes(codes, bits)


def unpack_signs(words: Tensor, count: int, dtype: torch.dtype) -> Tensor:
    """The +1 / -1 values (of dtype) of pack_signs words along the last dimension, cut back to `count`.

    Plain tensor ops (traceable by Dynamo and inductor): bit j of word w is value 32 * w + j."""
    shifts = torch.arange(32, dtype=torch.int32, device=words.device)
    bits = torch.bitwise_and(torch.bitwise_right_shift(words.unsqueeze(-1), shifts), 1)
    return bits.flatten(-2)[..., :count].to(dtype) * 2 - 1


def binary_linear(x, w_packed, in_features, scale=None, bias=None, *, sign_zero=False, row_scale=False):
    """(s(x) @ s(W).T) * scale [* mean|x| per row] + bias, exact integer dot products (SPEC 2.2)."""
    return torch.ops.bitcompile.binary_linear(x, w_packed, in_features, scale, bias, sign_zero=sign_zero, row_scale=row_scale)


def binary_weight_linear(x, w_packed, in_features, scale=None, bias=None):
    """x @ (s(W) * scale).T + bias with fp32 accumulation (SPEC 2.3)."""
    return torch.ops.bitcompile.binary_weight_linear(x, w_packed, in_features, scale, bias)


def binary_conv2d(x, w_packed, in_channels, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                  scale=None, bias=None, *, pad_value=0.0, sign_zero=False):
    """conv2d(s(x), s(W)) * scale[OC] + bias with exact integer sums (SPEC 2.4)."""
    return torch.ops.bitcompile.binary_conv2d(
        x, w_packed, in_channels, list(kernel_size), list(stride), list(padding), list(dilation), scale, bias,
        pad_value=pad_value, sign_zero=sign_zero,
    )


def binary_weight_conv2d(x, w_packed, in_channels, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                         scale=None, bias=None):
    """conv2d(x, s(W)) * scale[OC] + bias with fp32 sums, x not binarized (a binary-weight conv)."""
    return torch.ops.bitcompile.binary_weight_conv2d(
        x, w_packed, in_channels, list(kernel_size), list(stride), list(padding), list(dilation), scale, bias)


def binary_conv2d_packed(x_bits, w_packed, in_channels, kernel_size, stride=(1, 1), padding=(0, 0), dilation=(1, 1),
                         scale=None, bias=None, residual=None, *, out_dtype, pad_value=0.0):
    """binary_conv2d on x_bits = pack_signs(x.permute(0, 2, 3, 1)): the same values, in out_dtype, channels_last
    (out_dtype int32: their sign words, [N, OH, OW, ceil(OC / 32)]); plus residual (the output's shape and dtype),
    as `y + residual` in out_dtype."""
    return torch.ops.bitcompile.binary_conv2d_packed(
        x_bits, w_packed, in_channels, list(kernel_size), list(stride), list(padding), list(dilation), scale, bias,
        residual, out_dtype=out_dtype, pad_value=pad_value,
    )


def binary_conv2d_packed_with_signs(x_bits, w_packed, in_channels, kernel_size, stride=(1, 1), padding=(0, 0),
                                    dilation=(1, 1), scale=None, bias=None, residual=None, *, out_dtype,
                                    pad_value=0.0):
    """binary_conv2d_packed (float out_dtype) and the output's sign words: (out, pack_signs(out.permute(0, 2, 3, 1)))
    from one epilogue."""
    return torch.ops.bitcompile.binary_conv2d_packed_with_signs(
        x_bits, w_packed, in_channels, list(kernel_size), list(stride), list(padding), list(dilation), scale, bias,
        residual, out_dtype=out_dtype, pad_value=pad_value,
    )


def binary_linear_ste(x, weight, scale=None, bias=None, *, clip=1.0, row_scale=False, sign_zero=False,
                      weight_sign_zero=False):
    """binary_linear on a float latent weight, with straight-through gradients for x and W
    (torch.sign's, 0, for an operand marked sign_zero / weight_sign_zero)."""
    return torch.ops.bitcompile.binary_linear_ste(x, weight, scale, bias, clip=clip, row_scale=row_scale,
                                                  sign_zero=sign_zero, weight_sign_zero=weight_sign_zero)


def binary_weight_linear_ste(x, weight, scale=None, bias=None, *, clip=1.0, weight_sign_zero=False):
    """binary_weight_linear on a float latent weight, with straight-through gradients for W
    (torch.sign's, 0, with weight_sign_zero)."""
    return torch.ops.bitcompile.binary_weight_linear_ste(x, weight, scale, bias, clip=clip,
                                                         weight_sign_zero=weight_sign_zero)


def binary_conv2d_ste(x, weight, stride=(1, 1), padding=(0, 0), dilation=(1, 1), scale=None, bias=None, *,
                      pad_value=0.0, clip=1.0, sign_zero=False, weight_sign_zero=False):
    """binary_conv2d on a float latent weight, with straight-through gradients for x and W
    (torch.sign's, 0, for an operand marked sign_zero / weight_sign_zero)."""
    return torch.ops.bitcompile.binary_conv2d_ste(
        x, weight, list(stride), list(padding), list(dilation), scale, bias, pad_value=pad_value, clip=clip,
        sign_zero=sign_zero, weight_sign_zero=weight_sign_zero,
    )


def apot_linear(x, w_packed, in_features, bits, code_values, alpha, bias=None):
    """x @ (alpha * code_values[code]).T + bias, fp32 accumulation (SPEC 2.5)."""
    return torch.ops.bitcompile.apot_linear(x, w_packed, in_features, bits, code_values, alpha, bias)


def apot_linear_int(q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators, denominator, alpha,
                    bias=None):
    """x_scale * alpha / denominator * sum_k (q_x - z_x) * N[code] + bias, exact integer sums (SPEC 2.5)."""
    return torch.ops.bitcompile.apot_linear_int(
        q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators, denominator, alpha, bias
    )


def apot_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation, bits, code_values, alpha, bias=None):
    """conv2d(x, alpha * code_values[code]) + bias (SPEC 2.5)."""
    return torch.ops.bitcompile.apot_conv2d(
        x, w_packed, in_channels, list(kernel_size), list(stride), list(padding), list(dilation), bits, code_values,
        alpha, bias,
    )


# ----------------------------------------------------------------------------------------------
# Layer ops of bitcompile.nn (BinaryLinear / BinaryConv2d activation binarizer)
# ----------------------------------------------------------------------------------------------
# (section: layer ops)
#
# ste_sign_scaled: the activation binarizer of bitcompile.nn.BinaryLinear / BinaryConv2d, with
# bitorch-engine's gradients. Forward: s(x) (+1 where x >= 0, else -1), which equals
# s(x / scale) for the positive layer scale; the layer multiplies its output by scale afterwards.
# Backward: the hardtanh STE of sign(x / scale) for x, and bitorch-engine's LSQ-style gradient
# for the scale instead of the chain rule:
#   grad_x     = grad / scale * (|x| <= scale)
#   grad_scale = sum(grad_x * sign(x)) / sqrt(numel(x))      (torch.sign: 0 at x = 0)
# With the layer's `* scale` after the matmul, grad_x is exactly bitorch-engine's
# `grad_output @ (sign(W) * scale_w)`, masked to |x| <= scale_a.
_lib.define("ste_sign_scaled(Tensor x, Tensor scale) -> Tensor")


@torch.library.impl(_lib, "ste_sign_scaled", "CompositeExplicitAutograd")
def _ste_sign_scaled_impl(x: Tensor, scale: Tensor) -> Tensor:
    return torch.where(x >= 0, 1.0, -1.0).to(x.dtype)


@torch.library.register_fake("bitcompile::ste_sign_scaled")
def _ste_sign_scaled_fake(x, scale):
    op = "ste_sign_scaled"
    _check(x.is_floating_point(), op, lambda: f"x must be floating point, got {x.dtype}")
    _check(scale.is_floating_point(), op, lambda: f"scale must be floating point, got {scale.dtype}")
    _check(scale.numel() == 1, op, lambda: f"scale must have one element, got shape {tuple(scale.shape)}")
    _check_same_device(op, x, scale=scale)
    return torch.empty_like(x)


def _ste_sign_scaled_setup(ctx, inputs, output):
    x, scale = inputs
    ctx.save_for_backward(x, scale)


def _ste_sign_scaled_backward(ctx, grad):
    x, scale = ctx.saved_tensors
    compute = torch.promote_types(torch.promote_types(grad.dtype, scale.dtype), torch.float32)
    g, xc = grad.to(compute), x.to(compute)
    s = scale.to(compute).reshape(())
    # torch.where rather than a product: no 0 * inf if a caller passes scale = 0.
    grad_x = torch.where(xc.abs() <= s, g / s, torch.zeros((), dtype=compute, device=x.device))
    grad_scale = None
    if ctx.needs_input_grad[1]:
        numel = max(x.numel(), 1)
        grad_scale = ((grad_x * torch.sign(xc)).sum() / math.sqrt(numel)).reshape(scale.shape).to(scale.dtype)
    return grad_x.to(x.dtype), grad_scale


torch.library.register_autograd(
    "bitcompile::ste_sign_scaled", _ste_sign_scaled_backward, setup_context=_ste_sign_scaled_setup
)


def ste_sign_scaled(x: Tensor, scale: Tensor) -> Tensor:
    """s(x) (+1 where x >= 0), with bitorch-engine's activation STE: grad_x = grad / scale inside
    |x| <= scale, grad_scale = sum(grad_x * sign(x)) / sqrt(numel)."""
    return torch.ops.bitcompile.ste_sign_scaled(x, scale)
