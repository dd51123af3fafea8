"""APoTLinear and APoTConv2d: layers whose float latent weight is fake-quantized to a signed APoT
scheme (apot3, apot4, apot5; SPEC.md 2.5) with a straight-through estimator.

Forward: `W_q = dequantize(quantize(W, alpha), alpha)`, i.e. alpha * code_values[code] in fp32 (the
exact values the packed kernels use), then plain `F.linear(x, W_q, bias)` /
`conv2d(x, W_q, bias, ...)`: the backend's passes rewrite that to apot_linear / apot_conv2d on
`quantized_weight()`.

alpha: one per output channel (dim 0) by default, per tensor with per_channel=False.
- learn_alpha=False: alpha = max|W| (of the row, or of the tensor), detached: no gradient flows
  through alpha, and since |W| <= alpha everywhere the weight gradient is the plain STE.
- learn_alpha=True: alpha is an nn.Parameter initialized from max|W| (at construction and by
  reset_parameters()). Weights with |W| > alpha are clipped to +-alpha.

Gradients (g = dL/dW_q):
    dL/dW     = g * (|W| <= alpha)
    dL/dalpha = sum over the channel (or tensor) of g * (code_values[code] if |W| <= alpha else sign(W))
The alpha gradient is the APoT paper's reparameterized clipping function with the rounding passed
straight through: inside the clipping range d W_q / d alpha = W_q / alpha (the quantized level
relative to alpha), outside it is sign(W). (The two pieces agree at |W| > alpha, where the code is
the top level +-1.) A negative learned alpha is treated as 0 in the forward (all weights 0).
"""

from __future__ import annotations

from typing import Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bitcompile import apot

__all__ = ["APoTLinear", "APoTConv2d", "apot_fake_quantize"]


def _fake_quantize(weight: Tensor, alpha: Tensor, code_values: Tensor, bits: int) -> Tensor:
    """W -> alpha * code_values[quantize(W, alpha)], with the STE gradients of the module docstring.

    Written as value + (p - p.detach()) * slope terms, which add exactly 0 to the value and give each
    parameter its straight-through slope, rather than as a torch.autograd.Function: under torch.compile,
    torch 2.11's dynamo traced that Function's backward with a zero gradient (every weight and alpha gradient
    0 in a compiled training step; torch 2.13 was right). Plain tensor ops trace the same in every version.
    """
    alpha_used = alpha.detach().to(torch.float32).clamp_min(0)
    codes = apot._quantize_signed(weight.detach(), alpha_used, bits, code_values)
    relative = code_values[codes]  # value relative to alpha, float32
    alpha_column = apot._channel_view("fake_quantize", weight, alpha_used)
    quantized = (alpha_column * relative).to(weight.dtype)
    if not torch.is_grad_enabled() or not (weight.requires_grad or alpha.requires_grad):
        return quantized
    inside = weight.detach().to(torch.float32).abs() <= alpha_column
    if weight.requires_grad:  # dL/dW = g * (|W| <= alpha)
        quantized = quantized + (weight - weight.detach()) * inside.to(weight.dtype)
    if alpha.requires_grad:  # dL/dalpha = sum of g * (code value inside, sign(W) outside), in fp32
        slope = torch.where(inside, relative, torch.sign(weight.detach()).to(torch.float32))
        learned = apot._channel_view("fake_quantize", weight, alpha.to(torch.float32))
        quantized = quantized + ((learned - learned.detach()) * slope).to(weight.dtype)
    return quantized


def apot_fake_quantize(weight: Tensor, alpha: Tensor, scheme: Union[str, apot.Scheme]) -> Tensor:
    """alpha * code_values[quantize(weight, alpha)] of a signed scheme, with the straight-through
    gradients of this module's docstring (alpha 0-d or one per output channel)."""
    resolved = apot.get_scheme(scheme)
    if not resolved.signed:
        raise ValueError(f"bitcompile.nn.apot_fake_quantize: weights need a signed scheme (apot3/4/5), got {resolved.name}")
    return _fake_quantize(weight, alpha, resolved.code_values.to(weight.device), resolved.bits)


