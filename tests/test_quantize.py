"""bitcompile.quantize_: each converted layer against a float64 reference of the quantized math.

References (from the caller's float weight W, per output row / channel):
- binary:        y = (s(x) @ s(W).T) * mean|W| + b       (conv: zero padding of s(x))
- binary_weight: y = x @ (s(W) * mean|W|).T + b
- apotN:         y = x @ (alpha * code_values[code]).T + b, codes/alpha from
                 bitcompile.apot.quantize_weight (alpha = max|W|), each code checked to be a
                 nearest level of W.
Each quantized layer is checked on the input it actually received inside the model (forward
hooks), so errors do not compound through layers.
"""

import copy
import io

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import bitcompile
from bitcompile.quantize import (
    SCHEMES,
    QuantizedConv2d,
    QuantizedLinear,
    convert_conv2d_weight,
    convert_linear_weight,
    quantize_,
)
from conftest import assert_close_relative

APOT = ("apot3", "apot4", "apot5")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 3, padding=1)
        self.conv2 = nn.Conv2d(6, 8, (3, 2), stride=2, dilation=(1, 2), bias=False)
        self.grouped = nn.Conv2d(8, 8, 1, groups=2)  # not supported: always left alone
        self.fc = nn.Linear(8 * 4 * 3, 37)
        self.head = nn.Linear(37, 5)

    def forward(self, x):
        x = self.grouped(self.conv2(self.conv1(x)))
        return self.head(self.fc(x.flatten(1)))


def signs64(t):
    return torch.where(t >= 0, 1.0, -1.0).to(torch.float64)


def apot_reference_weight(rows, scheme):
    """alpha * code_values[code] for W viewed as rows, float64, after checking that every code is a
    nearest level of W (the quantization SPEC 2.5 asks for)."""
    resolved = bitcompile.apot.get_scheme(scheme)
    codes, alpha = bitcompile.apot.quantize_weight(rows, scheme, per_channel=True)
    values = resolved.code_values.to(torch.float64)
    alpha = alpha.to(torch.float64).reshape(-1, 1)
    dequantized = values[codes] * alpha
    assert torch.allclose(alpha.reshape(-1), rows.detach().abs().amax(1).double())
    all_levels = values.reshape(1, 1, -1) * alpha.reshape(-1, 1, 1)
    best = (rows.detach().double().unsqueeze(-1) - all_levels).abs().amin(-1)
    assert torch.all((rows.detach().double() - dequantized).abs() <= best + 1e-6 * alpha), "not a nearest level"
    return dequantized


def reference_linear(x, linear, scheme):
    w = linear.weight.detach().double()
    b = None if linear.bias is None else linear.bias.detach().double()
    x64 = x.double()
    if scheme == "binary":
        out = (signs64(x64) @ signs64(w).T) * w.abs().mean(1)
    elif scheme == "binary_weight":
        out = x64 @ (signs64(w) * w.abs().mean(1, keepdim=True)).T
    else:
        out = x64 @ apot_reference_weight(linear.weight, scheme).T
    return out if b is None else out + b


def reference_conv(x, conv, scheme):
    w = conv.weight.detach().double()
    b = None if conv.bias is None else conv.bias.detach().double()
    geometry = dict(stride=conv.stride, padding=conv.padding, dilation=conv.dilation)
    if scheme == "binary":
        # zero padding of the +-1 signs: a padded position contributes 0
        return F.conv2d(signs64(x.double()), signs64(w) * w.abs().mean((1, 2, 3), keepdim=True), b, **geometry)
    if scheme == "binary_weight":
        return F.conv2d(x.double(), signs64(w) * w.abs().mean((1, 2, 3), keepdim=True), b, **geometry)
    oc, c, kh, kw = w.shape
    rows = conv.weight.detach().permute(0, 2, 3, 1).reshape(oc, -1)
    dequantized = apot_reference_weight(rows, scheme).reshape(oc, kh, kw, c).permute(0, 3, 1, 2)
    return F.conv2d(x.double(), dequantized, b, **geometry)


