"""Tests of bitcompile.apot (level sets, qparams, quantize/dequantize), bitcompile.compat.LinearAPoT
and bitcompile.nn.APoTLinear / APoTConv2d (SPEC.md 2.5).

The conformance vectors are tests/data/apot_vectors.json in the checkout (BITCOMPILE_TESTDATA
overrides: the file, or the directory holding it); tests read nothing outside the checkout
(tests/test_fresh_clone.py). Tests that run the APoT kernels (LinearAPoT.forward, the layers
through apot_linear / apot_conv2d) are marked `kernels` below and skip only where
csrc/cpu/apot_ops.cpp is not in the checkout.
"""

import json
import math
import os
from fractions import Fraction
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from bitcompile import apot, reference
from bitcompile.compat import LinearAPoT
from bitcompile.nn import APoTConv2d, APoTLinear
from conftest import assert_close_relative

ROOT = Path(__file__).resolve().parents[1]
SIGNED = ["apot3", "apot4", "apot5"]
# every unsigned L(b, k) with b <= 8 whose integer numerators fit int32 (k <= 5)
UNSIGNED = [(b, k) for b in range(1, 9) for k in range(1, 6) if b % k == 0]

requires_apot_kernels = pytest.mark.skipif(
    not (ROOT / "csrc" / "cpu" / "apot_ops.cpp").exists(), reason="APoT CPU kernels (csrc/cpu/apot_ops.cpp) not in this checkout"
)


def _testdata_path() -> Path:
    override = os.environ.get("BITCOMPILE_TESTDATA")
    if override:
        path = Path(override)
        return path / "apot_vectors.json" if path.is_dir() else path
    return Path(__file__).resolve().parent / "data" / "apot_vectors.json"


@pytest.fixture(scope="module")
def vectors():
    path = _testdata_path()
    assert path.exists(), f"APoT conformance vectors not found at {path} (set BITCOMPILE_TESTDATA)"
    return json.loads(path.read_text())


def _unsigned_case_ids():
    try:
        data = json.loads(_testdata_path().read_text())
        return [f"L({c['bits']},{c['k']})-alpha{c['alpha']}" for c in data["unsigned"]]
    except OSError:
        return ["missing"]


def _fp32(value: float) -> float:
    return float(torch.tensor(value, dtype=torch.float32))


# ----------------------------------------------------------------------------------------------
# Conformance vectors
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("index", range(len(_unsigned_case_ids())), ids=_unsigned_case_ids())
def test_unsigned_vectors(vectors, index):
    case = vectors["unsigned"][index]
    bits, k, alpha = case["bits"], case["k"], case["alpha"]

    # levels() alone, the function form and the observer all agree with the vectors
    assert apot.levels(bits, k, alpha=alpha).tolist() == case["levels"]
    observed = torch.tensor([alpha, -alpha / 3, alpha / 7])
    observer = apot.APoTObserver(bits, k)
    observer(observed)
    for qparams in (apot.calculate_qparams(observed, bits, k), observer.calculate_qparams(signed=False)):
        q_alpha, gamma, quantization_levels, level_indices = qparams
        assert q_alpha.item() == alpha
        assert gamma.item() == case["gamma"]
        assert gamma.dtype == torch.float32 and quantization_levels.dtype == torch.float32
        assert quantization_levels.tolist() == case["levels"]
        assert level_indices.tolist() == case["level_indices"]

    qparams = observer.calculate_qparams(signed=False)
    for dtype in (torch.float32, torch.float64):
        x = torch.tensor(case["x"], dtype=dtype)
        assert apot.quantize(x, *qparams).tolist() == case["codes"]
        assert apot.quantize(x, alpha, bits=bits, k=k).tolist() == case["codes"]
        assert apot.quantize(x, alpha, scheme=f"L({bits},{k})", dtype=torch.uint8).tolist() == case["codes"]
    codes = torch.tensor(case["codes"])
    assert apot.dequantize(codes, *qparams).tolist() == case["dequantized"]
    assert apot.dequantize(codes, alpha, bits=bits, k=k).tolist() == case["dequantized"]
    # the level of code m is the closed form of SPEC 2.5
    n = bits // k
    by_code = apot.dequantize(torch.arange(2**bits), alpha, bits=bits, k=k)
    for m in range(2**bits):
        digits = [(m >> (k * (n - 1 - i))) & (2**k - 1) for i in range(n)]
        exact = sum(2.0 ** -(i + (c - 1) * n) for i, c in enumerate(digits) if c > 0)
        assert by_code[m].item() == pytest.approx(case["gamma"] * exact, rel=1e-6, abs=1e-30)


@pytest.mark.parametrize("name", SIGNED)
def test_signed_scheme_vectors(vectors, name):
    expected = vectors["signed_schemes"][name]
    scheme = apot.SCHEMES[name]
    assert scheme.bits == expected["bits"]
    assert scheme.denominator == expected["denominator"]
    assert list(scheme.numerators) == expected["numerators"]
    assert apot.get_scheme(name) is scheme
    half = 2 ** (scheme.bits - 1)
    numerators = scheme.code_numerators
    values = scheme.code_values
    assert numerators.dtype == torch.int32 and values.dtype == torch.float32
    assert numerators.shape == values.shape == (2**scheme.bits,)
    for code in range(2**scheme.bits):
        sign = -1 if code >= half else 1
        magnitude = expected["numerators"][code % half]
        assert numerators[code].item() == sign * magnitude
        assert values[code].item() == _fp32(sign * magnitude / expected["denominator"])
    assert values[half].item() == 0.0 and numerators[half].item() == 0  # the "negative zero" code
    assert values[half - 1].item() == 1.0  # the top level is alpha
    # the sorted signed level set: negatives, one zero, positives
    alpha = 1.7
    signed_levels = apot.levels(scheme.bits, signed=True, alpha=alpha)
    magnitudes = [_fp32(_fp32(alpha) * _fp32(n / expected["denominator"])) for n in expected["numerators"]]
    assert signed_levels.tolist() == [-m for m in reversed(magnitudes[1:])] + magnitudes


