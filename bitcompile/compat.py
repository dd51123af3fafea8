"""Stand-ins for the APoT classes of the former `torch.ao.quantization.experimental` (in no PyTorch
release), with their constructors and attribute names, computing what SPEC.md 2.5 says.

- `LinearAPoT(weight2quantize, b, k)`: the former quantized linear module.
- `APoTObserver(b, k)`: the former observer (defined in bitcompile.apot, re-exported here).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import Tensor, nn

from bitcompile import apot
from bitcompile.apot import APoTObserver

__all__ = ["LinearAPoT", "APoTObserver"]


class LinearAPoT(nn.Module):
    r"""Linear layer with an unsigned APoT L(b, k) weight, as the former
    `torch.ao.quantization.experimental.linear.LinearAPoT`.

    Construction follows the original: an `APoTObserver(b, k)` observes `weight2quantize`
    (alpha = max|W| per tensor), `calculate_qparams(signed=False)` gives the attributes below, and
    the weight is quantized to the unsigned set (a negative weight becomes code 0, as in the
    original: this layer is only faithful for non-negative weights). The caller's tensor is read,
    never written (the original's `quantize_APoT` clamped it in place through `.detach().apply_`).

    Attributes (the original's names):
        b, k, n: bits, bits per term, n = b // k.
        alpha, gamma, quantization_levels, level_indices: the observer's qparams (tensors).
        weight: int32 codes [out_features, in_features] (combination codes m of SPEC 2.5).
        weight_transposed: weight.T (a view).
    Also (derived, not in the state dict):
        weight_packed: uint8 codes in the `pack_codes` layout, made by torch.ops.bitcompile.pack_codes
            on the first forward (constructing the layer needs no kernels), again if `weight` changes.
        code_values: the fp32 level of each code, exactly what `dequantize` gives.
        code_numerators, denominator: the exact integer form of level / alpha (None where the
            numerators do not fit int32: L(b, k) with k >= 6).

    Forward, and how it differs from the original:
    The original `forward(activation)` took uniformly quantized activations (a float tensor of
    integer values in its tests; quint8 in its docstring) and returned
    `activation @ codes.T` computed with bit shifts over the *bits of the code*: it multiplied by
    the code numbers themselves, with neither gamma nor the levels. Codes are labels of a
    non-uniform level set, not magnitudes (in L(4,2), code 5 is the largest level, alpha, and code
    15 a small one, 0.09375 * gamma), so that product is not the layer's output; the original's own
    tests only compared it with `activation @ codes.float().T`. Its docstring describes the APoT
    product, and that is what this class computes (SPEC 2.5):
    - float activation x (fp32 / fp16 / bf16, any leading dims):
      `y = x @ dequantize(weight).T` through `torch.ops.bitcompile.apot_linear`, fp32 accumulation,
      output in x's dtype (the code table holds the levels themselves, alpha = 1);
    - uint8 activation q with `scale` and `zero_point` (or a quint8 quantized tensor, per tensor):
      `y = scale * alpha / D * sum_k (q - zero_point) * N[code]` through
      `torch.ops.bitcompile.apot_linear_int`, exact integer sums, fp32 output. This uses the exact
      level values alpha * N / D, which differ from the fp32 levels by fp32 rounding only.
    """

    def __init__(self, weight2quantize: Tensor, b: int, k: int):
        super().__init__()
        if not isinstance(weight2quantize, Tensor) or not weight2quantize.is_floating_point():
            raise TypeError("bitcompile.compat.LinearAPoT: weight2quantize must be a floating point tensor")
        if weight2quantize.dim() != 2:
            raise ValueError(f"bitcompile.compat.LinearAPoT: weight2quantize must be 2-D, got {weight2quantize.dim()}-D")
        scheme = apot.unsigned_scheme(*apot._check_bits_k("LinearAPoT", b, k))
        self.b = b
        self.k = k
        self.n = b // k
        self.out_features, self.in_features = weight2quantize.shape

        weight = weight2quantize.detach()  # read only: everything below makes new tensors
        observer = APoTObserver(b=b, k=k)
        observer(weight)
        alpha, gamma, quantization_levels, level_indices = observer.calculate_qparams(signed=False)
        codes = apot.quantize(weight, alpha, gamma, quantization_levels, level_indices, dtype=torch.int32)

        self.register_buffer("alpha", alpha)
        self.register_buffer("gamma", gamma)
        self.register_buffer("quantization_levels", quantization_levels)
        self.register_buffer("level_indices", level_indices)
        self.register_buffer("weight", codes)
        # level of every code (what dequantize gives), the table apot_linear reads with alpha = 1
        code_values = torch.empty_like(quantization_levels).scatter_(0, level_indices, quantization_levels)
        # derived tables, not saved: they follow from the qparams
        self.register_buffer("code_values", code_values, persistent=False)
        try:
            numerators = scheme.code_numerators.to(weight.device)
            self.denominator: Optional[float] = float(scheme.denominator)
        except ValueError:
            numerators, self.denominator = None, None
        self.register_buffer("code_numerators", numerators, persistent=False)
        self.register_buffer("weight_packed", None, persistent=False)
        self._packed_from = None  # (storage, version, device) of the codes weight_packed was made from

    @property
    def weight_transposed(self) -> Tensor:
        return self.weight.t()

    def packed_weight(self) -> Tensor:
        """The codes packed for the kernels (pack_codes layout): packed on first use, and again
        only when `weight` is replaced, updated in place or moved."""
        key = (self.weight.data_ptr(), self.weight._version, self.weight.device)
        if self.weight_packed is None or self._packed_from != key:
            self.weight_packed = torch.ops.bitcompile.pack_codes(self.weight, self.b)
            self._packed_from = key
        return self.weight_packed

    def dequantized_weight(self) -> Tensor:
        """float32 [out_features, in_features]: the level of every weight code."""
        return self.code_values[self.weight.long()]

    def forward(self, activation: Tensor, scale: Union[Tensor, float, None] = None,
                zero_point: Union[Tensor, int, None] = None) -> Tensor:
        if activation.is_quantized:
            if activation.qscheme() not in (torch.per_tensor_affine, torch.per_tensor_symmetric):
                raise ValueError("bitcompile.compat.LinearAPoT: quantized activations must be per-tensor")
            if activation.dtype != torch.quint8:
                raise TypeError(f"bitcompile.compat.LinearAPoT: quantized activations must be quint8, got {activation.dtype}")
            return self._forward_int(activation.int_repr(), activation.q_scale(), activation.q_zero_point())
        if activation.dtype == torch.uint8:
            if scale is None or zero_point is None:
                raise ValueError("bitcompile.compat.LinearAPoT: uint8 activations need scale and zero_point")
            return self._forward_int(activation, scale, zero_point)
        if scale is not None or zero_point is not None:
            raise ValueError("bitcompile.compat.LinearAPoT: scale and zero_point go with uint8 activations only")
        if not activation.is_floating_point():
            raise TypeError(
                f"bitcompile.compat.LinearAPoT: activation must be float or uint8 (with scale and zero_point), got {activation.dtype}"
            )
        one = torch.ones((), dtype=torch.float32, device=activation.device)
        return torch.ops.bitcompile.apot_linear(
            activation, self.packed_weight(), self.in_features, self.b, self.code_values, one, None
        )

    def _forward_int(self, q_x: Tensor, scale, zero_point) -> Tensor:
        if self.code_numerators is None:
            raise ValueError(
                f"bitcompile.compat.LinearAPoT: L({self.b},{self.k}) has no int32 numerators; use float activations"
            )
        device = q_x.device
        x_scale = torch.as_tensor(scale, dtype=torch.float32, device=device).reshape(())
        x_zero_point = torch.as_tensor(zero_point, device=device).reshape(()).to(torch.int64)
        return torch.ops.bitcompile.apot_linear_int(
            q_x, x_scale, x_zero_point, self.packed_weight(), self.in_features, self.b, self.code_numerators,
            self.denominator, self.alpha, None,
        )

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, b={self.b}, k={self.k}"

    @classmethod
    def from_reference(cls, ref_qlinear, alpha, gamma, quantization_levels, level_indices):
        raise NotImplementedError("bitcompile.compat.LinearAPoT.from_reference is not implemented (nor was it before)")