def capture_io(model):
    seen = {}
    handles = [
        module.register_forward_hook(lambda m, args, out, name=name: seen.__setitem__(name, (args[0], out)))
        for name, module in model.named_modules()
        if isinstance(module, (QuantizedLinear, QuantizedConv2d))
    ]
    return seen, handles


@pytest.mark.parametrize("scheme", SCHEMES)
def test_quantized_layers_match_reference(scheme):
    model = Net()
    original = copy.deepcopy(model)
    calls = []

    def keep_head_float(fqn, kind):
        calls.append((fqn, kind))
        return fqn != "head"

    assert quantize_(model, scheme, filter=keep_head_float) is model
    # The filter sees every supported layer with torchao's (fqn, kind); grouped convs never reach it.
    assert sorted(calls) == [("conv1", "conv2d"), ("conv2", "conv2d"), ("fc", "linear"), ("head", "linear")]
    assert isinstance(model.conv1, QuantizedConv2d) and isinstance(model.conv2, QuantizedConv2d)
    assert isinstance(model.fc, QuantizedLinear)
    assert type(model.head) is nn.Linear and type(model.grouped) is nn.Conv2d
    assert model.fc.scheme == scheme and f"scheme={scheme}" in repr(model.fc)

    seen, handles = capture_io(model)
    x = torch.randn(2, 3, 9, 8)
    with torch.no_grad():
        out = model(x)
    for handle in handles:
        handle.remove()
    assert set(seen) == {"conv1", "conv2", "fc"}
    for name, reference in (("conv1", reference_conv), ("conv2", reference_conv), ("fc", reference_linear)):
        layer_input, layer_output = seen[name]
        expected = reference(layer_input, getattr(original, name), scheme)
        assert layer_output.dtype == torch.float32
        assert_close_relative(layer_output, expected, torch.float32, f"{scheme} {name}")
        if scheme == "binary":  # the +-1 dot products are exact integers
            float_layer = getattr(original, name)
            w = float_layer.weight.detach().double()
            alpha = w.abs().mean(tuple(range(1, w.dim())))
            bias = 0 if float_layer.bias is None else float_layer.bias.detach().double()
            if w.dim() == 4:
                alpha, bias = alpha.view(1, -1, 1, 1), (bias.view(1, -1, 1, 1) if torch.is_tensor(bias) else 0)
            dots = (layer_output.double() - bias) / alpha
            assert torch.allclose(dots, torch.round(dots), atol=1e-3), f"{name}: integer part not exact"
            assert torch.equal(torch.round(dots), torch.round((expected - bias) / alpha))
    # The float head is untouched and runs on the quantized fc's output.
    assert torch.allclose(out, original.head(seen["fc"][1]))


def test_default_filter_and_skips():
    model = Net()
    quantize_(model, "binary")
    assert isinstance(model.head, QuantizedLinear) and isinstance(model.fc, QuantizedLinear)
    assert type(model.grouped) is nn.Conv2d  # groups=2: skipped silently

    odd = nn.Sequential(nn.Conv2d(4, 4, 3, padding=1, padding_mode="reflect"), nn.Conv2d(4, 4, 2, padding="same"),
                        nn.Conv2d(4, 4, 3, padding="same"), nn.MultiheadAttention(8, 2))
    quantize_(odd, "apot4")
    assert type(odd[0]) is nn.Conv2d  # reflect padding
    assert type(odd[1]) is nn.Conv2d  # "same" with an even kernel pads one side more
    assert isinstance(odd[2], QuantizedConv2d) and odd[2].padding == (1, 1)
    assert type(odd[3].out_proj) is not QuantizedLinear  # MultiheadAttention reads out_proj.weight

    # A bare layer cannot be replaced in place: the converted layer is returned.
    assert isinstance(quantize_(nn.Linear(8, 3), "binary_weight"), QuantizedLinear)
    with pytest.raises(ValueError, match="unknown scheme"):
        quantize_(Net(), "ternary")
    with pytest.raises(TypeError, match="filter"):
        quantize_(Net(), "binary", filter="fc")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_state_dict_holds_packed_weights_and_shrinks(scheme):
    model = nn.Sequential(nn.Linear(1024, 512), nn.Conv2d(64, 64, 3, padding=1))
    weights = [model[0].weight, model[1].weight]

    def saved_bytes(m):
        buffer = io.BytesIO()
        torch.save(m.state_dict(), buffer)
        return buffer.getbuffer().nbytes

    before = saved_bytes(model)
    quantize_(model, scheme)
    after = saved_bytes(model)
    state = model.state_dict()
    assert "0.weight" not in state and "1.weight" not in state
    packed_dtype = torch.int32 if scheme in ("binary", "binary_weight") else torch.uint8
    assert state["0.w_packed"].dtype == packed_dtype and state["1.w_packed"].dtype == packed_dtype
    # The caller's float weights are not kept anywhere in the new modules.
    pointers = {t.data_ptr() for t in model.state_dict().values()}
    assert all(w.data_ptr() not in pointers for w in weights)
    ratio = before / after
    print(f"{scheme}: state dict {before} -> {after} bytes, {ratio:.1f}x smaller")
    # 32 signs an int32 word; APoT: two codes a byte up to 4 bits, one a byte above (plus scales).
    minimum = {"binary": 20, "binary_weight": 20, "apot3": 6, "apot4": 6, "apot5": 3.5}[scheme]
    assert ratio >= minimum