def test_known_scheme_magnitudes():
    assert [v.item() for v in apot.SCHEMES["apot3"].code_values[:4]] == [0, 0.25, 0.5, 1]
    apot4 = apot.SCHEMES["apot4"].code_values[:8].tolist()
    assert apot4 == [_fp32(v) for v in (0, 0.1, 0.2, 0.3, 0.4, 0.6, 0.8, 1)]
    # apot5 is L(4,2) normalized: its numerators over D are the unsigned L(4,2) levels / alpha
    l42 = apot.levels(4, 2, alpha=1.0)
    scheme = apot.SCHEMES["apot5"]
    assert torch.allclose(l42, torch.tensor([n / scheme.denominator for n in scheme.numerators]), rtol=1e-7, atol=0)


@pytest.mark.parametrize("bits,k", UNSIGNED)
def test_unsigned_code_tables(bits, k):
    scheme = apot.unsigned_scheme(bits, k)
    assert scheme.name == f"L({bits},{k})" and not scheme.signed and scheme.k == k
    n = bits // k
    values = scheme.code_values
    numerators = scheme.code_numerators
    assert values.dtype == torch.float32 and numerators.dtype == torch.int32
    assert values.shape == numerators.shape == (2**bits,)
    # code_values[m] = level(m) / alpha: with alpha = 1 exactly the spec's fp32 level
    assert torch.equal(values, apot.dequantize(torch.arange(2**bits), 1.0, bits=bits, k=k))
    assert values.max().item() == 1.0
    total = sum(Fraction(1, 2**i) for i in range(n))
    for m in range(2**bits):
        digits = [(m >> (k * (n - 1 - i))) & (2**k - 1) for i in range(n)]
        exact = sum((Fraction(1, 2 ** (i + (c - 1) * n)) for i, c in enumerate(digits) if c > 0), Fraction(0)) / total
        assert Fraction(int(numerators[m]), scheme.denominator) == exact
        assert values[m].item() == pytest.approx(float(exact), rel=2e-7, abs=0)
    assert sorted(numerators.tolist()) == list(scheme.numerators)


def test_unsigned_tables_that_do_not_fit_int32():
    scheme = apot.unsigned_scheme(6, 6)  # 2^-62 levels: numerators beyond int32
    with pytest.raises(ValueError, match="int32"):
        scheme.code_numerators
    assert scheme.code_values.shape == (64,)


# ----------------------------------------------------------------------------------------------
# Brute-force references (independent of bitcompile.apot's midpoint search)
# ----------------------------------------------------------------------------------------------
def _brute_signed(x: torch.Tensor, alpha: torch.Tensor, scheme: apot.Scheme) -> torch.Tensor:
    """Nearest magnitude by exhaustive distance (first minimum = lower level), sign bit for x < 0."""
    half = 2 ** (scheme.bits - 1)
    table = scheme.code_values[:half]
    alpha = alpha.to(torch.float32)
    rows = x.reshape(x.shape[0], -1) if alpha.dim() else x.reshape(1, -1)
    alphas = alpha.reshape(-1) if alpha.dim() else alpha.reshape(1)
    out = []
    for row, a in zip(rows, alphas):
        magnitudes = (a * table).to(torch.float64)
        value = row.to(torch.float64).abs().clamp(max=a.item())
        index = (value.unsqueeze(-1) - magnitudes).abs().argmin(-1)
        negative = (row < 0) & (index > 0)
        out.append(index + half * negative.to(torch.int64))
    return torch.stack(out).reshape(x.shape)


def _brute_unsigned(x: torch.Tensor, alpha: float, bits: int, k: int) -> torch.Tensor:
    levels = apot.levels(bits, k, alpha=alpha).to(torch.float64)
    order = torch.sort(apot.dequantize(torch.arange(2**bits), alpha, bits=bits, k=k), stable=True).indices
    value = x.to(torch.float64).clamp(-alpha, alpha)
    rank = (value.reshape(-1, 1) - levels).abs().argmin(-1)
    return order[rank].reshape(x.shape)


def _canonical_unsigned_codes(bits: int, k: int) -> torch.Tensor:
    """Codes quantize can produce: the first code (in sorted order) of each distinct fp32 level."""
    by_code = apot.dequantize(torch.arange(2**bits), 1.0, bits=bits, k=k).tolist()
    first = {}
    for code in sorted(range(2**bits), key=lambda c: (by_code[c], c)):
        first.setdefault(by_code[code], code)
    return torch.tensor(sorted(first.values()))


def _canonical_signed_codes(scheme: apot.Scheme) -> torch.Tensor:
    half = 2 ** (scheme.bits - 1)
    return torch.tensor([c for c in range(2**scheme.bits) if c != half])


