"""bitcompile.nn.BinaryLinear / BinaryConv2d against a plain-PyTorch reference of the same formulas.

The reference below is written from the formulas of bitcompile/nn/binary.py's docstring
(bitorch-engine's forward and gradients), with ordinary autograd and detach tricks, in float64:
    x~ = x + bias_a,  y = (s(x~) @ s(W).T) * scale_a * mean|W| [+ bias]
    grad_x~ = (g @ s(W)) * mean|W| * (|x~| <= scale_a)
    grad_scale_a = sum(grad_x~ * sign(x~)) / sqrt(numel(x~))
    grad_W = dL/ds(W) * (|W| <= weight_clip)
"""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

import bitcompile
from bitcompile.nn import BinaryConv2d, BinaryLinear
from conftest import assert_close_relative


# ----------------------------------------------------------------------------------------------
# Reference (float64, plain autograd)
# ----------------------------------------------------------------------------------------------
def ref_signs(t):
    return torch.where(t >= 0, 1.0, -1.0).to(t.dtype)


def ref_activation_binarizer(x_shifted, scale_a):
    """Forward s(x~); backward grad / scale_a inside |x~| <= scale_a, and for scale_a
    sum(grad_x~ * sign(x~)) / sqrt(numel)."""
    frozen_scale = scale_a.detach()
    window = (x_shifted.detach().abs() <= frozen_scale).to(x_shifted.dtype)
    through = x_shifted * window / frozen_scale  # derivative window / scale_a, value unused
    scale_slope = window * torch.sign(x_shifted.detach()) / (frozen_scale * math.sqrt(x_shifted.numel()))
    return (ref_signs(x_shifted).detach() + (through - through.detach())
            + (scale_a - frozen_scale) * scale_slope)


def ref_weight_binarizer(weight, clip):
    through = weight * (weight.detach().abs() <= clip).to(weight.dtype)
    return ref_signs(weight).detach() + (through - through.detach())


def ref_output_scale(scale_a, weight):
    return scale_a.detach() * weight.detach().abs().mean()


def ref_params(layer):
    """float64 leaf copies of the layer's parameters, by name."""
    return {name: p.detach().to(torch.float64).clone().requires_grad_(True) for name, p in layer.named_parameters()}


def ref_binary_linear(x, p, weight_clip=1.0):
    x_signs = ref_activation_binarizer(x + p["bias_a"], p["scale_a"])
    out = F.linear(x_signs, ref_weight_binarizer(p["weight"], weight_clip)) * ref_output_scale(p["scale_a"], p["weight"])
    return out + p["bias"] if "bias" in p else out


def ref_binary_conv2d(x, p, stride, padding, dilation, pad_value, weight_clip=1.0):
    x_signs = ref_activation_binarizer(x + p["bias_a"].view(1, -1, 1, 1), p["scale_a"])
    x_signs = F.pad(x_signs, (padding[1], padding[1], padding[0], padding[0]), value=pad_value)
    out = F.conv2d(x_signs, ref_weight_binarizer(p["weight"], weight_clip), None, stride, 0, dilation)
    out = out * ref_output_scale(p["scale_a"], p["weight"])
    return out + p["bias"].view(1, -1, 1, 1) if "bias" in p else out


