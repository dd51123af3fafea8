"""bitcompile.passes.epilogue_params: a scale / bias computed from parameters only (XNOR-Net's alpha, a folded
BatchNorm) moves into the run-time op, which computes it once per version of those parameters: the same results,
no per-forward computation, and an in-place update of any of them is seen at the next call."""

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

import bitcompile
from bitcompile import weight_ops

sys.path.insert(0, os.path.dirname(__file__))
from test_backend import _fresh_dynamo  # noqa: E402,F401  (autouse: Dynamo and the counters reset around each test)
from test_passes_batchnorm import BinaryLinearBN, XnorConvBN, _random_statistics  # noqa: E402


class TwoXnorConvs(nn.Module):
    """conv -> BatchNorm -> conv: the first conv's output read only by the second's sign (packed_conv2d_of_weight
    with sign-word output), the second with its BatchNorm (a float output)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.a, self.b = XnorConvBN(seed=1), XnorConvBN(seed=2)
        self.b.conv = nn.Conv2d(40, 40, 3, padding=1, bias=False)
        self.b.bn = nn.BatchNorm2d(40, eps=1e-3)
        _random_statistics(self.b.bn, 5)

    def forward(self, x):
        return self.b(self.a(x))


def _compiled(model):
    return torch.compile(model, backend="bitcompile")


@torch.no_grad()
@pytest.mark.parametrize("case", ["conv", "conv_bias", "two_convs", "linear"])
def test_epilogue_moves_into_the_op_and_matches_eager(case):
    model, x = {
        "conv": (XnorConvBN(), torch.randn(2, 24, 9, 11)),
        "conv_bias": (XnorConvBN(bias=True), torch.randn(2, 24, 9, 11)),
        "two_convs": (TwoXnorConvs(), torch.randn(2, 24, 9, 11)),
        "linear": (BinaryLinearBN(), torch.randn(5, 70)),
    }[case]
    model.eval()
    compiled = _compiled(model)
    out = compiled(x)
    expected = model(x)
    layers = 2 if case == "two_convs" else 1
    assert counters["bitcompile"]["epilogue_cached"] == layers
    assert counters["bitcompile"]["batchnorm_folded"] == layers
    if case != "two_convs":  # a second binary layer turns last-bit differences into sign flips
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-4)
    computed = weight_ops.weight_cache.conversions
    for _ in range(3):
        compiled(x)
    assert weight_ops.weight_cache.conversions == computed, "the epilogue was computed again for unchanged parameters"


@torch.no_grad()
@pytest.mark.parametrize("update", ["running_var", "bn_weight", "conv_weight"])
def test_epilogue_follows_in_place_updates(update):
    model = XnorConvBN().eval()
    x = torch.randn(2, 24, 9, 11)
    compiled = _compiled(model)
    compiled(x)
    target = {"running_var": model.bn.running_var, "bn_weight": model.bn.weight, "conv_weight": model.conv.weight}
    target[update].mul_(2.5)  # alpha = mean|W| follows the weight; BatchNorm's g its statistics and gamma
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert counters["bitcompile"]["epilogue_cached"] == 1, "recompiled instead of computing the values again"


def test_epilogue_only_with_inductor_and_parameters():
    """inner="eager" keeps the graph's own math (the exact-equality runs); a scale that reads a run-time input
    (a row scale of x) stays in the graph."""
    model = XnorConvBN().eval()
    x = torch.randn(2, 24, 9, 11)
    with torch.no_grad():
        torch.compile(model, backend="bitcompile", options={"inner": "eager"})(x)
    assert counters["bitcompile"]["epilogue_cached"] == 0

    class RowScaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 16, bias=False)

        def forward(self, x):
            alpha = self.fc.weight.abs().mean(1)
            y = F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.fc.weight))
            return y * alpha * x.abs().mean(-1, True)

    model, x = RowScaled(), torch.randn(3, 64)
    with torch.no_grad():
        torch.testing.assert_close(_compiled(model)(x), model(x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_plain_parameter_bias_stays_an_argument():
    """A bias that is a parameter as it is (nothing computed) is passed to the op as before: no cache lookup."""

    class SignLinear(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 16)

        def forward(self, x):
            return F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.fc.weight), self.fc.bias)

    model, x = SignLinear(), torch.randn(3, 64)
    torch.testing.assert_close(_compiled(model)(x), model(x), rtol=1e-4, atol=1e-4)
    assert counters["bitcompile"]["epilogue_cached"] == 0


def test_epilogue_op_arguments_checked():
    x, w = torch.randn(1, 8, 5, 5), torch.randn(4, 8, 3, 3)
    with pytest.raises(RuntimeError, match="conv2d_of_weight.*not registered"):
        torch.ops.bitcompile.conv2d_of_weight(x, w, [1, 1], [1, 1], [1, 1], None, None, [w], "no-such-function",
                                              weight_form="ste_sign", x_form="ste_sign")
    with pytest.raises(RuntimeError, match="conv2d_of_weight.*scale and bias must be None"):  # eager, as fake
        torch.ops.bitcompile.conv2d_of_weight(x, w, [1, 1], [1, 1], [1, 1], torch.ones(4), None, [w],
                                              _registered_epilogue(), weight_form="ste_sign", x_form="ste_sign")
    with torch._subclasses.FakeTensorMode():
        fx_, fw = torch.empty(1, 8, 5, 5), torch.empty(4, 8, 3, 3)
        with pytest.raises(RuntimeError, match="conv2d_of_weight.*scale and bias must be None"):
            torch.ops.bitcompile.conv2d_of_weight(fx_, fw, [1, 1], [1, 1], [1, 1], torch.empty(4), None, [fw], "key",
                                                  weight_form="ste_sign", x_form="ste_sign")


def _registered_epilogue():
    """A registered (alpha, bn) -> (scale, bias) function, as the pass registers one."""

    class Epilogue(nn.Module):
        def forward(self, weight, gamma, shift):
            return weight.abs().flatten(1).mean(1) * gamma, shift * 2

    return weight_ops.register_weight_function(torch.fx.symbolic_trace(Epilogue()))


@pytest.mark.parametrize("op", ["linear_of_weight", "conv2d_of_weight", "packed_conv2d_of_weight"])
def test_epilogue_ops_opcheck_and_match_explicit_scale(op):
    key = _registered_epilogue()
    if op == "linear_of_weight":
        x, w = torch.randn(5, 37), torch.randn(11, 37)
        head, kwargs = (x, w), {"weight_form": "ste_sign", "x_form": "ste_sign"}
    else:
        x, w = torch.randn(2, 40, 7, 7), torch.randn(6, 40, 3, 3)
        geometry = ([1, 2], [1, 1], [1, 1])
        if op == "packed_conv2d_of_weight":
            head = (torch.ops.bitcompile.pack_signs(x.permute(0, 2, 3, 1)), w, *geometry)
            kwargs = {"weight_form": "ste_sign", "out_dtype": torch.float32, "pad_value": -1.0}
        else:
            head, kwargs = (x, w, *geometry), {"weight_form": "ste_sign", "x_form": "ste_sign", "pad_value": -1.0}
    gamma, shift = torch.rand(w.shape[0]), torch.randn(w.shape[0])
    target = getattr(torch.ops.bitcompile, op)
    args = head + (None, None, [w, gamma, shift], key)
    torch.library.opcheck(target.default, args, kwargs)
    alpha = w.abs().mean(dim=tuple(range(1, w.dim())))
    torch.testing.assert_close(target(*args, **kwargs), target(*head, alpha * gamma, shift * 2, **kwargs))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_cuda_epilogue_under_reduce_overhead():
    """CUDA graphs: the values are computed at the first call (cudagraph warm-up) and the replays read them."""
    model = TwoXnorConvs().cuda().eval()
    x = torch.randn(2, 24, 9, 11, device="cuda")
    compiled = torch.compile(model, backend="bitcompile", mode="reduce-overhead")
    for _ in range(4):  # warm-up, record, replays
        out = compiled(x)
    assert counters["bitcompile"]["epilogue_cached"] == 2
    computed = weight_ops.weight_cache.conversions
    for _ in range(3):
        out = compiled(x)
    torch.cuda.synchronize()
    assert weight_ops.weight_cache.conversions == computed
    torch.testing.assert_close(out.clone(), torch.compile(model, backend="bitcompile")(x), rtol=1e-4, atol=1e-4)