# ----------------------------------------------------------------------------------------------
# Round trips, grids, ties, clamps
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SIGNED)
def test_signed_round_trip(name):
    scheme = apot.SCHEMES[name]
    canonical = _canonical_signed_codes(scheme)
    for alpha in (1.0, 0.37, 3e-3, 250.0, torch.rand(()).item() + 0.01):
        values = apot.dequantize(canonical, alpha, scheme=name)
        assert torch.equal(apot.quantize(values, alpha, scheme=name), canonical)
    # random code tensors with a per-channel alpha (rows along dim 0), including 4-D conv weights
    for shape in ((9, 33), (4, 3, 3, 3), (1, 1)):
        codes = canonical[torch.randint(len(canonical), shape)]
        alpha = torch.rand(shape[0]) * 5 + 1e-3
        values = apot.dequantize(codes, alpha, scheme=name)
        assert torch.equal(apot.quantize(values, alpha, scheme=name), codes)
        assert torch.equal(apot.quantize(values, alpha, scheme=name, dtype=torch.uint8), codes.to(torch.uint8))
    # the negative-zero code dequantizes to 0 and quantizes back to code 0
    half = torch.tensor([2 ** (scheme.bits - 1)])
    assert apot.dequantize(half, 2.0, scheme=name).item() == 0.0
    assert apot.quantize(apot.dequantize(half, 2.0, scheme=name), 2.0, scheme=name).item() == 0


@pytest.mark.parametrize("bits,k", UNSIGNED)
def test_unsigned_round_trip(bits, k):
    canonical = _canonical_unsigned_codes(bits, k)
    for alpha in (1.0, 0.37, 250.0, torch.rand(()).item() + 0.01):
        values = apot.dequantize(canonical, alpha, bits=bits, k=k)
        assert torch.equal(apot.quantize(values, alpha, bits=bits, k=k), canonical)
        qparams = apot.calculate_qparams(torch.tensor([alpha]), bits, k)
        assert torch.equal(apot.quantize(values, *qparams), canonical)
        assert torch.equal(apot.dequantize(canonical, *qparams), values)
    # per-channel alpha along dim 0
    codes = canonical[torch.randint(len(canonical), (6, 17))]
    alpha = torch.rand(6) * 3 + 0.05
    values = apot.dequantize(codes, alpha, bits=bits, k=k)
    assert torch.equal(apot.quantize(values, alpha, bits=bits, k=k), codes)
    for row in range(6):
        assert torch.equal(values[row], apot.dequantize(codes[row], alpha[row], bits=bits, k=k))


@pytest.mark.parametrize("name", SIGNED)
@pytest.mark.parametrize("per_channel", [True, False])
def test_grid_weights_are_exact_and_recognized(name, per_channel):
    scheme = apot.SCHEMES[name]
    canonical = _canonical_signed_codes(scheme)
    top = 2 ** (scheme.bits - 1) - 1
    codes = canonical[torch.randint(len(canonical), (7, 19))]
    codes[:, 0] = top  # every row reaches alpha, so max|W| is alpha
    alpha = torch.rand(7) + 0.1 if per_channel else torch.rand(()) + 0.1
    weight = apot.dequantize(codes, alpha, scheme=name)
    if per_channel:
        weight[3] = 0.0  # an all-zero row: alpha 0, codes 0
        codes[3] = 0
    got_codes, got_alpha = apot.quantize_weight(weight, name, per_channel=per_channel)
    assert torch.equal(got_codes, codes)
    assert torch.equal(got_alpha, weight.abs().amax(1) if per_channel else weight.abs().amax())
    assert not torch.isnan(got_alpha).any()
    assert torch.equal(apot.dequantize(got_codes, got_alpha, scheme=name), weight)
    assert apot.is_on_grid(weight, name, per_channel=per_channel)
    off = weight.clone()
    off[1, 5] = torch.nextafter(off[1, 5], torch.tensor(math.inf))
    assert not apot.is_on_grid(off, name, per_channel=per_channel)
    assert not apot.is_on_grid(torch.randn(7, 19), name)
    assert not apot.is_on_grid(weight.to(torch.int32), name)


@pytest.mark.parametrize("name", SIGNED)
def test_ties_go_to_the_lower_level(name):
    scheme = apot.SCHEMES[name]
    half = 2 ** (scheme.bits - 1)
    for alpha in (1.0, 0.7):
        magnitudes = (torch.tensor(alpha, dtype=torch.float32) * scheme.code_values[:half]).to(torch.float64)
        midpoints = (magnitudes[1:] + magnitudes[:-1]) / 2  # exact in float64
        lower = torch.arange(half - 1)
        assert torch.equal(apot.quantize(midpoints, alpha, scheme=name), lower)
        negative = torch.where(lower > 0, lower + half, 0)
        assert torch.equal(apot.quantize(-midpoints, alpha, scheme=name), negative)
        # just above a midpoint goes up
        above = torch.nextafter(midpoints, torch.full_like(midpoints, math.inf))
        assert torch.equal(apot.quantize(above, alpha, scheme=name), lower + 1)
    # apot3 by hand: levels 0, 1/4, 1/2, 1
    x = torch.tensor([0.75, -0.75, 0.125, -0.125, 0.375, -0.375])
    assert apot.quantize(x, 1.0, scheme="apot3").tolist() == [2, 6, 0, 0, 1, 5]


@pytest.mark.parametrize("bits,k", [(4, 2), (4, 1), (6, 3), (8, 2)])
def test_unsigned_ties_go_to_the_lower_level(bits, k):
    for alpha in (1.0, 1.5):
        sorted_levels = apot.levels(bits, k, alpha=alpha).to(torch.float64)
        midpoints = (sorted_levels[1:] + sorted_levels[:-1]) / 2
        distinct = sorted_levels[1:] > sorted_levels[:-1]
        codes = apot.quantize(midpoints[distinct], alpha, bits=bits, k=k)
        expected = apot.quantize(sorted_levels[:-1][distinct], alpha, bits=bits, k=k)
        assert torch.equal(codes, expected)


