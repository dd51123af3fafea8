"""APoT (additive powers-of-two) quantization: level sets, qparams, quantize and dequantize (SPEC.md 2.5).

Everything here is plain PyTorch and vectorized over the elements (the only Python loops run over
the <= 256 levels or the n <= 8 terms of a level); it never needs the C++ kernels.

Level sets
----------
- Unsigned `L(b, k)`, `b % k == 0`, `n = b // k` terms. Term set i is
  `p_i = {0} U {2^-(i + j*n) : j = 0 .. 2^k - 2}`; `gamma = alpha / sum_{i<n} 2^-i` (fp32) and the
  level of a combination is `gamma * (t_0 + ... + t_{n-1})`, the sum in fp32 in that order, then
  the fp32 product. This is what the former `torch.ao.quantization.experimental` APoTObserver
  computed (per-tensor alpha = max|x|).
- Signed schemes for weights: `apot3` (magnitudes L(2,2)), `apot4` (the APoT paper's 3-bit set
  {0, 2^-1, 2^-2, 2^-4} + {0, 2^-3}, normalized), `apot5` (L(4,2) normalized). Every magnitude is
  `N / D` of alpha with an integer numerator N (SCHEMES below), and alpha is per output channel
  by default.

Code layouts (what quantize returns, what the packed kernels and `pack_codes` store)
------------------------------------------------------------------------------------
- Unsigned L(b, k): the combination code of the spec, `m = sum_i c_i * 2^(k*(n-1-i))`, `c_i` the
  index of term i in `p_i` (0 for the zero term, j + 1 for `2^-(i + j*n)`). All 2^b codes are
  combinations. `level_indices[r]` is the code of the r-th smallest level (argsort, stable).
- Signed schemes: `code = (sign << (bits - 1)) | magnitude_index`, sign = 1 for a negative value,
  `magnitude_index` the index into the sorted magnitude numerators (0 is the zero level). The code
  `1 << (bits - 1)` (sign 1, magnitude 0, "negative zero") is never produced by quantize; its table
  value is 0, so dequantizing it is harmless.

Code tables (the arguments of torch.ops.bitcompile.apot_linear / apot_linear_int / apot_conv2d)
----------------------------------------------------------------------------------------------
`Scheme.code_values[c]` is the value of code c relative to alpha (float32, 2^bits entries) and
`Scheme.code_numerators[c]` its exact integer numerator over `Scheme.denominator` (int32), so the
weight of code c is `alpha * code_values[c]` (fp32 product) and exactly `alpha / D * N[c]`.
Signed schemes: `code_values[c] = fp32(+-N / D)`. Unsigned L(b, k): `code_values[m]` is level(m)
computed as above with alpha = 1, and `level(m) / alpha = N(m) / D` exactly with
`D = (2^n - 1) * 2^((2^k - 2) * n)` and `N(m) = sum_{c_i > 0} 2^(E - i - (c_i - 1) * n)`,
`E = (n - 1) + (2^k - 2) * n`. The numerators of L(b, k) with k >= 6 do not fit int32 (their
smallest levels also underflow fp32); asking for that table raises.

Quantization (`quantize`): clamp to [-alpha, alpha], then the nearest level; a value exactly half
way between two levels goes to the one nearer zero (the lower level for the non-negative values
of unsigned sets and for magnitudes of signed schemes). Unsigned sets map every negative value to
code 0. Comparisons are made in float64 against the midpoints of the fp32 levels, so a value that
is already a level maps back to its own code. alpha = 0 (an all-zero row) gives code 0, no NaN.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import NamedTuple, Optional, Sequence, Union

import torch
from torch import Tensor, nn

__all__ = [
    "Scheme",
    "SCHEMES",
    "get_scheme",
    "unsigned_scheme",
    "levels",
    "QParams",
    "APoTObserver",
    "calculate_qparams",
    "quantize",
    "dequantize",
    "quantize_weight",
    "is_on_grid",
]

_CODE_DTYPES = (torch.int64, torch.int32, torch.int16, torch.uint8)
_INT32_MAX = 2**31 - 1


# ----------------------------------------------------------------------------------------------
# Schemes and their code tables
# ----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Scheme:
    """One APoT code set: its level values per code, relative to alpha, and their integer form.

    name: "apot3", "apot4", "apot5" or "L(b,k)" for an unsigned set.
    bits: bits per code (2**bits codes).
    signed: True for the weight schemes (sign bit + magnitude index), False for L(b, k).
    denominator: D; every level is alpha * N / D.
    numerators: the sorted distinct numerators N of the magnitudes (signed) or levels (unsigned).
    k: the k of the L(b, k) construction the set comes from (None for apot4).
    code_values / code_numerators: the per-code tables (tensors, fresh copies on each access).
    """

    name: str
    bits: int
    signed: bool
    denominator: int
    numerators: tuple
    k: Optional[int] = None
    _values: tuple = field(default=(), repr=False)  # per code, fp32-exact Python floats
    _numerators: tuple = field(default=(), repr=False)  # per code, Python ints (signed)

    @property
    def num_codes(self) -> int:
        return 2**self.bits

    @property
    def code_values(self) -> Tensor:
        """float32 [2**bits]: value of code c relative to alpha."""
        return torch.tensor(self._values, dtype=torch.float32)

    @property
    def code_numerators(self) -> Tensor:
        """int32 [2**bits]: numerator of code c over `denominator`."""
        if max(abs(n) for n in self._numerators) > _INT32_MAX or self.denominator > 2**53:
            raise ValueError(
                f"bitcompile.apot: the integer numerators of {self.name} do not fit int32 "
                f"(denominator {self.denominator}); use the float tables (apot_linear) for this set"
            )
        return torch.tensor(self._numerators, dtype=torch.int32)


def _check_bits_k(function: str, bits, k) -> tuple[int, int]:
    if isinstance(bits, bool) or not isinstance(bits, int) or isinstance(k, bool) or not isinstance(k, int):
        raise TypeError(f"bitcompile.apot.{function}: bits and k must be integers, got bits={bits!r}, k={k!r}")
    if not 1 <= bits <= 8:
        raise ValueError(f"bitcompile.apot.{function}: bits must be in 1..8 (codes are stored in at most a byte), got {bits}")
    if k < 1 or bits % k != 0:
        raise ValueError(f"bitcompile.apot.{function}: L(b, k) needs k >= 1 and b % k == 0, got b={bits}, k={k}")
    return bits, k


def _combination_digits(bits: int, k: int) -> Tensor:
    """int64 [n, 2**bits]: digit c_i of every combination code m (m = sum_i c_i * 2^(k*(n-1-i)))."""
    n = bits // k
    codes = torch.arange(2**bits, dtype=torch.int64)
    shifts = torch.tensor([k * (n - 1 - i) for i in range(n)], dtype=torch.int64)
    return (codes.unsqueeze(0) >> shifts.unsqueeze(1)) & (2**k - 1)


def _term_sums_fp32(bits: int, k: int) -> Tensor:
    """float32 [2**bits]: t_0 + ... + t_{n-1} of every combination code, summed in fp32 in order."""
    n = bits // k
    digits = _combination_digits(bits, k)
    total = None
    for i in range(n):
        exponent = i + (digits[i] - 1) * n
        # 2^-e is exact in float64; the cast rounds only where fp32 underflows (k >= 6).
        term = torch.where(digits[i] > 0, torch.pow(2.0, -exponent.to(torch.float64)), 0.0).to(torch.float32)
        total = term if total is None else total + term
    return total


def _term_sum_max(bits: int, k: int) -> Tensor:
    n = bits // k
    total = torch.zeros((), dtype=torch.float32)
    for i in range(n):
        total = total + torch.tensor(2.0**-i, dtype=torch.float32)
    return total


def _unsigned_numerators(bits: int, k: int) -> tuple[list[int], int]:
    """Exact numerators N(m) per code and the denominator D with level(m) / alpha = N(m) / D."""
    n = bits // k
    top = (n - 1) + (2**k - 2) * n  # E: the exponent of the smallest term
    digits = _combination_digits(bits, k).tolist()
    numerators = []
    for m in range(2**bits):
        numerators.append(sum(2 ** (top - i - (digits[i][m] - 1) * n) for i in range(n) if digits[i][m] > 0))
    denominator = (2**n - 1) * 2 ** ((2**k - 2) * n)
    return numerators, denominator


def _signed_scheme(name: str, bits: int, magnitude_numerators: Sequence[int], k: Optional[int]) -> Scheme:
    magnitudes = sorted(set(magnitude_numerators))
    denominator = magnitudes[-1]
    divisor = functools.reduce(math.gcd, magnitudes, denominator)
    magnitudes = [m // divisor for m in magnitudes]
    denominator //= divisor
    if len(magnitudes) != 2 ** (bits - 1):
        raise AssertionError(f"{name}: {len(magnitudes)} magnitudes for {bits} bits")  # a bug here, not user input
    numerators = []
    for code in range(2**bits):
        sign = -1 if code >> (bits - 1) else 1
        numerators.append(sign * magnitudes[code & (2 ** (bits - 1) - 1)])
    # fp32(N / D): the float64 quotient is rounded once more to fp32; D has a factor 3 or 5 (or is a
    # power of two), so the quotient is never near an fp32 rounding midpoint and this is exact.
    values = [float(torch.tensor(n / denominator, dtype=torch.float32)) for n in numerators]
    values = [0.0 if v == 0 else v for v in values]  # "negative zero" code: +0.0
    return Scheme(name, bits, True, denominator, tuple(magnitudes), k, tuple(values), tuple(numerators))


def _paper_apot4_numerators() -> list[int]:
    # {0, 2^-1, 2^-2, 2^-4} + {0, 2^-3} in units of 2^-4
    return [a + b for a in (0, 8, 4, 1) for b in (0, 2)]


@functools.lru_cache(maxsize=None)
def unsigned_scheme(bits: int, k: int) -> Scheme:
    """The unsigned L(bits, k) set as a Scheme whose tables are indexed by the combination code m."""
    bits, k = _check_bits_k("unsigned_scheme", bits, k)
    numerators, denominator = _unsigned_numerators(bits, k)
    gamma = torch.tensor(1.0, dtype=torch.float32) / _term_sum_max(bits, k)
    values = (gamma * _term_sums_fp32(bits, k)).tolist()
    return Scheme(f"L({bits},{k})", bits, False, denominator, tuple(sorted(numerators)), k, tuple(values),
                  tuple(numerators))


SCHEMES: dict = {
    "apot3": _signed_scheme("apot3", 3, _unsigned_numerators(2, 2)[0], 2),
    "apot4": _signed_scheme("apot4", 4, _paper_apot4_numerators(), None),
    "apot5": _signed_scheme("apot5", 5, _unsigned_numerators(4, 2)[0], 2),
}
_SIGNED_BY_BITS = {scheme.bits: scheme for scheme in SCHEMES.values()}


def get_scheme(scheme: Union[str, Scheme]) -> Scheme:
    """A Scheme from its name ("apot3", "apot4", "apot5", or "L(b,k)") or the Scheme itself."""
    if isinstance(scheme, Scheme):
        return scheme
    if isinstance(scheme, str):
        if scheme in SCHEMES:
            return SCHEMES[scheme]
        text = scheme.replace(" ", "")
        if text.startswith("L(") and text.endswith(")"):
            parts = text[2:-1].split(",")
            if len(parts) == 2 and all(p.isdigit() for p in parts):
                return unsigned_scheme(int(parts[0]), int(parts[1]))
    raise ValueError(f"bitcompile.apot: unknown APoT scheme {scheme!r}; expected one of {sorted(SCHEMES)} or 'L(b,k)'")


def _signed_scheme_for_bits(function: str, bits) -> Scheme:
    if bits not in _SIGNED_BY_BITS:
        raise ValueError(
            f"bitcompile.apot.{function}: signed APoT schemes exist for bits 3 (apot3), 4 (apot4) and 5 (apot5), got {bits}"
        )
    return _SIGNED_BY_BITS[bits]


# ----------------------------------------------------------------------------------------------
# alpha handling
# ----------------------------------------------------------------------------------------------
def _as_alpha(function: str, alpha, reference: Optional[Tensor] = None) -> Tensor:
    """alpha as a float32 tensor (0-d, or 1-d per channel) on the reference's device."""
    if alpha is None:
        raise ValueError(f"bitcompile.apot.{function}: alpha is required here")
    device = reference.device if reference is not None else None
    if isinstance(alpha, Tensor):
        if not alpha.is_floating_point():
            raise TypeError(f"bitcompile.apot.{function}: alpha must be a float tensor, got {alpha.dtype}")
        alpha = alpha.detach().to(device=device if device is not None else alpha.device, dtype=torch.float32)
    else:
        alpha = torch.tensor(float(alpha), dtype=torch.float32, device=device)
    if alpha.numel() == 1:
        return alpha.reshape(())
    if alpha.dim() != 1:
        raise ValueError(f"bitcompile.apot.{function}: alpha must be a scalar or 1-D (one per channel), got shape {tuple(alpha.shape)}")
    return alpha