@pytest.mark.parametrize("scheme", SCHEMES)
def test_compiled_quantized_model_matches_eager(scheme):
    torch._dynamo.reset()
    model = Net()
    quantize_(model, scheme)
    compiled = torch.compile(model, backend="aot_eager", fullgraph=True)
    with torch.no_grad():
        for batch in (2, 3):
            x = torch.randn(batch, 3, 9, 8)
            assert_close_relative(compiled(x), model(x), torch.float32, f"{scheme} compiled")


@pytest.mark.parametrize("scheme", SCHEMES)
def test_conversion_functions_match_modules(scheme):
    """The backend's entry points give exactly the buffers quantize_ stores."""
    linear, conv = nn.Linear(45, 7), nn.Conv2d(5, 4, (3, 2))
    parts = convert_linear_weight(linear.weight, scheme)
    assert parts["scheme"] == scheme and parts["kind"] == "linear"
    assert (parts["in_features"], parts["out_features"]) == (45, 7)
    module = QuantizedLinear.from_float(linear, scheme)
    assert torch.equal(parts["packed"], module.w_packed)
    conv_parts = convert_conv2d_weight(conv.weight, scheme)
    assert conv_parts["kind"] == "conv2d" and conv_parts["kernel_size"] == (3, 2)
    if scheme in ("binary", "binary_weight"):
        assert parts["packed"].shape == (7, 2) and parts["bits"] == 1
        assert torch.equal(parts["scale"], linear.weight.detach().abs().mean(1))
        assert conv_parts["packed"].shape == (4, 3, 2, 1)
        assert torch.equal(conv_parts["packed"], bitcompile.ops.pack_signs(conv.weight.detach().permute(0, 2, 3, 1)))
    else:
        resolved = bitcompile.apot.get_scheme(scheme)
        assert parts["bits"] == resolved.bits and parts["denominator"] == resolved.denominator
        assert torch.equal(parts["code_values"], resolved.code_values)
        assert torch.equal(parts["code_numerators"], resolved.code_numerators)
        assert parts["alpha"].shape == (7,) and parts["packed"].dtype == torch.uint8
        assert conv_parts["packed"].shape[0] == 4
    with pytest.raises(ValueError, match="2-D"):
        convert_linear_weight(conv.weight, scheme)


def test_binary_weight_conv_rebuilds_weight_from_packed_buffer():
    conv = nn.Conv2d(40, 3, 3, padding=1)
    quantized = QuantizedConv2d.from_float(conv, "binary_weight")
    w = conv.weight.detach()
    expected = torch.where(w >= 0, 1.0, -1.0) * w.abs().mean((1, 2, 3), keepdim=True)
    assert torch.equal(quantized.dequantized_weight(), expected)