@pytest.mark.parametrize("name", SIGNED)
def test_signed_clamp(name):
    scheme = apot.SCHEMES[name]
    top = 2 ** (scheme.bits - 1) - 1
    x = torch.tensor([5.0, 1.0001, -5.0, -1.0001, math.inf, -math.inf])
    assert apot.quantize(x, 1.0, scheme=name).tolist() == [top, top, 2 * top + 1, 2 * top + 1, top, 2 * top + 1]
    assert apot.dequantize(apot.quantize(x, 1.0, scheme=name), 1.0, scheme=name).tolist() == [1, 1, -1, -1, 1, -1]


@pytest.mark.parametrize("bits,k", [(4, 2), (6, 2), (8, 4)])
def test_unsigned_clamp_and_negatives(bits, k):
    alpha = 1.25
    top_code = int(apot.calculate_qparams(torch.tensor([alpha]), bits, k).level_indices[-1])
    big = torch.tensor([alpha, alpha * 1.5, 100.0, math.inf])
    assert apot.quantize(big, alpha, bits=bits, k=k).tolist() == [top_code] * 4
    negative = -torch.rand(100) * 3 - 1e-6
    assert (apot.quantize(negative, alpha, bits=bits, k=k) == 0).all()
    assert (apot.dequantize(apot.quantize(negative, alpha, bits=bits, k=k), alpha, bits=bits, k=k) == 0).all()


