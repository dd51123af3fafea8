"""bitcompile.passes.residual: a ResNet block's shortcut add goes into the epilogue of the packed binary conv in
front of it (inner="inductor" inference graphs), with the same results bit for bit, and only where that holds (the
conv read by the add alone; a shortcut of the conv's shape, dtype and channels_last layout)."""

import operator
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

import bitcompile
from bitcompile.passes import residual

sys.path.insert(0, os.path.dirname(__file__))
from test_backend import _fresh_dynamo  # noqa: E402,F401  (autouse: Dynamo and the counters reset around each test)
from test_passes import dynamo_graph, run, targets  # noqa: E402

bc = torch.ops.bitcompile


class BinaryBlock(nn.Module):
    """A binary ResNet basic block (as examples/bnn_resnet.py's, no ReLU): sign -> conv1 -> BN -> sign -> conv2 -> BN
    -> + shortcut, with 40 channels (a partial last word); `shortcut` picks what is added: the block's input
    ("identity"), a broadcast per-channel tensor ("broadcast"), the input in NCHW strides ("nchw"), or a downsample's
    BatchNorm of a float 1x1 conv of the input, read by the add alone ("downsample")."""

    def __init__(self, shortcut="identity", channels=40):
        super().__init__()
        torch.manual_seed(7)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1, self.bn2 = nn.BatchNorm2d(channels), nn.BatchNorm2d(channels)
        for bn in (self.bn1, self.bn2):
            with torch.no_grad():
                bn.running_mean.uniform_(-3, 3)
                bn.running_var.uniform_(0.5, 2)
        self.shortcut = shortcut
        self.channel_bias = nn.Parameter(torch.randn(1, channels, 1, 1))
        self.down = nn.Sequential(nn.Conv2d(channels, channels, 1, bias=False), nn.BatchNorm2d(channels))

    def conv(self, conv, x):
        alpha = conv.weight.abs().mean(dim=(1, 2, 3)).view(1, -1, 1, 1)
        return F.conv2d(bitcompile.ste_sign(x), bitcompile.ste_sign(conv.weight), None, 1, 1) * alpha

    def forward(self, x):
        out = self.bn2(self.conv(self.conv2, self.bn1(self.conv(self.conv1, x))))
        if self.shortcut == "broadcast":
            return out + self.channel_bias
        if self.shortcut == "nchw":
            return out + x.contiguous()
        if self.shortcut == "downsample":
            return out + self.down(x)
        return out + x


class TwoBlocks(nn.Module):
    """Two blocks in a row: the first block's sum is the second's shortcut and the input of its conv1's packing."""

    def __init__(self):
        super().__init__()
        self.first, self.second = BinaryBlock(), BinaryBlock()

    def forward(self, x):
        return self.second(self.first(x))


def _input(dtype=torch.float32):
    return torch.randn(2, 40, 9, 10).to(dtype).contiguous(memory_format=torch.channels_last)


def _fused(gm):
    return [n for n in gm.graph.nodes
            if n.target in (bc.packed_conv2d_of_weight.default, bc.packed_conv2d_of_weight_with_signs.default)
            and n.kwargs.get("residual") is not None]


def _without_pass(captured, inputs, monkeypatch):
    with monkeypatch.context() as m:
        m.setattr(residual, "add_residuals", lambda graph, fake_mode=None: 0)
        return run(captured, inputs, inner_inductor=True)[0]


@pytest.mark.parametrize("model_class", [BinaryBlock, TwoBlocks])
@torch.no_grad()
def test_shortcut_added_in_the_conv_epilogue(monkeypatch, model_class):
    model = model_class().eval()
    x = _input()
    captured, inputs = dynamo_graph(model, x)
    gm = run(captured, inputs, inner_inductor=True)[0]
    blocks = 2 if model_class is TwoBlocks else 1
    fused = _fused(gm)
    assert len(fused) == blocks and counters["bitcompile"]["residual_epilogue"] == blocks
    assert all(n.kwargs["out_dtype"] == torch.float32 for n in fused)
    # the first block's sum is packed for the second block's conv1: the fused op writes those words, no packing left
    with_signs = [n for n in fused if n.target is bc.packed_conv2d_of_weight_with_signs.default]
    assert len(with_signs) == blocks - 1 and counters["bitcompile"]["residual_signs"] == blocks - 1
    for node in with_signs:
        words = [u for u in node.users if u.args[1] == 1]
        assert len(words) == 1 and all(u.target is bc.packed_conv2d_of_weight.default for u in words[0].users)
    assert targets(gm).count(bc.pack_signs.default) == 1  # x's, for the first conv
    add_targets = {operator.add, torch.add, torch.ops.aten.add.Tensor}
    assert not add_targets & set(targets(gm))  # no add left: each went into its conv
    out = gm(*inputs)[0]
    assert out.is_contiguous(memory_format=torch.channels_last)
    # fp32: the same y plus the same shortcut, rounded once either way
    assert torch.equal(out, _without_pass(captured, inputs, monkeypatch)(*inputs)[0])
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)  # the folded BatchNorms round differently