class _APoTWeight:
    """What APoTLinear and APoTConv2d share: the scheme, alpha, the fake-quantized weight."""

    weight: Tensor

    def _init_apot(self, scheme, per_channel: bool, learn_alpha: bool) -> None:
        resolved = self._resolve(scheme)
        self.scheme: str = resolved.name
        self.per_channel = bool(per_channel)
        self.learn_alpha = bool(learn_alpha)
        self.bits = resolved.bits
        # the table the forward reads: not in the state dict (it is fixed by `scheme`)
        self.register_buffer("code_values", resolved.code_values.to(self.weight.device), persistent=False)
        if self.learn_alpha:
            self.alpha = nn.Parameter(self._max_abs_alpha())
        else:
            self.register_parameter("alpha", None)

    @staticmethod
    def _resolve(scheme) -> apot.Scheme:
        resolved = apot.get_scheme(scheme)
        if not resolved.signed:
            raise ValueError(f"bitcompile.nn: APoT layers need a signed scheme (apot3, apot4, apot5), got {resolved.name}")
        return resolved

    def _max_abs_alpha(self) -> Tensor:
        return apot._max_abs(self.weight, self.per_channel).to(self.weight.device)

    def _reset_alpha(self) -> None:
        if getattr(self, "alpha", None) is not None:
            with torch.no_grad():
                self.alpha.copy_(self._max_abs_alpha())

    def current_alpha(self) -> Tensor:
        """alpha of the current weight (float32; the learned one, or max|W| detached)."""
        if self.alpha is not None:
            return self.alpha
        return self._max_abs_alpha()

    def fake_quantized_weight(self) -> Tensor:
        """The weight the forward uses: alpha * code_values[quantize(W)], with STE gradients."""
        return _fake_quantize(self.weight, self.current_alpha(), self.code_values, self.bits)

    def quantized_weight(self) -> tuple[Tensor, Tensor]:
        """(codes, alpha) of the current weight: int64 codes shaped like the weight (signed layout
        of bitcompile.apot), alpha float32 [out_channels] or 0-d, detached. Dequantized they give
        exactly the forward's weight: alpha * code_values[codes]."""
        with torch.no_grad():
            alpha = self.current_alpha().detach().to(torch.float32).clamp_min(0)
            codes = apot._quantize_signed(self.weight.detach(), alpha, self.bits, self.code_values)
        return codes, alpha

    def _apot_repr(self) -> str:
        return f"scheme={self.scheme}, per_channel={self.per_channel}, learn_alpha={self.learn_alpha}"


class APoTLinear(_APoTWeight, nn.Linear):
    """nn.Linear with its weight fake-quantized to a signed APoT scheme (see the module docstring).

    Attributes the backend reads: `scheme` (name), `per_channel`, `learn_alpha`, `bits`,
    `code_values`, `quantized_weight()` -> (codes, alpha).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, scheme: Union[str, apot.Scheme] = "apot4",
                 per_channel: bool = True, learn_alpha: bool = False, device=None, dtype=None) -> None:
        self._resolve(scheme)  # fail before allocating
        super().__init__(in_features, out_features, bias, device=device, dtype=dtype)
        self._init_apot(scheme, per_channel, learn_alpha)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._reset_alpha()

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.fake_quantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._apot_repr()}"


class APoTConv2d(_APoTWeight, nn.Conv2d):
    """nn.Conv2d with its weight fake-quantized to a signed APoT scheme (see the module docstring).

    Same arguments as nn.Conv2d plus scheme, per_channel, learn_alpha; alpha is per output channel.
    The packed apot_conv2d kernel covers groups=1; other groups still run here in eager.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size, stride=1, padding=0, dilation=1,
                 groups: int = 1, bias: bool = True, padding_mode: str = "zeros",
                 scheme: Union[str, apot.Scheme] = "apot4", per_channel: bool = True, learn_alpha: bool = False,
                 device=None, dtype=None) -> None:
        self._resolve(scheme)
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         padding_mode, device=device, dtype=dtype)
        self._init_apot(scheme, per_channel, learn_alpha)

    def reset_parameters(self) -> None:
        super().reset_parameters()
        self._reset_alpha()

    def forward(self, x: Tensor) -> Tensor:
        return self._conv_forward(x, self.fake_quantized_weight(), self.bias)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, {self._apot_repr()}"
