"""bitcompile.passes.batchnorm: an eval BatchNorm folded into the epilogue of the bitcompile op in front of it,
only where it may be (inference graphs, inner="inductor", the op's output read by the BatchNorm alone), with the
BatchNorm's result up to fp32 rounding."""

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

import bitcompile

sys.path.insert(0, os.path.dirname(__file__))
from test_backend import _fresh_dynamo  # noqa: E402,F401  (autouse: Dynamo and the counters reset around each test)
from test_passes import dynamo_graph, run, targets  # noqa: E402


def _random_statistics(bn: nn.modules.batchnorm._BatchNorm, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        bn.running_mean.copy_(torch.rand(bn.num_features, generator=g) * 4 - 2)
        bn.running_var.copy_(torch.rand(bn.num_features, generator=g) * 3 + 0.2)
        if bn.affine:
            bn.weight.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)
            bn.bias.copy_(torch.rand(bn.num_features, generator=g) * 2 - 1)


class XnorConvBN(nn.Module):
    """XNOR-Net conv (alpha = mean|W| per output channel, optional conv bias) then BatchNorm2d; `tap`
    also returns the conv output (a second reader: nothing to fold)."""

    def __init__(self, bias=False, affine=True, tap=False, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(24, 40, 3, padding=1, bias=bias)
        self.bn = nn.BatchNorm2d(40, affine=affine, eps=1e-3)
        _random_statistics(self.bn, seed)
        self.tap = tap

    def forward(self, x):
        alpha = self.conv.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(bitcompile.ste_sign(x), bitcompile.ste_sign(self.conv.weight), None, 1, 1)
        y = y * alpha.view(1, -1, 1, 1)
        if self.conv.bias is not None:
            y = y + self.conv.bias.view(1, -1, 1, 1)
        z = self.bn(y)
        return (z, y) if self.tap else z


class BinaryLinearBN(nn.Module):
    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.fc = nn.Linear(70, 33, bias=False)
        self.bn = nn.BatchNorm1d(33)
        _random_statistics(self.bn, seed)

    def forward(self, x):
        return self.bn(F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.fc.weight)))


class TorchBatchNormCall(nn.Module):
    """torch.batch_norm (the aten-style argument order) with weight and bias None."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.fc = nn.Linear(40, 20, bias=False)
        self.register_buffer("mean", torch.randn(20))
        self.register_buffer("var", torch.rand(20) + 0.5)

    def forward(self, x):
        y = F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.fc.weight))
        return torch.batch_norm(y, None, None, self.mean, self.var, False, 0.1, 1e-5, False)


def _refold(captured, inputs):
    """The captured graph after the passes as under inner="inductor"."""
    return run(captured, inputs, inner_inductor=True)[0]


def _batch_norms(gm):
    return [t for t in targets(gm) if t in (F.batch_norm, torch.batch_norm)]


@pytest.mark.parametrize("case", ["conv", "conv_bias", "conv_bias_no_affine", "linear_bn1d", "torch_batch_norm"])
@torch.no_grad()
def test_batchnorm_folded(case):
    model, x = {
        "conv": lambda: (XnorConvBN(seed=2), torch.randn(3, 24, 11, 9)),
        "conv_bias": lambda: (XnorConvBN(bias=True, seed=3), torch.randn(3, 24, 11, 9)),
        "conv_bias_no_affine": lambda: (XnorConvBN(bias=True, affine=False, seed=1), torch.randn(2, 24, 5, 13)),
        "linear_bn1d": lambda: (BinaryLinearBN(), torch.randn(17, 70)),
        "torch_batch_norm": lambda: (TorchBatchNormCall(), torch.randn(6, 40)),
    }[case]()
    model.eval()
    captured, inputs = dynamo_graph(model, x)
    gm = _refold(captured, inputs)
    assert _batch_norms(gm) == []
    assert counters["bitcompile"]["batchnorm_folded"] == 1
    torch.testing.assert_close(gm(*inputs)[0], model(x), rtol=1e-5, atol=1e-5)


@torch.no_grad()
def test_not_folded_where_the_output_has_another_reader_or_bn_trains():
    x = torch.randn(2, 24, 7, 7)
    tapped = XnorConvBN(tap=True).eval()
    captured, inputs = dynamo_graph(tapped, x)
    gm = _refold(captured, inputs)
    assert len(_batch_norms(gm)) == 1  # the conv output is also returned: the BatchNorm stays
    z, y = gm(*inputs)
    torch.testing.assert_close(z, tapped(x)[0], rtol=1e-5, atol=1e-5)

    training_bn = XnorConvBN().train()  # batch statistics (and running-stat updates): not an affine map
    torch._dynamo.reset()
    captured, inputs = dynamo_graph(training_bn, x)
    assert len(_batch_norms(_refold(captured, inputs))) == 1
    assert counters["bitcompile"]["batchnorm_folded"] == 0


def test_not_folded_in_training_graphs():
    model = XnorConvBN().eval()  # eval BatchNorm, but a training graph (grad on, parameters need grad)
    x = torch.randn(2, 24, 7, 7)
    captured, inputs = dynamo_graph(model, x)
    assert captured.training
    gm = _refold(captured, inputs)
    assert len(_batch_norms(gm)) == 1
    assert counters["bitcompile"]["batchnorm_folded"] == 0


@torch.no_grad()
def test_backend_folds_under_inductor_only():
    model = XnorConvBN(bias=True).eval()
    x = torch.randn(2, 24, 8, 8)
    expected = model(x)
    for inner in ("eager", "aot_eager"):
        torch._dynamo.reset()
        out = torch.compile(model, backend="bitcompile", options={"inner": inner})(x)
        assert torch.equal(out, expected), inner  # eager numerics, bit for bit
        assert counters["bitcompile"]["batchnorm_folded"] == 0, inner
    torch._dynamo.reset()
    out = torch.compile(model, backend="bitcompile")(x)  # inner="inductor"
    assert counters["bitcompile"]["batchnorm_folded"] == 1
    assert counters["bitcompile"]["binary_conv2d"] >= 1
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