@pytest.mark.parametrize("case", ["broadcast", "nchw", "downsample"])
@torch.no_grad()
def test_shortcut_left_to_inductor(case):
    """Not fused: a shortcut that broadcasts (not the output's shape), one in NCHW strides (the op would copy it
    every call), a downsample's BatchNorm read by the add alone (inductor computes it in the add's kernel; folded, it
    would be written and read again)."""
    model = BinaryBlock(case).eval()
    x = _input()
    captured, inputs = dynamo_graph(model, x)
    gm = run(captured, inputs, inner_inductor=True)[0]
    assert not _fused(gm) and counters["bitcompile"]["residual_epilogue"] == 0
    torch.testing.assert_close(gm(*inputs)[0], model(x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_conv_read_twice_is_not_fused():
    class Twice(BinaryBlock):
        def forward(self, x):
            out = self.conv(self.conv2, self.bn1(self.conv(self.conv1, x)))
            return out + x, out * 2

    model = Twice().eval()
    x = _input()
    captured, inputs = dynamo_graph(model, x)
    gm = run(captured, inputs, inner_inductor=True)[0]
    assert not _fused(gm) and counters["bitcompile"]["residual_epilogue"] == 0
    for actual, expected in zip(gm(*inputs), model(x)):
        torch.testing.assert_close(actual, expected, rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_compiled_block_matches_eager_with_inductor():
    """The whole backend (the passes, then inductor) on two blocks: the adds are in the convs, the result eager's."""
    model = TwoBlocks().eval()
    x = _input()
    compiled = torch.compile(model, backend="bitcompile", options={"inner": "inductor"})
    out = compiled(x)
    assert counters["bitcompile"]["residual_epilogue"] == 2
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_resnet_blocks_with_a_symbolic_batch(monkeypatch):
    """examples/bnn_resnet.py's model compiled at batch 1, then at batch 2: Dynamo compiles the second as a symbolic
    batch. The identity blocks' adds fold (layer1's two, layer2-4's second: the shortcut matched by its strides, where
    torch 2.11's channels_last contiguity test of a symbolic batch said no and none folded: bnn_resnet's binary model
    on the GPU machine, whose explain at batch 1 made its compile symbolic until explain left Dynamo's size record
    alone); the downsample blocks' are left (their BatchNorm shortcut is read by the add alone)."""
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "examples"))
    import bnn_resnet

    model = bnn_resnet.ResNet18(binary="xnor", classes=10).eval().to(memory_format=torch.channels_last)
    x = torch.randn(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)

    def compiled():
        torch._dynamo.reset()
        forward = torch.compile(model, backend="bitcompile", options={"inner": "inductor"})
        forward(x[:1])
        counters.clear()
        out = forward(x)
        assert counters["bitcompile"]["graphs"] == 1  # compiled again, for the symbolic batch
        return out

    out = compiled()
    assert counters["bitcompile"]["residual_epilogue"] == 5
    assert counters["bitcompile"]["residual_signs"] == 4  # layer4's second sum feeds the pool, not a conv
    with monkeypatch.context() as m:  # fp32: the same sums either way, so the same signs and logits
        m.setattr(residual, "add_residuals", lambda graph, fake_mode=None: 0)
        unfused = compiled()
    assert counters["bitcompile"]["residual_epilogue"] == 0 and torch.equal(out, unfused)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_fp16_blocks_cuda(monkeypatch):
    """CUDA, fp16, two blocks (the CUDA graph's aten packing of the sums): the graph with the adds in the convs
    gives the unfused graph's values bit for bit, op by op (the conv's fp16 y plus the fp16 shortcut, rounded once,
    as eager's add); compiled with inductor (which keeps fused intermediates in fp32, so a sign may differ where a
    sum rounds to zero) it stays within fp16 rounding of that almost everywhere."""
    model = TwoBlocks().eval().cuda().half()
    x = _input(torch.float16).cuda()
    captured, inputs = dynamo_graph(model, x)
    gm = run(captured, inputs, inner_inductor=True)[0]
    assert len(_fused(gm)) == 2
    fused = gm(*inputs)[0]
    assert torch.equal(fused, _without_pass(captured, inputs, monkeypatch)(*inputs)[0])
    torch._dynamo.reset()
    counters.clear()
    out = torch.compile(model, backend="bitcompile", options={"inner": "inductor"})(x)
    assert counters["bitcompile"]["residual_epilogue"] == 2
    far = ((out.float() - fused.float()).abs() > 0.05).float().mean().item()
    assert far < 0.01, f"{far:.2%} of the values differ by more than 0.05"


def test_packed_conv_of_weight_with_residual_opcheck():
    """The ops the pass emits: opcheck with a residual, the values those of the op without one plus the residual
    (fp16: y rounded, then eager's add), the _with_signs form's words those values' signs; the dense fallback of a
    weight with exact zeros the same."""
    x_bits = bitcompile.ops.pack_signs(torch.randn(2, 7, 5, 40))
    weight = torch.randn(6, 40, 3, 3)
    args = ([1, 1], [1, 1], [1, 1], torch.rand(6) + 0.5, torch.randn(6))
    for form, dtype in (("ste_sign", torch.float16), ("sign", torch.float32)):
        if form == "sign":
            weight[0, 0, 0, 0] = 0.0  # no binary form: the dense conv on the unpacked signs
        r = torch.randn(2, 6, 7, 5).to(dtype).contiguous(memory_format=torch.channels_last)
        kwargs = {"weight_form": form, "out_dtype": dtype, "pad_value": -1.0}
        torch.library.opcheck(bc.packed_conv2d_of_weight.default, (x_bits, weight, *args, None, "", r), kwargs)
        torch.library.opcheck(bc.packed_conv2d_of_weight_with_signs.default, (x_bits, weight, *args, None, "", r),
                              kwargs)
        y = bc.packed_conv2d_of_weight(x_bits, weight, *args, **kwargs)
        assert torch.equal(bc.packed_conv2d_of_weight(x_bits, weight, *args, residual=r, **kwargs), y + r)
        out, words = bc.packed_conv2d_of_weight_with_signs(x_bits, weight, *args, residual=r, **kwargs)
        assert torch.equal(out, y + r) and torch.equal(words, bitcompile.ops.pack_signs(out.permute(0, 2, 3, 1)))
