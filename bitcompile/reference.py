"""Plain PyTorch versions of every bitcompile op: the math the kernels must reproduce.

Written for clarity, not speed: float64 (or int64) throughout, no packing tricks beyond what
unpacking needs. Tests compare the kernels against these on random inputs.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor


def sign_ste(x: Tensor) -> Tensor:
    """s(x) = +1 if x >= 0 else -1 (SPEC 2.1)."""
    return torch.where(x >= 0, 1.0, -1.0).to(torch.float64)


def pack_signs(x: Tensor) -> Tensor:
    """Storage format of SPEC 2.1: bit j of word w is the sign of value 32*w + j, 1 for x >= 0."""
    k = x.shape[-1]
    words = (k + 31) // 32
    bits = (x >= 0).to(torch.int64)
    bits = F.pad(bits, (0, words * 32 - k))  # tail bits are 0
    bits = bits.reshape(*x.shape[:-1], words, 32)
    weights = torch.ones(32, dtype=torch.int64, device=x.device).bitwise_left_shift(torch.arange(32, device=x.device))
    packed = (bits * weights).sum(-1)
    return torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)


def unpack_signs(packed: Tensor, k: int) -> Tensor:
    """Inverse of pack_signs: float64 +-1 values, the last dimension cut back to k."""
    shifts = torch.arange(32, device=packed.device, dtype=torch.int64)
    bits = (packed.to(torch.int64).unsqueeze(-1) >> shifts) & 1
    bits = bits.reshape(*packed.shape[:-1], -1)[..., :k]
    return bits.to(torch.float64) * 2 - 1


def _apply_scale_bias(dot: Tensor, scale: Optional[Tensor], bias: Optional[Tensor]) -> Tensor:
    out = dot
    if scale is not None:
        out = out * (scale.to(torch.float64).reshape(()) if scale.numel() == 1 else scale.to(torch.float64))
    if bias is not None:
        out = out + bias.to(torch.float64)
    return out


def binary_linear(x, w_packed, in_features, scale=None, bias=None, *, sign_zero=False, row_scale=False):
    """y = (s(x) @ s(W).T) * scale [* mean|x|] + bias; with sign_zero, s = torch.sign (0 at 0)."""
    x64 = x.to(torch.float64)
    sx = torch.sign(x64) if sign_zero else sign_ste(x64)
    sw = unpack_signs(w_packed, in_features)
    dot = sx @ sw.T
    if row_scale:
        dot = dot * x64.abs().mean(-1, keepdim=True)
    return _apply_scale_bias(dot, scale, bias)


def binary_weight_linear(x, w_packed, in_features, scale=None, bias=None):
    """y = x @ (s(W) * scale).T + bias."""
    sw = unpack_signs(w_packed, in_features)
    return _apply_scale_bias(x.to(torch.float64) @ sw.T, scale, bias)


def binary_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale=None, bias=None, *,
                  pad_value=0.0, sign_zero=False):
    """y = conv2d(pad(s(x), pad_value), s(W)) * scale[OC] + bias, w_packed = pack_signs(W.permute(0, 2, 3, 1))."""
    x64 = x.to(torch.float64)
    sx = torch.sign(x64) if sign_zero else sign_ste(x64)
    sx = F.pad(sx, (padding[1], padding[1], padding[0], padding[0]), value=pad_value)
    sw = unpack_signs(w_packed, in_channels).permute(0, 3, 1, 2)
    dot = F.conv2d(sx, sw, stride=list(stride), dilation=list(dilation))
    out = dot
    if scale is not None:
        out = out * (scale.to(torch.float64).reshape(()) if scale.numel() == 1 else scale.to(torch.float64).reshape(1, -1, 1, 1))
    if bias is not None:
        out = out + bias.to(torch.float64).reshape(1, -1, 1, 1)
    return out


def binary_weight_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation, scale=None, bias=None):
    """y = conv2d(x, s(W)) * scale[OC] + bias (x not binarized, zero padding), w_packed as binary_conv2d's."""
    sw = unpack_signs(w_packed, in_channels).permute(0, 3, 1, 2)
    out = F.conv2d(x.to(torch.float64), sw, stride=list(stride), padding=list(padding), dilation=list(dilation))
    if scale is not None:
        out = out * (scale.to(torch.float64).reshape(()) if scale.numel() == 1 else scale.to(torch.float64).reshape(1, -1, 1, 1))
    if bias is not None:
        out = out + bias.to(torch.float64).reshape(1, -1, 1, 1)
    return out