def _channel_view(function: str, x: Tensor, alpha: Tensor) -> Tensor:
    """alpha shaped to broadcast against x: per channel along dim 0."""
    if alpha.dim() == 0:
        return alpha
    if x.dim() == 0 or x.shape[0] != alpha.shape[0]:
        raise ValueError(
            f"bitcompile.apot.{function}: per-channel alpha has {alpha.shape[0]} entries, "
            f"x has shape {tuple(x.shape)} (channels along dim 0)"
        )
    return alpha.reshape(-1, *([1] * (x.dim() - 1)))


def _max_abs(x: Tensor, per_channel: bool) -> Tensor:
    x = x.detach()
    if not per_channel:
        return x.abs().amax().to(torch.float32) if x.numel() else torch.zeros((), dtype=torch.float32, device=x.device)
    if x.dim() == 0:
        raise ValueError("bitcompile.apot: per-channel alpha needs at least one dimension")
    if x.dim() == 1:
        return x.abs().to(torch.float32)
    if x[0].numel() == 0:
        return torch.zeros(x.shape[0], dtype=torch.float32, device=x.device)
    return x.abs().amax(dim=tuple(range(1, x.dim()))).to(torch.float32)


# ----------------------------------------------------------------------------------------------
# Level sets
# ----------------------------------------------------------------------------------------------
def _unsigned_levels_by_code(bits: int, k: int, alpha: Tensor) -> tuple[Tensor, Tensor]:
    """(gamma, levels) with levels[..., m] = level(m) of L(bits, k); alpha 0-d or [C]."""
    sums = _term_sums_fp32(bits, k).to(alpha.device)
    gamma = alpha / _term_sum_max(bits, k).to(alpha.device)  # fp32 division
    return gamma, gamma.unsqueeze(-1) * sums


