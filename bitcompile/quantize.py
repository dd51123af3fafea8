"""bitcompile.quantize_: convert a model's float Linear/Conv2d layers to packed inference layers.

In place, like torchao's `quantize_`: every selected `nn.Linear` / `nn.Conv2d` (groups == 1,
zero padding) is replaced by a `QuantizedLinear` / `QuantizedConv2d` that holds the weight packed
(int32 signs or uint8 APoT codes) plus float scales and bias as buffers, and whose forward calls
the kernel op directly. The float weight is not kept.

Schemes (what changes numerically):
- "binary"        W1A1: y = (s(x) @ s(W).T) * alpha + bias, alpha = mean|W| per output row
                  (XNOR-Net's weight scale); conv: conv2d(s(x), s(W)) * alpha + bias with zero
                  padding (a padded position contributes 0). Ops: binary_linear, binary_conv2d.
- "binary_weight" W1A16: y = x @ (s(W) * alpha).T + bias, same alpha; op binary_weight_linear.
                  Conv: conv2d(x, s(W)) * alpha + bias; op binary_weight_conv2d.
- "apot3", "apot4", "apot5": codes, alpha = bitcompile.apot.quantize_weight(W, scheme,
                  per_channel=True) (alpha = max|W| per output channel);
                  y = x @ (alpha * code_values[code]).T + bias. Ops: apot_linear, apot_conv2d.

Storage (SPEC 2.1, 2.5; see ops.py): linear weights pack along in_features; conv weights pack
W.permute(0, 2, 3, 1) (signs: [OC, KH, KW, ceil(C/32)]; APoT codes: [OC, bytes of KH*KW*C]).

The backend reproduces quantize_ exactly for options={"quantize": scheme} through
`convert_linear_weight` / `convert_conv2d_weight`, the one conversion both use.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import Tensor, nn

import bitcompile.ops  # noqa: F401  (registers the bitcompile ops; ops.py imports nothing from here)
from bitcompile import apot

__all__ = [
    "SCHEMES",
    "quantize_",
    "convert_linear_weight",
    "convert_conv2d_weight",
    "QuantizedLinear",
    "QuantizedConv2d",
]

BINARY_SCHEMES = ("binary", "binary_weight")
APOT_SCHEMES = ("apot3", "apot4", "apot5")
SCHEMES = BINARY_SCHEMES + APOT_SCHEMES

FilterFn = Callable[[str, str], bool]


def _check_scheme(scheme) -> str:
    if scheme not in SCHEMES:
        raise ValueError(f"bitcompile.quantize_: unknown scheme {scheme!r}; expected one of {list(SCHEMES)}")
    return scheme


# ----------------------------------------------------------------------------------------------
# Weight conversion (shared with the backend)
# ----------------------------------------------------------------------------------------------
def _convert_rows(rows: Tensor, scheme: str) -> dict:
    """Convert a weight viewed as rows [out, reduction] (the packed layout's element order)."""
    if scheme in BINARY_SCHEMES:
        # XNOR-Net's alpha: mean|W| over the reduction dimension of each output row, in fp32.
        return {
            "packed": torch.ops.bitcompile.pack_signs(rows),
            "scale": rows.abs().to(torch.float32).mean(dim=1),
            "bits": 1,
        }
    resolved = apot.get_scheme(scheme)
    codes, alpha = apot.quantize_weight(rows, resolved, per_channel=True)
    return {
        "packed": torch.ops.bitcompile.pack_codes(codes, resolved.bits),
        "alpha": alpha.reshape(-1).to(torch.float32),
        "bits": resolved.bits,
        "code_values": resolved.code_values.to(rows.device),
        "code_numerators": resolved.code_numerators.to(rows.device),
        "denominator": resolved.denominator,
    }


def _check_weight(function: str, weight: Tensor, dim: int) -> Tensor:
    if not isinstance(weight, Tensor) or weight.dim() != dim:
        shape = tuple(weight.shape) if isinstance(weight, Tensor) else type(weight).__name__
        raise ValueError(f"bitcompile.quantize.{function}: weight must be a {dim}-D tensor, got {shape}")
    if weight.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"bitcompile.quantize.{function}: weight must be float32, float16 or bfloat16, got {weight.dtype}")
    if weight.numel() == 0:
        raise ValueError(f"bitcompile.quantize.{function}: weight is empty, shape {tuple(weight.shape)}")
    return weight.detach()


@torch.no_grad()
def convert_linear_weight(weight: Tensor, scheme: str) -> dict:
    """Convert a Linear weight [out, in] as quantize_ does.

    Returns a dict: scheme, kind="linear", in_features, out_features, bits, packed (int32
    [out, ceil(in/32)] signs for the binary schemes, uint8 codes for APoT), and for the binary
    schemes scale (fp32 [out], mean|W| per row); for APoT alpha (fp32 [out], max|W| per row),
    code_values (fp32 [2**bits]), code_numerators (int32 [2**bits]) and denominator (int).
    """
    _check_scheme(scheme)
    weight = _check_weight("convert_linear_weight", weight, 2)
    converted = _convert_rows(weight, scheme)
    converted.update(scheme=scheme, kind="linear", out_features=weight.shape[0], in_features=weight.shape[1])
    return converted