def pack_codes(codes: Tensor, bits: int) -> Tensor:
    """APoT storage: nibbles (element 2j low, 2j+1 high) for bits <= 4, else one byte a code."""
    codes = codes.to(torch.int64)
    if bits > 4:
        return codes.to(torch.uint8)
    k = codes.shape[-1]
    codes = F.pad(codes, (0, k % 2))
    pairs = codes.reshape(*codes.shape[:-1], -1, 2)
    return (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)


def unpack_codes(packed: Tensor, k: int, bits: int) -> Tensor:
    """Inverse of pack_codes: int64 codes, the last dimension cut back to k."""
    packed = packed.to(torch.int64)
    if bits > 4:
        return packed[..., :k]
    both = torch.stack((packed & 15, packed >> 4), dim=-1)
    return both.reshape(*packed.shape[:-1], -1)[..., :k]


def _alpha_column(alpha: Tensor) -> Tensor:
    alpha = alpha.to(torch.float64)
    return alpha.reshape(()) if alpha.numel() == 1 else alpha.reshape(-1, 1)


def apot_weight(w_packed, in_features, bits, code_values, alpha) -> Tensor:
    """The dequantized weight alpha * code_values[code], float64 [N, K]."""
    codes = unpack_codes(w_packed, in_features, bits)
    return code_values.to(torch.float64)[codes] * _alpha_column(alpha)


def apot_linear(x, w_packed, in_features, bits, code_values, alpha, bias=None):
    """y = x @ (alpha * code_values[code]).T + bias."""
    w = apot_weight(w_packed, in_features, bits, code_values, alpha)
    return _apply_scale_bias(x.to(torch.float64) @ w.T, None, bias)


def apot_linear_int_sums(q_x, x_zero_point, w_packed, in_features, bits, code_numerators) -> Tensor:
    """The exact integer part: sum_k (q_x - z_x) * N[code], int64."""
    codes = unpack_codes(w_packed, in_features, bits)
    numerators = code_numerators.to(torch.int64)[codes]
    centred = q_x.to(torch.int64) - x_zero_point.to(torch.int64).reshape(())
    return (centred.unsqueeze(-2) * numerators).sum(-1)


def apot_linear_int(q_x, x_scale, x_zero_point, w_packed, in_features, bits, code_numerators, denominator, alpha,
                    bias=None):
    """y = x_scale * alpha / denominator * sum_k (q_x - z_x) * N[code] + bias."""
    sums = apot_linear_int_sums(q_x, x_zero_point, w_packed, in_features, bits, code_numerators).to(torch.float64)
    alpha = alpha.to(torch.float64)
    alpha = alpha.reshape(()) if alpha.numel() == 1 else alpha
    return _apply_scale_bias(sums * x_scale.to(torch.float64).reshape(()) * alpha / denominator, None, bias)


def apot_conv2d(x, w_packed, in_channels, kernel_size, stride, padding, dilation, bits, code_values, alpha,
                bias=None):
    """y = conv2d(x, alpha * code_values[code]) + bias; codes packed from W.permute(0, 2, 3, 1)."""
    reduction = in_channels * kernel_size[0] * kernel_size[1]
    w = apot_weight(w_packed, reduction, bits, code_values, alpha)
    w = w.reshape(-1, kernel_size[0], kernel_size[1], in_channels).permute(0, 3, 1, 2)
    b = None if bias is None else bias.to(torch.float64)
    return F.conv2d(x.to(torch.float64), w, b, stride=list(stride), padding=list(padding), dilation=list(dilation))