def _signed_levels_sorted(scheme: Scheme, alpha: Tensor) -> Tensor:
    magnitudes = scheme.code_values[: 2 ** (scheme.bits - 1)].to(alpha.device)
    positive = alpha.unsqueeze(-1) * magnitudes
    return torch.cat((-positive[..., 1:].flip(-1), positive), dim=-1)


def levels(bits: int, k: Optional[int] = None, signed: bool = False, alpha=1.0) -> Tensor:
    """The sorted level set (float32).

    signed=False: the unsigned L(bits, k) set of SPEC 2.5 scaled by alpha (2**bits levels).
    signed=True: the signed scheme of `bits` bits (3: apot3, 4: apot4, 5: apot5): negative and
    positive levels and one zero (2**bits - 1 values), alpha * code value; k is not used (the scheme
    fixes its magnitudes). alpha may be a 1-D tensor, giving one row of levels per channel.
    """
    alpha = _as_alpha("levels", alpha)
    if signed:
        return _signed_levels_sorted(_signed_scheme_for_bits("levels", bits), alpha)
    if k is None:
        raise ValueError("bitcompile.apot.levels: the unsigned L(b, k) set needs k")
    bits, k = _check_bits_k("levels", bits, k)
    _, by_code = _unsigned_levels_by_code(bits, k, alpha)
    return torch.sort(by_code, dim=-1, stable=True).values


