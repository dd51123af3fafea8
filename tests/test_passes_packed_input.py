"""bitcompile.passes.packed_input: binary convs of inference graphs under inductor read activations packed in the
graph (by aten ops for inductor to fuse into their producer on CUDA, by pack_signs on CPU), with the same results
bit for bit, and only where that holds (channels_last x, ste_sign x)."""

import operator
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

import bitcompile
from bitcompile import weight_ops
from bitcompile.passes import packed_input, residual

sys.path.insert(0, os.path.dirname(__file__))
from test_backend import _fresh_dynamo  # noqa: E402,F401  (autouse: Dynamo and the counters reset around each test)
from test_passes import dynamo_graph, run, targets  # noqa: E402


class XnorBlock(nn.Module):
    """Two XNOR convs (40 channels: a partial last word; then 64) with a residual add between them, as a binary
    ResNet block; `sign` binarizes with torch.sign instead (zeros count 0: not packable)."""

    def __init__(self, sign=False):
        super().__init__()
        torch.manual_seed(5)
        self.conv1 = nn.Conv2d(40, 64, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(64, 64, 3, stride=2, padding=1, bias=False)
        self.binarize = torch.sign if sign else bitcompile.ste_sign

    def forward(self, x, skip):
        a1 = self.conv1.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(self.binarize(x), bitcompile.ste_sign(self.conv1.weight), None, 1, 1) * a1.view(1, -1, 1, 1)
        y = y + skip
        return F.conv2d(self.binarize(y), bitcompile.ste_sign(self.conv2.weight), None, 2, 1)


class XnorConvBNConv(nn.Module):
    """conv1 -> BatchNorm -> sign -> conv2 (a BNN block's first half): conv1's output is read by conv2's sign only."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(6)
        self.conv1 = nn.Conv2d(40, 48, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(48)
        self.conv2 = nn.Conv2d(48, 16, 3, padding=1, bias=False)
        with torch.no_grad():
            self.bn.running_mean.uniform_(-3, 3)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        a1 = self.conv1.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(bitcompile.ste_sign(x), bitcompile.ste_sign(self.conv1.weight), None, 1, 1) * a1.view(1, -1, 1, 1)
        y = self.bn(y)
        return F.conv2d(bitcompile.ste_sign(y), bitcompile.ste_sign(self.conv2.weight), None, 1, 1)


def _inputs(memory_format=torch.channels_last):
    x = torch.randn(2, 40, 9, 10).contiguous(memory_format=memory_format)
    skip = torch.randn(2, 64, 9, 10).contiguous(memory_format=memory_format)
    return x, skip


@pytest.fixture(autouse=True)
def _packing_alone(monkeypatch):
    """These tests are packed_input's alone: without passes/residual.py (tests/test_passes_residual.py has both)."""
    monkeypatch.setattr(residual, "add_residuals", lambda graph, fake_mode=None: 0)


def _passes(captured, inputs, pack=True, monkeypatch=None):
    """The captured graph after the passes as under inner="inductor" (without the packing when pack is False)."""
    if not pack:
        monkeypatch.setattr(packed_input, "pack_activations", lambda graph, fake_mode=None: 0)
    return run(captured, inputs, inner_inductor=True)[0]


def _fuse_packing(monkeypatch):
    """The aten form of the packing, which CUDA graphs get, in a CPU graph: the same words on either device."""
    monkeypatch.setattr(packed_input, "fuses_packing", lambda device: True)


@pytest.mark.parametrize("fused", [False, True], ids=["pack_signs", "aten"])
@torch.no_grad()
def test_packed_graph_equals_unpacked(monkeypatch, fused):
    if fused:
        _fuse_packing(monkeypatch)
    model = XnorBlock().eval()
    x, skip = _inputs()
    captured, inputs = dynamo_graph(model, x, skip)
    packed = _passes(captured, inputs)
    found = targets(packed)
    assert found.count(torch.ops.bitcompile.packed_conv2d_of_weight.default) == 2
    # x (40 channels: a partial word) and y; the CPU graph calls the kernel, the fused form has none of it
    assert found.count(torch.ops.bitcompile.pack_signs.default) == (0 if fused else 2)
    assert (torch.ops.aten.bitwise_left_shift.Tensor in found) == fused
    assert torch.ops.bitcompile.conv2d_of_weight.default not in found
    assert counters["bitcompile"]["packed_input"] == 2
    out = packed(*inputs)[0]
    assert out.is_contiguous(memory_format=torch.channels_last)
    unpacked = _passes(captured, inputs, pack=False, monkeypatch=monkeypatch)
    assert torch.equal(out, unpacked(*inputs)[0])
    assert torch.equal(out, model(x, skip))


@torch.no_grad()
def test_conv_feeding_a_conv_outputs_sign_words(monkeypatch):
    model = XnorConvBNConv().eval()
    x = torch.randn(2, 40, 9, 7).contiguous(memory_format=torch.channels_last)
    captured, inputs = dynamo_graph(model, x)
    gm = _passes(captured, inputs)
    convs = [n for n in gm.graph.nodes if n.target is torch.ops.bitcompile.packed_conv2d_of_weight.default]
    assert [n.kwargs["out_dtype"] for n in convs] == [torch.int32, torch.float32]
    assert convs[1].args[0] is convs[0]  # conv2 reads conv1's sign words: no float activation between them
    assert counters["bitcompile"]["packed_output"] == 1 and counters["bitcompile"]["batchnorm_folded"] == 1
    out = gm(*inputs)[0]
    unpacked = _passes(captured, inputs, pack=False, monkeypatch=monkeypatch)
    assert torch.equal(out, unpacked(*inputs)[0])  # fp32: the signs of the same fp32 values


class XnorResidual(XnorBlock):
    """XnorBlock whose residual sum is also an output: the activation packed for conv2 has another reader."""

    def forward(self, x, skip):
        a1 = self.conv1.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(bitcompile.ste_sign(x), bitcompile.ste_sign(self.conv1.weight), None, 1, 1) * a1.view(1, -1, 1, 1)
        y = y + skip
        return F.conv2d(bitcompile.ste_sign(y), bitcompile.ste_sign(self.conv2.weight), None, 2, 1), y


@torch.no_grad()
def test_shared_activation_keeps_channels_last(monkeypatch):
    """An activation read by the packing and by another node is pinned to its eager (channels_last) strides for
    inductor; one read by the packing alone (x here) is not. (The fused form's rule: pack_signs, an extern op,
    reads x as traced.)"""
    _fuse_packing(monkeypatch)
    model = XnorResidual().eval()
    x, skip = _inputs()
    captured, inputs = dynamo_graph(model, x, skip)
    gm = _passes(captured, inputs)
    forced = [n for n in gm.graph.nodes if n.target is torch.ops.prims.inductor_force_stride_order.default]
    assert len(forced) == 1
    assert forced[0].args[0].target in (operator.add, torch.add, torch.ops.aten.add.Tensor)  # y
    assert tuple(forced[0].args[1]) == skip.stride()
    out, y = gm(*inputs)
    unpacked = _passes(captured, inputs, pack=False, monkeypatch=monkeypatch)
    expected = unpacked(*inputs)
    assert torch.equal(out, expected[0]) and torch.equal(y, expected[1])
    assert y.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize("case", ["nchw", "torch_sign"])
@torch.no_grad()
def test_not_packed(case):
    model = XnorBlock(sign=case == "torch_sign").eval()
    x, skip = _inputs(torch.contiguous_format if case == "nchw" else torch.channels_last)
    captured, inputs = dynamo_graph(model, x, skip)
    gm = _passes(captured, inputs)
    assert torch.ops.bitcompile.packed_conv2d_of_weight.default not in targets(gm)
    assert counters["bitcompile"]["packed_input"] == 0
    out = gm(*inputs)[0]
    assert out.is_contiguous() == (case == "nchw")  # an NCHW model keeps NCHW outputs
    assert torch.equal(out, model(x, skip))


@torch.no_grad()
def test_packed_conv_of_weight_dense_fallback():
    """A torch.sign weight with an exact zero has no binary form: the dense conv on the unpacked signs."""
    weight = torch.randn(6, 40, 3, 3)
    weight[0, 0, 0, 0] = 0.0
    x = torch.randn(2, 40, 7, 5).contiguous(memory_format=torch.channels_last)
    args = ([1, 1], [1, 1], [1, 1], torch.rand(6) + 0.5, torch.randn(6))
    expected = torch.ops.bitcompile.conv2d_of_weight(x, weight, *args, weight_form="sign", x_form="ste_sign",
                                                     pad_value=-1.0)
    x_bits = bitcompile.ops.pack_signs(x.permute(0, 2, 3, 1))
    actual = torch.ops.bitcompile.packed_conv2d_of_weight(x_bits, weight, *args, weight_form="sign",
                                                          out_dtype=torch.float32, pad_value=-1.0)
    assert actual.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(actual, expected)
    signs = weight_ops.unpack_signs(x_bits, 40, torch.float32)
    assert torch.equal(signs, torch.where(x >= 0, 1.0, -1.0))


@torch.no_grad()
def test_backend_packs_under_inductor_only():
    model = XnorBlock().eval()
    x, skip = _inputs()
    expected = model(x, skip)
    out = torch.compile(model, backend="bitcompile", options={"inner": "eager"})(x, skip)
    assert counters["bitcompile"]["packed_input"] == 0 and torch.equal(out, expected)
    torch._dynamo.reset()
    out = torch.compile(model, backend="bitcompile")(x, skip)  # inner="inductor"
    assert counters["bitcompile"]["packed_input"] == 2
    # inductor rounds the residual add as eager does (fp32): the same signs, the same integers
    assert torch.equal(out, expected)