@torch.no_grad()
def convert_conv2d_weight(weight: Tensor, scheme: str) -> dict:
    """Convert a Conv2d weight [OC, C, KH, KW] (groups = 1) as quantize_ does.

    Same keys as convert_linear_weight, with kind="conv2d", in_channels, out_channels and
    kernel_size instead of in/out_features. Binary: packed = pack_signs(W.permute(0, 2, 3, 1)),
    [OC, KH, KW, ceil(C/32)]; APoT: packed codes of W.permute(0, 2, 3, 1).reshape(OC, -1).
    """
    _check_scheme(scheme)
    weight = _check_weight("convert_conv2d_weight", weight, 4)
    out_channels, in_channels, kh, kw = weight.shape
    channels_last = weight.permute(0, 2, 3, 1)
    if scheme in BINARY_SCHEMES:
        converted = {
            "packed": torch.ops.bitcompile.pack_signs(channels_last),
            "scale": weight.abs().to(torch.float32).mean(dim=(1, 2, 3)),
            "bits": 1,
        }
    else:
        converted = _convert_rows(channels_last.reshape(out_channels, -1), scheme)
    converted.update(scheme=scheme, kind="conv2d", out_channels=out_channels, in_channels=in_channels,
                     kernel_size=(kh, kw))
    return converted


# ----------------------------------------------------------------------------------------------
# Inference modules
# ----------------------------------------------------------------------------------------------
def _register_parts(module: nn.Module, converted: dict, bias: Optional[Tensor]) -> None:
    module.register_buffer("w_packed", converted["packed"])
    if module.scheme in BINARY_SCHEMES:
        module.register_buffer("scale", converted["scale"])
    else:
        module.register_buffer("alpha", converted["alpha"])
        module.register_buffer("code_values", converted["code_values"])
    module.bits = converted["bits"]
    module.register_buffer("bias", None if bias is None else bias.detach().clone())


class QuantizedLinear(nn.Module):
    """A Linear layer with a packed weight (made by quantize_); forward calls the kernel op.

    Buffers: w_packed, scale (binary schemes) or alpha and code_values (APoT), bias (or None).
    """

    kind = "linear"  # bitcompile.explain's layer kind

    def __init__(self, converted: dict, bias: Optional[Tensor] = None) -> None:
        super().__init__()
        if converted.get("kind") != "linear":
            raise ValueError("bitcompile.quantize.QuantizedLinear: expected the dict of convert_linear_weight")
        self.scheme = _check_scheme(converted["scheme"])
        self.in_features = converted["in_features"]
        self.out_features = converted["out_features"]
        _register_parts(self, converted, bias)

    @classmethod
    def from_float(cls, linear: nn.Linear, scheme: str) -> "QuantizedLinear":
        return cls(convert_linear_weight(linear.weight, scheme), linear.bias)

    def forward(self, x: Tensor) -> Tensor:
        if self.scheme == "binary":
            return torch.ops.bitcompile.binary_linear(x, self.w_packed, self.in_features, self.scale, self.bias)
        if self.scheme == "binary_weight":
            return torch.ops.bitcompile.binary_weight_linear(x, self.w_packed, self.in_features, self.scale, self.bias)
        return torch.ops.bitcompile.apot_linear(
            x, self.w_packed, self.in_features, self.bits, self.code_values, self.alpha, self.bias
        )

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, scheme={self.scheme}, "
                f"bias={self.bias is not None}")