# ----------------------------------------------------------------------------------------------
# qparams and the observer
# ----------------------------------------------------------------------------------------------
class QParams(NamedTuple):
    """What the former APoTObserver.calculate_qparams returned, in that order."""

    alpha: Tensor  # clipping level, float32 (0-d, or [C] per channel)
    gamma: Tensor  # unsigned: alpha / sum_i 2^-i; signed schemes: alpha / D (level = gamma * N)
    quantization_levels: Tensor  # sorted levels, float32 ([L] or [C, L])
    level_indices: Tensor  # int64: level_indices[r] = code of the r-th smallest level


def _qparams_from_alpha(function: str, bits: int, k: Optional[int], signed: bool, alpha: Tensor) -> QParams:
    if signed:
        scheme = _signed_scheme_for_bits(function, bits)
        magnitude_count = 2 ** (bits - 1)
        # sorted signed levels: -m[L-1] .. -m[1], 0, m[1] .. m[L-1]
        negative_codes = [magnitude_count | i for i in range(magnitude_count - 1, 0, -1)]
        indices = torch.tensor(negative_codes + list(range(magnitude_count)), dtype=torch.int64, device=alpha.device)
        gamma = alpha / scheme.denominator
        return QParams(alpha, gamma, _signed_levels_sorted(scheme, alpha), indices)
    if k is None:
        raise ValueError(f"bitcompile.apot.{function}: the unsigned L(b, k) set needs k")
    bits, k = _check_bits_k(function, bits, k)
    gamma, by_code = _unsigned_levels_by_code(bits, k, alpha)
    quantization_levels, level_indices = torch.sort(by_code, dim=-1, stable=True)
    return QParams(alpha, gamma, quantization_levels, level_indices)


