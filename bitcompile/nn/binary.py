"""BinaryLinear and BinaryConv2d: bitorch-engine's binary layers on stock PyTorch (SPEC.md 3).

What is reproduced (read from GreenBitAI/bitorch-engine: layers/qlinear/binary/{cuda,cutlass}/layer.py,
layers/qconv/binary/{cutlass,cpp}/..., utils/model_helper.py `init_weight`):

- Parameters: `weight` [out, in] (conv: [out, in, kh, kw]), `bias_a` = zeros(in_features) (conv:
  zeros(in_channels)), the learnable per-input shift, and `scale_a` = 0, a learnable scalar.
- `scale_a` is set on the first forward, from the input before the shift, while it is still 0
  (bitorch: `if not scale_a.is_nonzero()`): 2 * mean|x| (`symmetric=True`) or 4 * mean|x|.
- Forward (bitorch: `binary_linear_cuda.forward(x + bias_a, W) * scale_a * scale_w`):
      x~  = x + bias_a
      y   = (s(x~) @ s(W).T) * scale_a * scale_w          s(v) = +1 if v >= 0 else -1
  conv: y = conv2d(pad(s(x~), -1), s(W), stride, dilation) * scale_a * scale_w. Padded positions
  are -1: bitorch's CPU kernel fills them with bit 0 (= -1) in im2binary_col, as does its CUTLASS
  kernel. `pad_value=0.0` gives PyTorch's zero padding instead.
- `scale_w = mean|W|`, one scalar per tensor (bitorch: `w.norm(p=1) / w.nelement()`), with no
  gradient (bitorch: a buffer / requires_grad=False).
- Gradients (bitorch: BinaryLinearForward.backward / BinaryConv2dForward.backward), g = dL/dy:
      grad_x~      = (g @ s(W)) * scale_w * (|x~| <= scale_a)      (no scale_a factor)
      grad_scale_a = sum(grad_x~ * sign(x~)) / sqrt(numel(x~))     (no term from `y * scale_a`)
      grad_bias_a  = grad_x~ summed over the batch (and spatial) dimensions
  They come from the custom op `bitcompile::ste_sign_scaled` (ops.py, "layer ops"), whose backward
  is the STE of sign(x~ / scale_a) and bitorch's scale gradient, with `scale_a` detached in the
  output product.

Where this differs from bitorch-engine, on purpose:
- Float latent weights, trained by any torch optimizer. bitorch keeps int8 weights (W - mean(W),
  quantized) and updates them with a sign-flip optimizer from int8-quantized gradients. Here the
  weight binarizer is `bitcompile.ste_sign(W, weight_clip)`, so
      grad_W = scale_a * scale_w * (g.T @ s(x~)) * (|W| <= weight_clip)
  where bitorch has scale_a * (g.T @ sign(x~)) (no scale_w factor, no window; a sign-based update
  does not see the positive factor). We binarize W itself, not W - mean(W).
- `scale_w` is recomputed from the current latent weight at every forward (bitorch computes it
  once in `prepare_params`), so it follows training and `load_state_dict`.
- An optional output `bias` (bitorch has none; default False). No K % 8 constraint, any shape.
- Conv: bitorch's grad_W uses zero padding while its forward pads with -1; here autograd follows
  the forward (the padded -1 positions take part in grad_W). `groups` is 1, as in bitorch.

First-forward initialization and torch.compile: a Python branch on a tensor value graph-breaks,
so the value test is a `torch.where` (keep scale_a where it is nonzero, else the fresh 2*mean|x|)
applied in place under no_grad, and the Python flag `_scale_a_ready` skips that code after the
first call. In eager the first call does the update; under torch.compile the first traced graph
contains the (functionalized) in-place update, the flag flips, and Dynamo recompiles once without
it. `load_state_dict` clears the flag, so a loaded nonzero scale_a is kept and a loaded zero one is
initialized on the next forward. `reset_scale_a()` asks for a fresh initialization.

What the backend's passes see in a Dynamo graph (torch level), for BinaryLinear:
    xs = bitcompile.ste_sign_scaled(x + bias_a, scale_a)
    ws = bitcompile.ste_sign(weight, weight_clip)
    y  = linear(xs, ws) * (scale_a.detach() * weight.detach().abs().mean())   [+ bias]
and for BinaryConv2d `conv2d(F.pad(xs, value=-1), ws, None, stride, 0, dilation)` (or
`conv2d(xs, ws, None, stride, padding, dilation)` when pad_value == 0 or padding == 0).
`quantized_parts()` gives the packed form: y = binary_linear(x + bias_a, packed, K, scale, bias)
(conv: binary_conv2d(..., pad_value=pad_value)).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.modules.utils import _pair

import bitcompile.ops  # noqa: F401  (registers the bitcompile ops)

__all__ = ["BinaryLinear", "BinaryConv2d"]

_IntOrPair = Union[int, tuple[int, int]]


class _ActivationScale(nn.Module):
    """Shared state of the two layers: bias_a, scale_a and its first-forward initialization, and
    the weight initialization."""

    def _setup_activation(self, channels: int, symmetric: bool, factory: dict) -> None:
        self.symmetric = symmetric
        self.bias_a = nn.Parameter(torch.zeros(channels, **factory))
        self.scale_a = nn.Parameter(torch.zeros((), **factory))
        # Python-side flag: once True, forward skips the initialization code entirely (no per-step
        # reduction over x, no in-place update in compiled graphs). Not part of the state dict:
        # scale_a != 0 is the persistent "initialized" state, as in bitorch-engine.
        self._scale_a_ready = False
        self.register_load_state_dict_post_hook(_clear_ready_flag)

    def reset_scale_a(self) -> None:
        """Zero scale_a so that the next forward sets it again from its input."""
        with torch.no_grad():
            self.scale_a.zero_()
        self._scale_a_ready = False

    def _init_scale_a(self, x: Tensor) -> None:
        if self._scale_a_ready or x.numel() == 0:
            return
        factor = 2.0 if self.symmetric else 4.0
        with torch.no_grad():
            fresh = (factor * x.detach().abs().to(torch.float32).mean()).to(self.scale_a.dtype)
            # torch.where, not `if scale_a == 0`: no data-dependent Python branch for Dynamo.
            self.scale_a.copy_(torch.where(self.scale_a != 0, self.scale_a, fresh))
        self._scale_a_ready = True

    def reset_parameters(self) -> None:
        # nn.Linear's and nn.Conv2d's weight initialization (bitorch-engine uses nn.Linear's for its
        # linear layer and leaves the conv weight uninitialized).
        nn.init.kaiming_uniform_(self.weight, a=5 ** 0.5)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _output_scale(self, weight: Tensor) -> Tensor:
        # scale_a * scale_w with scale_w = mean|W| per tensor; neither gets a gradient through this
        # product (scale_a's gradient comes from ste_sign_scaled, scale_w has none, as in bitorch).
        return self.scale_a.detach() * weight.detach().abs().mean()


def _clear_ready_flag(module, incompatible_keys) -> None:
    module._scale_a_ready = False


class BinaryLinear(_ActivationScale):
    """y = (s(x + bias_a) @ s(W).T) * scale_a * mean|W| [+ bias], bitorch-engine's BinaryLinear.

    Args:
        in_features, out_features: as nn.Linear.
        bias: add a learnable output bias (bitorch-engine has none).
        symmetric: scale_a starts at 2 * mean|x| (True) or 4 * mean|x| (False).
        weight_clip: straight-through window of the weight binarizer, |W| <= weight_clip.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = False, symmetric: bool = True,
                 weight_clip: float = 1.0, device=None, dtype=None) -> None:
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight_clip = float(weight_clip)
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.bias = nn.Parameter(torch.zeros(out_features, **factory)) if bias else None
        self._setup_activation(in_features, symmetric, factory)
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        self._init_scale_a(x)
        x_signs = torch.ops.bitcompile.ste_sign_scaled(x + self.bias_a, self.scale_a)
        w_signs = torch.ops.bitcompile.ste_sign(self.weight, self.weight_clip)
        out = F.linear(x_signs, w_signs) * self._output_scale(self.weight)
        if self.bias is not None:
            out = out + self.bias
        return out

    @torch.no_grad()
    def quantized_parts(self) -> dict:
        """The packed inference form: y = binary_linear(x + bias_a, packed, in_features, scale, bias).

        packed: int32 [out, ceil(in/32)] (pack_signs of W); scale: fp32 scalar scale_a * mean|W|;
        bias_a: the input shift; bias: the output bias or None. Tensors are detached copies.
        """
        return {
            "kind": "linear",
            "packed": torch.ops.bitcompile.pack_signs(self.weight.detach()),
            "scale": self._output_scale(self.weight).to(torch.float32).clone(),
            "bias_a": self.bias_a.detach().clone(),
            "bias": None if self.bias is None else self.bias.detach().clone(),
            "in_features": self.in_features,
            "out_features": self.out_features,
        }

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"symmetric={self.symmetric}, weight_clip={self.weight_clip}")