class QuantizedConv2d(nn.Module):
    """A Conv2d layer (groups = 1) with a packed weight (made by quantize_).

    "binary" calls binary_conv2d (zero padding), "binary_weight" binary_weight_conv2d, the APoT schemes
    apot_conv2d.
    """

    kind = "conv2d"  # bitcompile.explain's layer kind

    def __init__(self, converted: dict, bias: Optional[Tensor] = None, stride=(1, 1), padding=(0, 0),
                 dilation=(1, 1)) -> None:
        super().__init__()
        if converted.get("kind") != "conv2d":
            raise ValueError("bitcompile.quantize.QuantizedConv2d: expected the dict of convert_conv2d_weight")
        self.scheme = _check_scheme(converted["scheme"])
        self.in_channels = converted["in_channels"]
        self.out_channels = converted["out_channels"]
        self.kernel_size = tuple(converted["kernel_size"])
        self.stride = tuple(stride)
        self.padding = tuple(padding)
        self.dilation = tuple(dilation)
        _register_parts(self, converted, bias)

    @classmethod
    def from_float(cls, conv: nn.Conv2d, scheme: str) -> "QuantizedConv2d":
        padding = _conv_padding(conv)
        if padding is None or conv.groups != 1 or conv.padding_mode != "zeros":
            raise ValueError(f"bitcompile.quantize.QuantizedConv2d: unsupported conv {conv} "
                             "(needs groups=1, zero padding, symmetric padding)")
        return cls(convert_conv2d_weight(conv.weight, scheme), conv.bias, conv.stride, padding, conv.dilation)

    def dequantized_weight(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """s(W) * scale as a float [OC, C, KH, KW] tensor, from the packed buffer (binary schemes)."""
        signs = bitcompile.ops.unpack_signs(self.w_packed, self.in_channels, torch.float32).permute(0, 3, 1, 2)
        return (signs * self.scale.view(-1, 1, 1, 1)).to(dtype)

    def forward(self, x: Tensor) -> Tensor:
        if self.scheme == "binary":
            return torch.ops.bitcompile.binary_conv2d(
                x, self.w_packed, self.in_channels, self.kernel_size, self.stride, self.padding, self.dilation,
                self.scale, self.bias, pad_value=0.0,
            )
        if self.scheme == "binary_weight":
            return torch.ops.bitcompile.binary_weight_conv2d(
                x, self.w_packed, self.in_channels, self.kernel_size, self.stride, self.padding, self.dilation,
                self.scale, self.bias,
            )
        return torch.ops.bitcompile.apot_conv2d(
            x, self.w_packed, self.in_channels, self.kernel_size, self.stride, self.padding, self.dilation,
            self.bits, self.code_values, self.alpha, self.bias,
        )

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
                f"padding={self.padding}, dilation={self.dilation}, scheme={self.scheme}, bias={self.bias is not None}")


# ----------------------------------------------------------------------------------------------
# quantize_
# ----------------------------------------------------------------------------------------------
def _conv_padding(conv: nn.Conv2d) -> Optional[tuple[int, int]]:
    """The conv's padding as a pair of ints, or None when the kernels cannot express it."""
    padding = conv.padding
    if padding == "valid":
        return (0, 0)
    if padding == "same":
        totals = [d * (k - 1) for d, k in zip(conv.dilation, conv.kernel_size)]
        if any(t % 2 for t in totals):
            return None  # PyTorch pads one side more: not a symmetric padding
        return (totals[0] // 2, totals[1] // 2)
    return (int(padding[0]), int(padding[1]))


def _kind(module: nn.Module) -> Optional[str]:
    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.Conv2d):
        return "conv2d"
    return None


def _supported(module: nn.Module, kind: str) -> bool:
    if kind == "conv2d":
        return module.groups == 1 and module.padding_mode == "zeros" and _conv_padding(module) is not None
    return True


def _convert_module(module: nn.Module, kind: str, scheme: str) -> nn.Module:
    if kind == "linear":
        return QuantizedLinear.from_float(module, scheme)
    return QuantizedConv2d.from_float(module, scheme)


def quantize_(model: nn.Module, scheme: str, filter: Optional[FilterFn] = None) -> nn.Module:
    """Replace, in place, the selected nn.Linear / nn.Conv2d of `model` by packed inference layers.

    scheme: "binary", "binary_weight", "apot3", "apot4" or "apot5" (see the module docstring).
    filter: `(fqn, kind) -> bool`, kind in {"linear", "conv2d"}; True converts the layer (torchao's
        filter_fn convention). Default: every nn.Linear and every nn.Conv2d with groups == 1.
    Layers the kernels cannot run (grouped or non-zero-padded convs, one-sided "same" padding) and
    the projections inside nn.MultiheadAttention (which reads their .weight directly) are left as
    they are. Returns `model`; when `model` itself is a selected layer it cannot be replaced in
    place, and the converted layer is returned instead.
    """
    _check_scheme(scheme)
    if filter is not None and not callable(filter):
        raise TypeError(f"bitcompile.quantize_: filter must be a callable (fqn, kind) -> bool, got {type(filter).__name__}")

    def selected(fqn: str, module: nn.Module) -> Optional[str]:
        kind = _kind(module)
        if kind is None or not _supported(module, kind):
            return None
        if filter is not None and not filter(fqn, kind):
            return None
        return kind

    root_kind = selected("", model)
    if root_kind is not None:
        return _convert_module(model, root_kind, scheme)

    # Collect first, then replace: named_modules must not see the tree change under it.
    replacements = []
    for parent_name, parent in model.named_modules():
        if isinstance(parent, nn.MultiheadAttention):
            continue
        for child_name, child in parent.named_children():
            fqn = f"{parent_name}.{child_name}" if parent_name else child_name
            kind = selected(fqn, child)
            if kind is not None:
                replacements.append((parent, child_name, child, kind))
    converted: dict = {}  # a layer shared by several parents is converted once
    for parent, child_name, child, kind in replacements:
        if id(child) not in converted:
            converted[id(child)] = _convert_module(child, kind, scheme)
        setattr(parent, child_name, converted[id(child)])
    return model