def calculate_qparams(x: Tensor, bits: int, k: Optional[int] = None, *, signed: bool = False,
                      per_channel: Optional[bool] = None) -> QParams:
    """(alpha, gamma, quantization_levels, level_indices) for the values of x.

    signed=False: the unsigned L(bits, k) set, alpha = max|x| per tensor (the former APoTObserver);
    signed=True: the signed scheme of `bits` bits, alpha = max|x| per output channel (dim 0) by
    default. `per_channel` overrides either default; per channel, gamma and the levels get a
    leading channel dimension.
    """
    _check_float("calculate_qparams", x)
    per_channel = signed if per_channel is None else per_channel
    alpha = _max_abs(x, per_channel)
    return _qparams_from_alpha("calculate_qparams", bits, k, signed, alpha)


class APoTObserver(nn.Module):
    """Running min/max observer with the interface of the former torch.ao APoTObserver.

    `observer(x)` records the running min and max of x and returns x unchanged;
    `calculate_qparams(signed=False)` returns (alpha, gamma, quantization_levels, level_indices)
    with alpha = max(-min, max). signed=True gives the signed scheme of b bits (apot3/4/5) with a
    per-tensor alpha; the former code built a cartesian product of signed term sets instead,
    which is not a code set of b bits.
    """

    def __init__(self, b: int, k: int, dtype=torch.quint8) -> None:
        super().__init__()
        _check_bits_k("APoTObserver", b, k)
        self.b = b
        self.k = k
        self.n = b // k
        self.dtype = dtype
        self.register_buffer("min_val", torch.tensor([]))
        self.register_buffer("max_val", torch.tensor([]))

    def forward(self, x_orig: Tensor) -> Tensor:
        if x_orig.numel() == 0:
            return x_orig
        _check_float("APoTObserver", x_orig)
        x = x_orig.detach().to(torch.float32)
        min_val, max_val = torch.aminmax(x)
        if self.min_val.numel():
            min_val = torch.minimum(min_val, self.min_val.to(min_val.device))
            max_val = torch.maximum(max_val, self.max_val.to(max_val.device))
        self.min_val = min_val
        self.max_val = max_val
        return x_orig

    def calculate_qparams(self, signed: bool = False) -> QParams:
        return self._calculate_qparams(signed, self.min_val, self.max_val)

    def _calculate_qparams(self, signed: bool, min_val: Optional[Tensor] = None,
                           max_val: Optional[Tensor] = None) -> QParams:
        if min_val is not None:
            self.min_val = min_val
        if max_val is not None:
            self.max_val = max_val
        if self.min_val.numel() == 0 or self.max_val.numel() == 0:
            raise RuntimeError("bitcompile.apot.APoTObserver.calculate_qparams: no values observed yet")
        alpha = torch.maximum(-self.min_val, self.max_val).to(torch.float32).reshape(())
        return _qparams_from_alpha("APoTObserver.calculate_qparams", self.b, self.k, signed, alpha)