class BinaryConv2d(_ActivationScale):
    """y = conv2d(pad(s(x + bias_a), pad_value), s(W)) * scale_a * mean|W| [+ bias], bitorch-engine's
    BinaryConv2d (groups = 1).

    Args:
        in_channels, out_channels, kernel_size, stride, padding, dilation: as nn.Conv2d (ints or
            pairs; no string padding).
        bias: add a learnable output bias (bitorch-engine has none).
        symmetric: scale_a starts at 2 * mean|x| (True) or 4 * mean|x| (False).
        weight_clip: straight-through window of the weight binarizer, |W| <= weight_clip.
        pad_value: value of the padded positions of s(x~): -1 as bitorch-engine (default), or 0
            (PyTorch zero padding), or +1.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: _IntOrPair, stride: _IntOrPair = 1,
                 padding: _IntOrPair = 0, dilation: _IntOrPair = 1, bias: bool = False, symmetric: bool = True,
                 weight_clip: float = 1.0, pad_value: float = -1.0, device=None, dtype=None) -> None:
        super().__init__()
        if pad_value not in (-1.0, 0.0, 1.0):
            raise ValueError(f"BinaryConv2d: pad_value must be -1, 0 or 1, got {pad_value}")
        if isinstance(padding, str):
            raise ValueError("BinaryConv2d: padding must be an int or a pair of ints, not a string")
        factory = {"device": device, "dtype": dtype}
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.kernel_size = _pair(kernel_size)
        self.stride = _pair(stride)
        self.padding = _pair(padding)
        self.dilation = _pair(dilation)
        self.pad_value = float(pad_value)
        self.weight_clip = float(weight_clip)
        self.weight = nn.Parameter(torch.empty(out_channels, in_channels, *self.kernel_size, **factory))
        self.bias = nn.Parameter(torch.zeros(out_channels, **factory)) if bias else None
        self._setup_activation(in_channels, symmetric, factory)
        self.reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        self._init_scale_a(x)
        x_signs = torch.ops.bitcompile.ste_sign_scaled(x + self.bias_a.view(1, -1, 1, 1), self.scale_a)
        w_signs = torch.ops.bitcompile.ste_sign(self.weight, self.weight_clip)
        padding = self.padding
        if self.pad_value != 0.0 and padding != (0, 0):
            # Explicit F.pad of the signs (SPEC 2.4 matches this form): padded positions are pad_value.
            x_signs = F.pad(x_signs, (padding[1], padding[1], padding[0], padding[0]), value=self.pad_value)
            padding = (0, 0)
        out = F.conv2d(x_signs, w_signs, None, self.stride, padding, self.dilation)
        out = out * self._output_scale(self.weight)
        if self.bias is not None:
            out = out + self.bias.view(1, -1, 1, 1)
        return out

    @torch.no_grad()
    def quantized_parts(self) -> dict:
        """The packed inference form: y = binary_conv2d(x + bias_a, packed, in_channels, kernel_size,
        stride, padding, dilation, scale, bias, pad_value=pad_value).

        packed: int32 [out, kh, kw, ceil(in/32)] (pack_signs of W.permute(0, 2, 3, 1)); scale: fp32
        scalar scale_a * mean|W|. Tensors are detached copies.
        """
        return {
            "kind": "conv2d",
            "packed": torch.ops.bitcompile.pack_signs(self.weight.detach().permute(0, 2, 3, 1)),
            "scale": self._output_scale(self.weight).to(torch.float32).clone(),
            "bias_a": self.bias_a.detach().clone(),
            "bias": None if self.bias is None else self.bias.detach().clone(),
            "in_channels": self.in_channels,
            "out_channels": self.out_channels,
            "kernel_size": self.kernel_size,
            "stride": self.stride,
            "padding": self.padding,
            "dilation": self.dilation,
            "pad_value": self.pad_value,
        }

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, bias={self.bias is not None}, "
                f"symmetric={self.symmetric}, weight_clip={self.weight_clip}, pad_value={self.pad_value}")