@pytest.mark.parametrize("name", SIGNED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_signed_random_against_brute_force(name, dtype):
    scheme = apot.SCHEMES[name]
    weight = (torch.randn(13, 40) * torch.rand(13, 1) * 4).to(dtype)
    codes, alpha = apot.quantize_weight(weight, name)
    assert torch.equal(alpha, weight.float().abs().amax(1))
    assert torch.equal(codes, _brute_signed(weight, alpha, scheme))
    assert not (codes == 2 ** (scheme.bits - 1)).any()  # never the negative-zero code
    # an alpha below max|W| clips; per-tensor alpha
    small = alpha * 0.6
    assert torch.equal(apot.quantize(weight, small, scheme=name), _brute_signed(weight, small, scheme))
    assert torch.equal(apot.quantize(weight, 0.5, scheme=name), _brute_signed(weight, torch.tensor(0.5), scheme))
    tensor_codes, tensor_alpha = apot.quantize_weight(weight, name, per_channel=False)
    assert tensor_alpha.dim() == 0 and tensor_alpha == weight.float().abs().max()
    assert torch.equal(tensor_codes, _brute_signed(weight, tensor_alpha, scheme))
    # default alpha of quantize with a signed scheme is per channel
    assert torch.equal(apot.quantize(weight, scheme=name), codes)
    # dequantize: alpha * code_values[code] in fp32
    values = apot.dequantize(codes, alpha, scheme=name)
    assert values.dtype == torch.float32
    assert torch.equal(values, alpha[:, None] * scheme.code_values[codes])


@pytest.mark.parametrize("bits,k", [(4, 2), (4, 1), (6, 2), (8, 2), (3, 3)])
def test_unsigned_random_against_brute_force(bits, k):
    x = torch.randn(300) * 2
    alpha = x.abs().max().item()
    assert torch.equal(apot.quantize(x, alpha, bits=bits, k=k), _brute_unsigned(x, alpha, bits, k))
    assert torch.equal(apot.quantize(x, bits=bits, k=k), _brute_unsigned(x, alpha, bits, k))  # per tensor max|x|
    assert torch.equal(apot.quantize(x, 0.3, bits=bits, k=k), _brute_unsigned(x, 0.3, bits, k))
    # per-channel qparams (2-D levels) with the original positional form
    rows = torch.rand(5, 60) * torch.rand(5, 1) * 3
    qparams = apot.calculate_qparams(rows, bits, k, per_channel=True)
    assert qparams.alpha.shape == (5,) and qparams.quantization_levels.shape == (5, 2**bits)
    codes = apot.quantize(rows, *qparams)
    for r in range(5):
        assert torch.equal(codes[r], _brute_unsigned(rows[r], qparams.alpha[r].item(), bits, k))
    assert torch.equal(apot.dequantize(codes, *qparams), apot.dequantize(codes, qparams.alpha, bits=bits, k=k))


def test_zero_alpha_gives_code_zero():
    for name in SIGNED:
        weight = torch.zeros(3, 5)
        weight[1] = torch.randn(5)
        codes, alpha = apot.quantize_weight(weight, name)
        assert (codes[0] == 0).all() and (codes[2] == 0).all() and alpha[0] == 0
        values = apot.dequantize(codes, alpha, scheme=name)
        assert torch.isfinite(values).all() and (values[0] == 0).all()
        assert (apot.quantize(torch.randn(4), 0.0, scheme=name) == 0).all()
    assert (apot.quantize(torch.rand(4), 0.0, bits=4, k=2) == 0).all()
    assert apot.calculate_qparams(torch.zeros(3), 4, 2).quantization_levels.eq(0).all()
    assert torch.isfinite(apot.levels(4, 2, alpha=0.0)).all()


def test_empty_inputs():
    assert apot.quantize(torch.empty(0), 1.0, scheme="apot4").shape == (0,)
    assert apot.quantize(torch.empty(0, 3), 1.0, bits=4, k=2).shape == (0, 3)
    assert apot.dequantize(torch.empty(0, dtype=torch.int64), 1.0, scheme="apot4").shape == (0,)


# ----------------------------------------------------------------------------------------------
# Observer and qparams
# ----------------------------------------------------------------------------------------------
def test_observer_tracks_running_min_max():
    observer = apot.APoTObserver(b=4, k=2)
    assert (observer.b, observer.k, observer.n) == (4, 2, 2)
    first, second = torch.rand(10) * 2 - 0.5, torch.rand(7) * 3 - 2.5
    assert observer(first) is first
    assert observer(torch.empty(0)).numel() == 0
    assert observer(second) is second
    both = torch.cat((first, second))
    assert observer.min_val == both.min() and observer.max_val == both.max()
    got = observer.calculate_qparams(signed=False)
    expected = apot.calculate_qparams(both, 4, 2)
    for a, b in zip(got, expected):
        assert torch.equal(a, b)
    assert got.alpha == both.abs().max()
    # min/max overrides of the original's _calculate_qparams
    override = observer._calculate_qparams(False, torch.tensor(-0.25), torch.tensor(0.125))
    assert override.alpha.item() == 0.25


def test_observer_signed_gives_the_signed_scheme():
    observer = apot.APoTObserver(b=4, k=2)
    observer(torch.tensor([-2.0, 1.0]))
    alpha, gamma, levels, indices = observer.calculate_qparams(signed=True)
    scheme = apot.SCHEMES["apot4"]
    assert alpha.item() == 2.0 and gamma.item() == pytest.approx(2.0 / scheme.denominator)
    assert torch.equal(levels, apot.levels(4, signed=True, alpha=2.0))
    assert torch.equal(apot.dequantize(indices, 2.0, scheme="apot4"), levels)  # rank -> code
    x = torch.randn(50)
    assert torch.equal(apot.quantize(x, alpha, gamma, levels, indices), apot.quantize(x, alpha, scheme="apot4"))


def test_calculate_qparams_signed_per_channel():
    weight = torch.randn(6, 10)
    alpha, gamma, levels, indices = apot.calculate_qparams(weight, 5, signed=True)
    assert torch.equal(alpha, weight.abs().amax(1))
    assert levels.shape == (6, 31) and gamma.shape == (6,)
    for row in range(6):
        assert torch.equal(levels[row], apot.levels(5, signed=True, alpha=alpha[row]))
    per_tensor = apot.calculate_qparams(weight, 5, signed=True, per_channel=False)
    assert per_tensor.alpha.dim() == 0 and per_tensor.alpha == weight.abs().max()
    qparams = apot.calculate_qparams(weight, 5, signed=True)
    codes = apot.quantize(weight, *qparams)
    assert torch.equal(codes, apot.quantize(weight, scheme="apot5"))
    assert torch.equal(apot.dequantize(codes, *qparams), apot.dequantize(codes, qparams.alpha, scheme="apot5"))


# ----------------------------------------------------------------------------------------------
# Errors
# ----------------------------------------------------------------------------------------------
def test_bad_input_errors():
    with pytest.raises(ValueError, match=r"levels.*b % k"):
        apot.levels(5, 2)
    with pytest.raises(ValueError, match="bits must be in 1..8"):
        apot.levels(12, 3)
    with pytest.raises(ValueError, match="needs k"):
        apot.levels(4)
    with pytest.raises(ValueError, match="signed APoT schemes exist for bits 3"):
        apot.levels(6, 2, signed=True)
    with pytest.raises(ValueError, match="b % k"):
        apot.APoTObserver(6, 4)
    with pytest.raises(RuntimeError, match="no values observed"):
        apot.APoTObserver(4, 2).calculate_qparams(signed=False)
    with pytest.raises(TypeError, match="floating point"):
        apot.quantize(torch.arange(4), 1.0, scheme="apot4")
    with pytest.raises(TypeError, match="floating point"):
        apot.calculate_qparams(torch.arange(4), 4, 2)
    with pytest.raises(ValueError, match="unknown APoT scheme"):
        apot.quantize(torch.rand(4), 1.0, scheme="apot7")
    with pytest.raises(ValueError, match="name the level set"):
        apot.quantize(torch.rand(4), 1.0)
    with pytest.raises(ValueError, match="needs k"):
        apot.quantize(torch.rand(4), 1.0, bits=4)
    with pytest.raises(ValueError, match="per-channel alpha has 3 entries"):
        apot.quantize(torch.rand(4, 2), torch.ones(3), scheme="apot4")
    with pytest.raises(ValueError, match=r"codes must be in \[0, 15\]"):
        apot.dequantize(torch.tensor([0, 16]), 1.0, scheme="apot4")
    with pytest.raises(ValueError, match=r"codes must be in \[0, 15\]"):
        apot.dequantize(torch.tensor([-1, 3]), 1.0, bits=4, k=2)
    with pytest.raises(TypeError, match="integer tensor"):
        apot.dequantize(torch.tensor([0.0, 1.0]), 1.0, scheme="apot4")
    with pytest.raises(ValueError, match="alpha is required"):
        apot.dequantize(torch.tensor([1]), scheme="apot4")
    with pytest.raises(ValueError, match="dtype must be one of"):
        apot.quantize(torch.rand(3), 1.0, scheme="apot4", dtype=torch.float32)
    with pytest.raises(ValueError, match="signed scheme"):
        APoTLinear(4, 4, scheme="L(4,2)")
    with pytest.raises(ValueError, match="unknown APoT scheme"):
        APoTConv2d(2, 2, 3, scheme="apot6")
    with pytest.raises(ValueError, match="2-D"):
        LinearAPoT(torch.rand(4), 4, 2)
    with pytest.raises(ValueError, match="b % k"):
        LinearAPoT(torch.rand(4, 4), 4, 3)
    with pytest.raises(ValueError, match="NaN"):
        apot.quantize(torch.tensor([0.5, math.nan]), 1.0, scheme="apot4")


# ----------------------------------------------------------------------------------------------
# LinearAPoT (compat)
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("b,k", [(4, 2), (8, 1), (6, 3), (4, 4)])
def test_linear_apot_attributes_and_caller_weight_untouched(b, k):
    weight = torch.randn(5, 9) * 3  # negative values and values beyond any alpha the original clamped
    weight.requires_grad_(True)
    before, version = weight.detach().clone(), weight._version
    layer = LinearAPoT(weight, b, k)
    assert torch.equal(weight.detach(), before) and weight._version == version
    assert (layer.b, layer.k, layer.n) == (b, k, b // k)
    observer = apot.APoTObserver(b, k)
    observer(before)
    alpha, gamma, levels, indices = observer.calculate_qparams(signed=False)
    assert torch.equal(layer.alpha, alpha) and layer.alpha == before.abs().max()
    assert torch.equal(layer.gamma, gamma)
    assert torch.equal(layer.quantization_levels, levels)
    assert torch.equal(layer.level_indices, indices)
    assert layer.weight.dtype == torch.int32 and layer.weight.shape == (5, 9)
    assert torch.equal(layer.weight, apot.quantize(before, alpha, gamma, levels, indices, dtype=torch.int32))
    assert torch.equal(layer.weight_transposed, layer.weight.t())
    assert (layer.weight[before < 0] == 0).all()  # unsigned set: negatives -> code 0
    assert torch.equal(layer.dequantized_weight(), apot.dequantize(layer.weight, alpha, bits=b, k=k))
    assert not layer.weight.requires_grad
    # the original attributes are saved; the derived tables are not
    state = layer.state_dict()
    assert set(state) == {"alpha", "gamma", "quantization_levels", "level_indices", "weight"}
    other = LinearAPoT(torch.rand(5, 9), b, k)
    other.load_state_dict(state)
    assert torch.equal(other.weight, layer.weight) and torch.equal(other.alpha, layer.alpha)


def _linear_apot_reference(layer, x):
    return x.double() @ apot.dequantize(layer.weight, *layer_qparams(layer)).double().T


def layer_qparams(layer):
    return layer.alpha, layer.gamma, layer.quantization_levels, layer.level_indices


@requires_apot_kernels
@pytest.mark.parametrize("b,k", [(4, 2), (8, 1), (8, 2), (6, 3), (3, 1)])
@pytest.mark.parametrize("in_features", [1, 31, 33])
def test_linear_apot_forward_float(b, k, in_features):
    weight = torch.rand(6, in_features) * 4 - 0.5
    layer = LinearAPoT(weight, b, k)
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.randn(7, in_features).to(dtype)
        y = layer(x)
        assert y.dtype == dtype and y.shape == (7, 6)
        assert_close_relative(y, _linear_apot_reference(layer, x), dtype, f"LinearAPoT {dtype}")
    assert torch.equal(layer.weight_packed, reference.pack_codes(layer.weight, b))
    # the original's test input: float activations with integer values, 3-D batches, an empty batch
    x = torch.randint(0, 255, (4, in_features), dtype=torch.float32)
    assert_close_relative(layer(x), _linear_apot_reference(layer, x), torch.float32)
    x3 = torch.randn(2, 3, in_features)
    assert_close_relative(layer(x3), _linear_apot_reference(layer, x3), torch.float32)
    assert layer(torch.randn(0, in_features)).shape == (0, 6)
    # an in-place change of the codes is never served from the stale packed copy
    with torch.no_grad():
        layer.weight.copy_(torch.randint(0, 2**b, layer.weight.shape, dtype=torch.int32))
    assert_close_relative(layer(x), _linear_apot_reference(layer, x), torch.float32, "after an in-place update")
    assert torch.equal(layer.weight_packed, reference.pack_codes(layer.weight, b))


@requires_apot_kernels
@pytest.mark.parametrize("b,k", [(4, 2), (8, 1), (8, 4), (6, 2)])
def test_linear_apot_forward_uint8(b, k):
    weight = torch.rand(5, 37) * 2
    layer = LinearAPoT(weight, b, k)
    q = torch.randint(0, 256, (4, 37), dtype=torch.uint8)
    scale, zero_point = 0.02, 117
    y = layer(q, scale, zero_point)
    exact = layer.alpha.double() / layer.denominator * layer.code_numerators.double()[layer.weight.long()]
    expected = (scale * (q.double() - zero_point)) @ exact.T
    assert y.dtype == torch.float32
    assert_close_relative(y, expected, torch.float32, "LinearAPoT uint8")
    # the exact levels and the fp32 levels agree to fp32 rounding
    assert_close_relative(y, (scale * (q.double() - zero_point)) @ layer.dequantized_weight().double().T, torch.float32)
    with pytest.raises(ValueError, match="scale and zero_point"):
        layer(q)


@requires_apot_kernels
@pytest.mark.skipif(not hasattr(torch, "quantize_per_tensor"), reason="this torch has no quantized tensors")
# The compat API takes quint8 activations (the former LinearAPoT's docstring); torch deprecates
# making them. This is the one test that makes one.
@pytest.mark.filterwarnings("ignore:.*quantized tensor creation functions.*deprecated")
def test_linear_apot_forward_quint8():
    layer = LinearAPoT(torch.rand(4, 12), 4, 2)
    x = torch.rand(3, 12)
    qx = torch.quantize_per_tensor(x, 0.01, 7, torch.quint8)
    expected = qx.dequantize().double() @ layer.dequantized_weight().double().T
    assert_close_relative(layer(qx), expected, torch.float32, "LinearAPoT quint8")


@requires_apot_kernels
def test_apot_paths_make_no_quantized_tensor():
    """Outside the quint8 input of the compat API nothing makes a (deprecated) quantized tensor:
    the observer, LinearAPoT on float and uint8 activations and the APoT layers run with every
    warning an error."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        observer = apot.APoTObserver(4, 2)
        observer(torch.randn(6, 9))
        observer.calculate_qparams(signed=False)
        layer = LinearAPoT(torch.rand(4, 12), 4, 2)
        layer(torch.rand(3, 12))
        layer(torch.randint(0, 256, (3, 12), dtype=torch.uint8), 0.01, 7)
        APoTLinear(12, 5, scheme="apot4")(torch.randn(2, 12))


# ----------------------------------------------------------------------------------------------
# APoTLinear / APoTConv2d against a plain-PyTorch STE reference
# ----------------------------------------------------------------------------------------------
class _ReferenceFakeQuantize(torch.autograd.Function):
    """Brute-force nearest level + the straight-through gradients of bitcompile.nn.apot."""

    @staticmethod
    def forward(ctx, weight, alpha, scheme_name):
        scheme = apot.SCHEMES[scheme_name]
        alpha32 = alpha.detach().float()
        codes = _brute_signed(weight.detach(), alpha32, scheme)
        relative = scheme.code_values[codes]
        column = alpha32.reshape(-1, *([1] * (weight.dim() - 1))) if alpha32.dim() else alpha32
        ctx.save_for_backward(weight, column, relative)
        ctx.alpha_shape = alpha.shape
        return column * relative

    @staticmethod
    def backward(ctx, grad):
        weight, column, relative = ctx.saved_tensors
        inside = (weight.abs() <= column).float()
        grad_weight = grad * inside
        slope = inside * relative + (1 - inside) * torch.sign(weight)
        per_element = grad * slope
        if len(ctx.alpha_shape) == 0:
            grad_alpha = per_element.sum()
        else:
            grad_alpha = per_element.sum(dim=tuple(range(1, weight.dim())))
        return grad_weight, grad_alpha.reshape(ctx.alpha_shape), None


def _compare_grads(layer, clone_params, got, expected):
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-6)
    for (name, p), q in zip(layer.named_parameters(), clone_params):
        assert p.grad is not None and q.grad is not None, name
        scale = q.grad.abs().max().clamp_min(1e-6)
        assert ((p.grad - q.grad).abs().max() / scale) <= 1e-5, name


@pytest.mark.parametrize("name", SIGNED)
@pytest.mark.parametrize("per_channel", [True, False])
@pytest.mark.parametrize("learn_alpha", [False, True])
def test_apot_linear_matches_reference_autograd(name, per_channel, learn_alpha):
    layer = APoTLinear(33, 9, bias=True, scheme=name, per_channel=per_channel, learn_alpha=learn_alpha)
    assert (layer.scheme, layer.per_channel, layer.learn_alpha) == (name, per_channel, learn_alpha)
    with torch.no_grad():
        layer.weight[2] = 0.0  # an all-zero row: alpha 0 there (per channel)
        if learn_alpha:  # clip some weights: alpha below max|W|
            layer.alpha.copy_(_reference_alpha_of(layer.weight, per_channel) * 0.7)
    params = [p.detach().clone().requires_grad_(True) for p in layer.parameters()]
    named = dict(zip([n for n, _ in layer.named_parameters()], params))
    x = torch.randn(5, 33, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)

    y = layer(x)
    alpha = named["alpha"] if learn_alpha else _reference_alpha_of(named["weight"].detach(), per_channel)
    y_ref = F.linear(x_ref, _ReferenceFakeQuantize.apply(named["weight"], alpha, name), named["bias"])
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    assert torch.isfinite(y).all()
    _compare_grads(layer, params, y, y_ref)
    assert torch.allclose(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)
    codes, qalpha = layer.quantized_weight()
    assert codes.dtype == torch.int64 and codes.shape == layer.weight.shape
    assert torch.equal(apot.dequantize(codes, qalpha, scheme=name), layer.fake_quantized_weight().detach())


def _reference_alpha_of(weight, per_channel):
    weight = weight.detach()
    return weight.abs().amax(dim=tuple(range(1, weight.dim()))) if per_channel else weight.abs().max()


@pytest.mark.parametrize("name", SIGNED)
@pytest.mark.parametrize("learn_alpha", [False, True])
@pytest.mark.parametrize("groups", [1, 2])
def test_apot_conv2d_matches_reference_autograd(name, learn_alpha, groups):
    layer = APoTConv2d(4, 6, 3, stride=2, padding=1, dilation=1, groups=groups, bias=True, scheme=name,
                       learn_alpha=learn_alpha)
    with torch.no_grad():
        if learn_alpha:
            layer.alpha.copy_(_reference_alpha_of(layer.weight, True) * 0.8)
    params = [p.detach().clone().requires_grad_(True) for p in layer.parameters()]
    named = dict(zip([n for n, _ in layer.named_parameters()], params))
    x = torch.randn(2, 4, 9, 7, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    y = layer(x)
    alpha = named["alpha"] if learn_alpha else _reference_alpha_of(named["weight"], True)
    w_ref = _ReferenceFakeQuantize.apply(named["weight"], alpha, name)
    y_ref = F.conv2d(x_ref, w_ref, named["bias"], stride=2, padding=1, groups=groups)
    grad = torch.randn_like(y)
    y.backward(grad)
    y_ref.backward(grad)
    _compare_grads(layer, params, y, y_ref)
    assert torch.allclose(x.grad, x_ref.grad, rtol=1e-5, atol=1e-6)


def test_apot_layers_alpha_and_state():
    layer = APoTLinear(8, 4, learn_alpha=True)
    assert isinstance(layer.alpha, torch.nn.Parameter) and layer.alpha.shape == (4,)
    assert torch.equal(layer.alpha.detach(), layer.weight.detach().abs().amax(1))
    assert "alpha" in layer.state_dict() and "code_values" not in layer.state_dict()
    layer.reset_parameters()
    assert torch.equal(layer.alpha.detach(), layer.weight.detach().abs().amax(1))
    per_tensor = APoTConv2d(3, 5, (3, 1), learn_alpha=True, per_channel=False)
    assert per_tensor.alpha.dim() == 0 and per_tensor.alpha == per_tensor.weight.detach().abs().max()
    plain = APoTLinear(8, 4)
    assert plain.alpha is None and set(plain.state_dict()) == {"weight", "bias"}
    codes, alpha = plain.quantized_weight()
    assert torch.equal(alpha, plain.weight.detach().abs().amax(1))
    assert torch.equal(codes, apot.quantize_weight(plain.weight, "apot4")[0])
    assert "scheme=apot4" in repr(plain)
    # an optimizer step changes the weight: the quantized weight follows
    plain(torch.randn(3, 8)).sum().backward()
    torch.optim.SGD(plain.parameters(), lr=0.5).step()
    assert torch.equal(plain.quantized_weight()[0], apot.quantize_weight(plain.weight, "apot4")[0])
    # the fake-quantized weight is on the grid
    assert apot.is_on_grid(plain.fake_quantized_weight().detach(), "apot4")


# torch 2.11's dynamo gave every gradient of the layer 0 here while it was a torch.autograd.Function
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_apot_linear_compiles_fullgraph(backend):
    layer = APoTLinear(16, 8, scheme="apot5", learn_alpha=True)
    with torch.no_grad():  # clip some weights: both pieces of the alpha gradient
        layer.alpha.mul_(0.8)
    x = torch.randn(4, 16)
    compiled = torch.compile(layer, backend=backend, fullgraph=True)
    y = compiled(x)
    y.sum().backward()
    grads = [p.grad.clone() for p in layer.parameters()]
    layer.zero_grad()
    y_eager = layer(x)
    y_eager.sum().backward()
    assert torch.allclose(y, y_eager, rtol=1e-6, atol=1e-6)
    for g, p in zip(grads, layer.parameters()):
        assert p.grad.abs().sum() > 0 and torch.allclose(g, p.grad, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------------------------
# The layers through the packed kernels (what the backend emits)
# ----------------------------------------------------------------------------------------------
@requires_apot_kernels
@pytest.mark.parametrize("name", SIGNED)
@pytest.mark.parametrize("in_features", [1, 33, 129])
def test_apot_linear_inference_through_apot_linear(name, in_features):
    layer = APoTLinear(in_features, 65, scheme=name)
    x = torch.randn(7, in_features)
    codes, alpha = layer.quantized_weight()
    scheme = apot.SCHEMES[name]
    packed = torch.ops.bitcompile.pack_codes(codes, scheme.bits)
    assert torch.equal(packed, reference.pack_codes(codes, scheme.bits))
    y = torch.ops.bitcompile.apot_linear(x, packed, in_features, scheme.bits, scheme.code_values, alpha, layer.bias)
    with torch.no_grad():
        assert_close_relative(y, layer(x), torch.float32, f"APoTLinear {name} via apot_linear")
    # integer activations: exact sums with the scheme's numerators
    q = torch.randint(0, 256, (3, in_features), dtype=torch.uint8)
    y_int = torch.ops.bitcompile.apot_linear_int(
        q, torch.tensor(0.05), torch.tensor(128), packed, in_features, scheme.bits, scheme.code_numerators,
        float(scheme.denominator), alpha, None,
    )
    weight = apot.dequantize(codes, alpha, scheme=name).double()
    assert_close_relative(y_int, (0.05 * (q.double() - 128)) @ weight.T, torch.float32, f"{name} via apot_linear_int")


@requires_apot_kernels
@pytest.mark.parametrize("name", SIGNED)
def test_apot_conv2d_inference_through_apot_conv2d(name):
    layer = APoTConv2d(5, 7, 3, stride=1, padding=1, scheme=name)
    x = torch.randn(2, 5, 8, 6)
    codes, alpha = layer.quantized_weight()
    scheme = apot.SCHEMES[name]
    packed = torch.ops.bitcompile.pack_codes(codes.permute(0, 2, 3, 1).reshape(7, -1), scheme.bits)
    y = torch.ops.bitcompile.apot_conv2d(x, packed, 5, [3, 3], [1, 1], [1, 1], [1, 1], scheme.bits,
                                         scheme.code_values, alpha, layer.bias)
    with torch.no_grad():
        assert_close_relative(y, layer(x), torch.float32, f"APoTConv2d {name} via apot_conv2d")