def randomize(layer):
    """Nonzero bias_a (and bias), and a few weights outside the STE window |W| <= 1."""
    with torch.no_grad():
        layer.bias_a.normal_(0, 0.3)
        if layer.bias is not None:
            layer.bias.normal_()
        flat = layer.weight.view(-1)
        flat[: max(1, flat.numel() // 10)] *= 1.0 / flat[: max(1, flat.numel() // 10)].abs().clamp_min(1e-3)
        flat[: max(1, flat.numel() // 20)] *= 1.5  # now |W| = 1.5 > weight_clip
    return layer


def assert_scale_a_grad_close(actual, expected, grad_x_shifted, what):
    """grad_scale_a is a sum of +-grad_x~ terms that cancel: measure the error against the size of
    the terms, sum|grad_x~| / sqrt(numel), not against the (possibly tiny) sum itself."""
    size = grad_x_shifted.detach().double().abs().sum() / math.sqrt(grad_x_shifted.numel())
    error = (actual.detach().double() - expected.detach().double()).abs()
    assert error <= 1e-5 * size, f"{what}: grad of scale_a off by {error:.3g}, terms of size {size:.3g}"


def check_grads(layer, p, x, x64, what):
    for name, param in layer.named_parameters():
        assert param.grad is not None, f"{what}: {name} got no gradient"
        if name == "scale_a":
            assert_scale_a_grad_close(param.grad, p[name].grad, x64.grad, what)
        elif name == "bias_a":
            # A sum of x's gradient over the batch (and pixels): a few terms can cancel, so the error is
            # measured against the root of the summed squared terms (conftest's magnitude), not the sum.
            terms = x64.grad.movedim(1, -1) if x64.dim() == 4 else x64.grad
            magnitude = terms.reshape(-1, terms.shape[-1]).pow(2).sum(0).sqrt()
            assert_close_relative(param.grad, p[name].grad, torch.float32, f"{what}: grad of {name}", magnitude)
        else:
            assert_close_relative(param.grad, p[name].grad, torch.float32, f"{what}: grad of {name}")
    assert_close_relative(x.grad, x64.grad, torch.float32, f"{what}: grad of x")


# ----------------------------------------------------------------------------------------------
# The op
# ----------------------------------------------------------------------------------------------
def test_ste_sign_scaled_op():
    x = torch.randn(7, 33)
    x[0, 0] = 0.0
    scale = torch.tensor(0.9)
    out = torch.ops.bitcompile.ste_sign_scaled(x, scale)
    assert torch.equal(out, torch.where(x >= 0, 1.0, -1.0)) and out[0, 0] == 1.0
    torch.library.opcheck(torch.ops.bitcompile.ste_sign_scaled.default, (x, scale))
    torch.library.opcheck(torch.ops.bitcompile.ste_sign_scaled.default,
                          (x.clone().requires_grad_(), scale.clone().requires_grad_()))
    xg, sg = x.clone().requires_grad_(), scale.clone().requires_grad_()
    grad = torch.randn_like(x)
    torch.ops.bitcompile.ste_sign_scaled(xg, sg).backward(grad)
    expected_x = grad / scale * (x.abs() <= scale)
    assert torch.allclose(xg.grad, expected_x)
    assert torch.allclose(sg.grad, (expected_x * torch.sign(x)).sum() / math.sqrt(x.numel()))
    with pytest.raises(RuntimeError, match="ste_sign_scaled: scale must have one element"):
        torch.ops.bitcompile.ste_sign_scaled(torch.empty(2, 3, device="meta"), torch.ones(3, device="meta"))


# ----------------------------------------------------------------------------------------------
# BinaryLinear
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(5, 1), (4, 33), (2, 3, 70)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_forward_and_grads_match_reference(shape, bias):
    layer = randomize(BinaryLinear(shape[-1], 9, bias=bias))
    x = torch.randn(shape, requires_grad=True)
    out = layer(x)
    p = ref_params(layer)
    x64 = x.detach().double().requires_grad_(True)
    expected = ref_binary_linear(x64, p)
    assert out.dtype == torch.float32 and out.shape == (*shape[:-1], 9)
    assert_close_relative(out, expected, torch.float32, "BinaryLinear forward")
    # The integer part is exact: y / (scale_a * mean|W|) is the +-1 dot product.
    scale = layer.scale_a.item() * layer.weight.detach().abs().mean().item()
    dot = ref_signs(x64.detach() + p["bias_a"].detach()) @ ref_signs(p["weight"].detach()).T
    base = out.detach().double() - (p["bias"].detach() if bias else 0)
    assert torch.equal(torch.round(base / scale), dot)

    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad.double())
    check_grads(layer, p, x, x64, "BinaryLinear")


def test_linear_grads_are_bitorch_formulas():
    """The reference's gradients, spelled out as bitorch-engine writes them (BinaryLinearForward.backward)."""
    layer = randomize(BinaryLinear(40, 6))
    x = torch.randn(8, 40, requires_grad=True)
    layer(x).backward(grad := torch.randn(8, 6))
    with torch.no_grad():
        x_shifted = x + layer.bias_a
        scale_w = layer.weight.abs().mean()
        window = (x_shifted.abs() <= layer.scale_a).float()
        grad_x = grad @ (ref_signs(layer.weight) * scale_w) * window
        grad_scale_a = (grad_x * torch.sign(x_shifted)).sum() / math.sqrt(x_shifted.numel())
        grad_w = (grad.T @ ref_signs(x_shifted)) * layer.scale_a * scale_w * (layer.weight.abs() <= 1.0)
    assert 0 < window.sum() < window.numel(), "the test needs values on both sides of the window"
    assert_close_relative(x.grad, grad_x, torch.float32, "grad_x")
    assert_close_relative(layer.bias_a.grad, grad_x.sum(0), torch.float32, "grad_bias_a")
    assert_scale_a_grad_close(layer.scale_a.grad, grad_scale_a, grad_x, "bitorch formulas")
    assert_close_relative(layer.weight.grad, grad_w, torch.float32, "grad_W")


@pytest.mark.parametrize("symmetric, factor", [(True, 2.0), (False, 4.0)])
def test_scale_a_set_on_first_forward(symmetric, factor):
    layer = BinaryLinear(16, 4, symmetric=symmetric)
    with torch.no_grad():
        layer.bias_a.fill_(5.0)  # scale_a comes from x before the shift
    assert layer.scale_a.item() == 0.0
    x = torch.randn(6, 16) * 3
    layer(x)
    assert torch.allclose(layer.scale_a.detach(), factor * x.abs().mean())
    first = layer.scale_a.detach().clone()
    layer(torch.randn(6, 16) * 10)
    assert torch.equal(layer.scale_a.detach(), first), "scale_a must only be set once"
    # A loaded nonzero scale_a is kept; a loaded zero one is set by the next forward.
    fresh = BinaryLinear(16, 4, symmetric=symmetric)
    fresh(torch.randn(3, 16))
    fresh.load_state_dict(layer.state_dict())
    fresh(torch.randn(3, 16) * 7)
    assert torch.equal(fresh.scale_a.detach(), first)
    fresh.load_state_dict(BinaryLinear(16, 4, symmetric=symmetric).state_dict())
    x2 = torch.randn(3, 16)
    fresh(x2)
    assert torch.allclose(fresh.scale_a.detach(), factor * x2.abs().mean())
    fresh.reset_scale_a()
    fresh(x)
    assert torch.allclose(fresh.scale_a.detach(), factor * x.abs().mean())
    # An empty batch does not set it (the mean of nothing is nan).
    empty = BinaryLinear(16, 4)
    assert empty(torch.randn(0, 16)).shape == (0, 4) and empty.scale_a.item() == 0.0


def test_state_dict_and_repr():
    layer = BinaryLinear(8, 3, bias=True)
    assert set(layer.state_dict()) == {"weight", "bias", "bias_a", "scale_a"}
    assert "symmetric=True" in repr(layer)
    conv = BinaryConv2d(4, 2, 3)
    assert set(conv.state_dict()) == {"weight", "bias_a", "scale_a"}
    with pytest.raises(ValueError, match="pad_value"):
        BinaryConv2d(4, 2, 3, pad_value=0.5)


# ----------------------------------------------------------------------------------------------
# BinaryConv2d
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "in_channels, kernel_size, stride, padding, dilation, pad_value, bias",
    [
        (3, 3, 1, 1, 1, -1.0, False),
        (35, (3, 2), (2, 1), (1, 2), (1, 2), -1.0, True),
        (5, 3, 2, 1, 1, 0.0, False),
        (4, 1, 1, 0, 1, -1.0, True),
        (6, 3, 1, 2, 2, 1.0, False),
    ],
)
def test_conv_forward_and_grads_match_reference(in_channels, kernel_size, stride, padding, dilation, pad_value, bias):
    layer = randomize(BinaryConv2d(in_channels, 7, kernel_size, stride, padding, dilation, bias=bias,
                                   pad_value=pad_value))
    x = torch.randn(2, in_channels, 9, 8, requires_grad=True)
    out = layer(x)
    p = ref_params(layer)
    x64 = x.detach().double().requires_grad_(True)
    expected = ref_binary_conv2d(x64, p, layer.stride, layer.padding, layer.dilation, pad_value)
    assert_close_relative(out, expected, torch.float32, "BinaryConv2d forward")
    assert torch.allclose(layer.scale_a.detach(), 2 * x.detach().abs().mean())
    grad = torch.randn_like(out)
    out.backward(grad)
    expected.backward(grad.double())
    check_grads(layer, p, x, x64, "BinaryConv2d")


# ----------------------------------------------------------------------------------------------
# The packed form (what the backend lowers to) gives the layer's output
# ----------------------------------------------------------------------------------------------
def test_quantized_parts_reproduce_forward():
    linear = randomize(BinaryLinear(45, 10, bias=True)).eval()
    x = torch.randn(6, 45)
    expected = linear(x)
    parts = linear.quantized_parts()
    assert parts["packed"].dtype == torch.int32 and parts["packed"].shape == (10, 2)
    out = bitcompile.ops.binary_linear(x + parts["bias_a"], parts["packed"], parts["in_features"], parts["scale"],
                                       parts["bias"])
    assert_close_relative(out, expected, torch.float32, "BinaryLinear packed form")

    conv = randomize(BinaryConv2d(5, 4, 3, stride=2, padding=1, bias=True)).eval()
    x = torch.randn(2, 5, 7, 7)
    expected = conv(x)
    parts = conv.quantized_parts()
    out = bitcompile.ops.binary_conv2d(x + parts["bias_a"].view(1, -1, 1, 1), parts["packed"], parts["in_channels"],
                                       parts["kernel_size"], parts["stride"], parts["padding"], parts["dilation"],
                                       parts["scale"], parts["bias"], pad_value=parts["pad_value"])
    assert_close_relative(out, expected, torch.float32, "BinaryConv2d packed form")


# ----------------------------------------------------------------------------------------------
# torch.compile
# ----------------------------------------------------------------------------------------------
class SmallBNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = BinaryConv2d(3, 8, 3, padding=1)
        self.conv2 = BinaryConv2d(8, 8, 3, stride=2, padding=1, bias=True)
        self.fc = BinaryLinear(8 * 4 * 4, 10, bias=True)
        # conv2 and fc see the previous binary layer's output, integers times one scale, and their
        # scale_a starts at 2 * mean|x| of it: with bias_a = 0 some seeds (1175, 1271 with
        # torch.manual_seed before SmallBNN()) put ~20 of fc's inputs at |x~| = scale_a to the last
        # bit, where fp32 rounding (eager vs inductor) decides whether they lie inside the STE
        # window: the gradients then differed by 15-25%. A random bias_a moves x~ off that lattice.
        with torch.no_grad():
            for layer in (self.conv, self.conv2, self.fc):
                layer.bias_a.normal_(0, 0.1)

    def forward(self, x):
        x = self.conv2(self.conv(x))
        return self.fc(x.flatten(1))


def run_step(model, call, x):
    """Forward through `call` (model or its compiled form), backward; returns the output and the
    gradients of model's parameters by name."""
    model.zero_grad()
    out = call(x)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return out.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def compare_compiled(backend):
    eager = SmallBNN()
    compiled_model = copy.deepcopy(eager)  # scale_a still 0: the first compiled call sets it
    graphs = []

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    if backend == "counting":
        compiled = torch.compile(compiled_model, backend=counting, fullgraph=True)
    else:
        compiled = torch.compile(compiled_model, backend=backend, fullgraph=True)
    for step, batch in enumerate((4, 4, 3)):
        x = torch.randn(batch, 3, 8, 8)
        out_e, grads_e = run_step(eager, eager, x)
        out_c, grads_c = run_step(compiled_model, compiled, x)
        assert_close_relative(out_c, out_e, torch.float32, f"{backend}: output")
        for name in grads_e:
            if name.endswith("scale_a") and step == 0:
                # On the first call each model sets its own scale_a (below: equal to fp32 rounding); an input within
                # that rounding of the STE window's edge |x~| = scale_a is inside it in one model only, and moves
                # this cancelling sum by O(1) of itself (seed 22807209: 0.625). Compared from the second call, on
                # the same scale_a.
                continue
            # scale_a's gradient is a sum whose terms cancel; another summation order (inductor)
            # moves it by more than 1e-5 of itself, a wrong formula by O(1).
            tolerance = 1e-3 if name.endswith("scale_a") else 1e-5
            error = (grads_c[name] - grads_e[name]).norm() / grads_e[name].norm().clamp_min(1e-30)
            assert error <= tolerance, f"{backend}: grad of {name} (call {step}): relative error {error:.3g}"
        for (name, p_e), p_c in zip(eager.named_parameters(), compiled_model.parameters()):
            if name.endswith("scale_a"):
                # inductor may sum the mean (of inputs that are themselves rounded differently)
                # in another order: fp32 rounding only
                assert torch.allclose(p_e, p_c, rtol=1e-5, atol=0), f"{backend}: {name} initialized differently"
                with torch.no_grad():
                    p_c.copy_(p_e)  # the same windows from here on
    return graphs


def test_aot_eager_matches_eager():
    torch._dynamo.reset()
    compare_compiled("aot_eager")


def test_compiled_graph_shape_and_one_recompile():
    """What the backend's passes see, and the one-time recompile after scale_a's initialization."""
    torch._dynamo.reset()
    graphs = compare_compiled("counting")
    # call 1: graph with the init; call 2: the flag flipped, recompiled without it; call 3: batch 3
    # may add a dynamic-shape graph but never another init graph.
    assert 2 <= len(graphs) <= 3
    with_init = [g for g in graphs if any(n.target == torch.where for n in g.graph.nodes)]
    assert len(with_init) == 1 and with_init[0] is graphs[0]
    targets = [n.target for n in graphs[-1].graph.nodes]
    assert targets.count(torch.ops.bitcompile.ste_sign_scaled) == 3
    assert targets.count(torch.ops.bitcompile.ste_sign) == 3
    assert torch.where not in targets


@pytest.mark.slow
def test_inductor_matches_eager():
    torch._dynamo.reset()
    compare_compiled("inductor")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_layers(dtype):
    """Layers converted with .to(dtype) run and agree with their fp32 originals (bias_a = 0 and
    inputs exact in dtype, so the signs are the same; only the scales round)."""
    linear, conv = BinaryLinear(40, 6, bias=True), BinaryConv2d(5, 4, 3, padding=1)
    x_linear = torch.randn(3, 40).to(dtype)
    x_conv = torch.randn(2, 5, 6, 6).to(dtype)
    for layer, x in ((linear, x_linear), (conv, x_conv)):
        layer(x.float())  # sets scale_a in fp32
        half = copy.deepcopy(layer).to(dtype)
        xh = x.clone().requires_grad_(True)
        out = half(xh)
        assert out.dtype == dtype
        assert_close_relative(out, layer(x.float()), dtype, f"{type(layer).__name__} {dtype}")
        out.sum().backward()
        assert xh.grad.dtype == dtype and half.scale_a.grad.dtype == dtype