# ----------------------------------------------------------------------------------------------
# quantize / dequantize
# ----------------------------------------------------------------------------------------------
def _check_float(function: str, x) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"bitcompile.apot.{function}: x must be a tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"bitcompile.apot.{function}: x must be a floating point tensor, got {x.dtype}")


def _nearest_rank(x: Tensor, sorted_levels: Tensor) -> Tensor:
    """Index of the nearest of the sorted levels; halfway values go to the level nearer zero.

    x: float64, any shape; sorted_levels: [L] (shared) or [C, L] (row c for x[c]).
    """
    level64 = sorted_levels.to(torch.float64)
    midpoints = ((level64[..., 1:] + level64[..., :-1]) * 0.5).contiguous()
    if midpoints.dim() == 1:
        flat = x.contiguous()
        upper = torch.searchsorted(midpoints, flat, right=True)
        lower = torch.searchsorted(midpoints, flat, right=False)
        return torch.where(x < 0, upper, lower)
    channels = midpoints.shape[0]
    flat = x.reshape(channels, x.numel() // channels if channels else 0).contiguous()
    upper = torch.searchsorted(midpoints, flat, right=True)
    lower = torch.searchsorted(midpoints, flat, right=False)
    return torch.where(flat < 0, upper, lower).reshape(x.shape)


def _quantize_signed(x: Tensor, alpha: Tensor, bits: int, code_values: Tensor) -> Tensor:
    """int64 codes of a signed scheme of `bits` bits with table code_values (float32, on x's
    device); alpha 0-d or [C] (float32, >= 0). No input checks: callers validate."""
    magnitude_count = 2 ** (bits - 1)
    magnitudes = alpha.unsqueeze(-1) * code_values[:magnitude_count]  # the fp32 levels
    bound = _channel_view("quantize", x, alpha).to(torch.float64)
    magnitude = torch.minimum(x.to(torch.float64).abs(), bound)
    index = _nearest_rank(magnitude, magnitudes)
    negative = (x < 0) & (index > 0)
    return index | (negative.to(torch.int64) << (bits - 1))


def _quantize_with_table(x: Tensor, alpha: Tensor, sorted_levels: Tensor, level_indices: Tensor) -> Tensor:
    bound = _channel_view("quantize", x, alpha).to(torch.float64)
    clamped = torch.maximum(torch.minimum(x.to(torch.float64), bound), -bound)
    rank = _nearest_rank(clamped, sorted_levels)
    level_indices = level_indices.to(device=x.device, dtype=torch.int64)
    if level_indices.dim() == 1:
        return level_indices[rank]
    channels = level_indices.shape[0]
    flat = rank.reshape(channels, rank.numel() // channels if channels else 0)
    return torch.gather(level_indices, 1, flat).reshape(rank.shape)


def _resolve_scheme(function: str, scheme, bits, k) -> Optional[Scheme]:
    if scheme is not None:
        if bits is not None or k is not None:
            resolved = get_scheme(scheme)
            if (bits is not None and bits != resolved.bits) or (k is not None and k != resolved.k):
                raise ValueError(f"bitcompile.apot.{function}: scheme {resolved.name} does not have bits={bits}, k={k}")
            return resolved
        return get_scheme(scheme)
    if bits is not None:
        if k is None:
            raise ValueError(f"bitcompile.apot.{function}: bits={bits} needs k (the unsigned L(b, k) set), or pass scheme=")
        return unsigned_scheme(*_check_bits_k(function, bits, k))
    return None


def _finish_codes(function: str, codes: Tensor, dtype: torch.dtype) -> Tensor:
    if dtype not in _CODE_DTYPES:
        raise ValueError(f"bitcompile.apot.{function}: dtype must be one of {list(_CODE_DTYPES)}, got {dtype}")
    return codes.to(dtype)


def quantize(x: Tensor, alpha=None, gamma=None, quantization_levels: Optional[Tensor] = None,
             level_indices: Optional[Tensor] = None, *, scheme: Union[str, Scheme, None] = None,
             bits: Optional[int] = None, k: Optional[int] = None, per_channel: Optional[bool] = None,
             dtype: torch.dtype = torch.int64) -> Tensor:
    """Integer APoT codes of x (int64 by default; uint8, int16 or int32 on request).

    Three ways to name the level set:
    - the former quantize_APoT's qparams: `quantize(x, alpha, gamma, quantization_levels, level_indices)`
      (gamma is accepted and not needed);
    - `scheme=`: "apot3", "apot4", "apot5" (signed codes) or a Scheme / "L(b,k)" (unsigned codes);
    - `bits=, k=`: the unsigned L(bits, k) set.
    alpha: scalar, 0-d, or one per channel along dim 0 of x. Left out (scheme / bits forms only),
    it is max|x| per channel for signed schemes and per tensor for unsigned sets; `per_channel`
    overrides that (it is not used when alpha is given). NaN in x raises. x is clamped to [-alpha, alpha], then mapped to the nearest level, halfway
    values to the level nearer zero; unsigned sets give code 0 for every negative value.
    """
    _check_float("quantize", x)
    if bool(torch.isnan(x).any()):
        raise ValueError("bitcompile.apot.quantize: x contains NaN")
    if quantization_levels is not None or level_indices is not None:
        if quantization_levels is None or level_indices is None:
            raise ValueError("bitcompile.apot.quantize: quantization_levels and level_indices go together")
        if scheme is not None or bits is not None:
            raise ValueError("bitcompile.apot.quantize: give either qparams (levels, indices) or scheme/bits, not both")
        alpha = _as_alpha("quantize", alpha, x)
        if quantization_levels.shape[-1] != level_indices.shape[-1]:
            raise ValueError("bitcompile.apot.quantize: quantization_levels and level_indices differ in length")
        sorted_levels = quantization_levels.detach().to(device=x.device, dtype=torch.float32)
        return _finish_codes("quantize", _quantize_with_table(x, alpha, sorted_levels, level_indices), dtype)
    resolved = _resolve_scheme("quantize", scheme, bits, k)
    if resolved is None:
        raise ValueError("bitcompile.apot.quantize: name the level set: qparams, scheme= or bits= and k=")
    if alpha is None:
        alpha = _max_abs(x, resolved.signed if per_channel is None else per_channel)
    alpha = _as_alpha("quantize", alpha, x).clamp_min(0)
    if resolved.signed:
        codes = _quantize_signed(x, alpha, resolved.bits, resolved.code_values.to(x.device))
    else:
        _, by_code = _unsigned_levels_by_code(resolved.bits, resolved.k, alpha)
        sorted_levels, indices = torch.sort(by_code, dim=-1, stable=True)
        codes = _quantize_with_table(x, alpha, sorted_levels, indices)
    return _finish_codes("quantize", codes, dtype)


def _check_codes(function: str, codes, count: int) -> Tensor:
    if not isinstance(codes, Tensor) or codes.is_floating_point() or codes.is_complex() or codes.dtype == torch.bool:
        raise TypeError(f"bitcompile.apot.{function}: codes must be an integer tensor, got "
                        f"{codes.dtype if isinstance(codes, Tensor) else type(codes).__name__}")
    codes = codes.to(torch.int64)  # never index with uint8 (a mask) or narrow types
    if codes.numel():
        low, high = int(codes.min()), int(codes.max())
        if low < 0 or high >= count:
            raise ValueError(f"bitcompile.apot.{function}: codes must be in [0, {count - 1}], got values in [{low}, {high}]")
    return codes


def dequantize(codes: Tensor, alpha=None, gamma=None, quantization_levels: Optional[Tensor] = None,
               level_indices: Optional[Tensor] = None, *, scheme: Union[str, Scheme, None] = None,
               bits: Optional[int] = None, k: Optional[int] = None) -> Tensor:
    """float32 values of APoT codes; the level set is named as in `quantize` (alpha is required
    with scheme= or bits=). Signed schemes: fp32(alpha * code_values[code]); unsigned L(b, k):
    the level computed as in SPEC 2.5 (gamma * sum of terms, fp32)."""
    if quantization_levels is not None or level_indices is not None:
        if quantization_levels is None or level_indices is None:
            raise ValueError("bitcompile.apot.dequantize: quantization_levels and level_indices go together")
        if level_indices.numel() == 0 or quantization_levels.shape[-1] != level_indices.shape[-1]:
            raise ValueError("bitcompile.apot.dequantize: quantization_levels and level_indices differ in length")
        # codes run over 0 .. max(level_indices): 2**bits of them (signed sets skip "negative zero")
        count = int(level_indices.max()) + 1
        codes = _check_codes("dequantize", codes, count)
        sorted_levels = quantization_levels.detach().to(device=codes.device, dtype=torch.float32)
        indices = level_indices.to(device=codes.device, dtype=torch.int64).expand_as(sorted_levels)
        # by_code[c] = level of code c: invert the rank -> code permutation (a code no rank names: 0)
        by_code = sorted_levels.new_zeros((*sorted_levels.shape[:-1], count)).scatter_(-1, indices, sorted_levels)
        return _lookup(codes, by_code)
    resolved = _resolve_scheme("dequantize", scheme, bits, k)
    if resolved is None:
        raise ValueError("bitcompile.apot.dequantize: name the level set: qparams, scheme= or bits= and k=")
    codes = _check_codes("dequantize", codes, resolved.num_codes)
    alpha = _as_alpha("dequantize", alpha, codes).clamp_min(0)
    _channel_view("dequantize", codes, alpha)  # shape check only
    if resolved.signed:
        by_code = alpha.unsqueeze(-1) * resolved.code_values.to(codes.device)
    else:
        _, by_code = _unsigned_levels_by_code(resolved.bits, resolved.k, alpha)
    return _lookup(codes, by_code)


def _lookup(codes: Tensor, by_code: Tensor) -> Tensor:
    """by_code[codes] with a per-row table when by_code is [C, L] (row c for codes[c])."""
    if by_code.dim() == 1:
        return by_code[codes]
    channels = by_code.shape[0]
    if codes.dim() == 0 or codes.shape[0] != channels:
        raise ValueError(f"bitcompile.apot.dequantize: per-channel alpha has {channels} entries, codes have shape {tuple(codes.shape)}")
    flat = codes.reshape(channels, codes.numel() // channels if channels else 0)
    return torch.gather(by_code, 1, flat).reshape(codes.shape)


# ----------------------------------------------------------------------------------------------
# Helpers for layers and the backend
# ----------------------------------------------------------------------------------------------
def quantize_weight(weight: Tensor, scheme: Union[str, Scheme], per_channel: bool = True) -> tuple[Tensor, Tensor]:
    """(codes int64 shaped like weight, alpha float32 [out_channels] or 0-d) with alpha = max|W|
    per output channel (dim 0), or per tensor when per_channel=False."""
    _check_float("quantize_weight", weight)
    resolved = get_scheme(scheme)
    alpha = _max_abs(weight, per_channel)
    return quantize(weight.detach(), alpha, scheme=resolved), alpha


def is_on_grid(weight: Tensor, scheme: Union[str, Scheme], per_channel: bool = True) -> bool:
    """True iff every value of weight is exactly a level of the scheme with alpha = max|W| per
    output channel (or per tensor): dequantize(quantize_weight(W)) == W bit for bit."""
    if not isinstance(weight, Tensor) or not weight.is_floating_point() or weight.numel() == 0:
        return False
    weight = weight.detach()
    if not bool(torch.isfinite(weight).all()):
        return False
    resolved = get_scheme(scheme)
    codes, alpha = quantize_weight(weight, resolved, per_channel)
    values = dequantize(codes, alpha, scheme=resolved)
    return bool(torch.equal(values, weight.to(torch.float32))) and bool(
        torch.equal(values.to(weight.dtype).to(torch.float32), values)
    )
