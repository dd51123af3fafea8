"""bitcompile.lower on torch.export programs: rewrites, packed state, save/load in a fresh process."""

import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bitcompile
from bitcompile.export import lower

sys.path.insert(0, os.path.dirname(__file__))
from test_backend import SignCNN, SteCNN, SteMLP, XnorMLP, assert_close, with_zeros  # noqa: E402


def _ops(program):
    return sorted(str(n.target) for n in program.graph.nodes
                  if n.op == "call_function" and str(n.target).startswith("bitcompile.")
                  and "ste_sign" not in str(n.target))


@pytest.mark.parametrize("decomposed", [False, True], ids=["training_ir", "decomposed"])
@pytest.mark.parametrize("model_and_shape", [
    (SteMLP, (5, 37)), (XnorMLP, (5, 45)), (SteCNN, (2, 3, 9, 9)), (SignCNN, (2, 4, 8, 8)),
], ids=["ste_mlp", "xnor", "ste_cnn", "sign_cnn"])
def test_lower_matches_eager(model_and_shape, decomposed):
    model_class, shape = model_and_shape
    model = model_class().eval()
    x = with_zeros(torch.randn(*shape)) if model_class is SignCNN else torch.randn(*shape)
    ep = torch.export.export(model, (x,))
    if decomposed:
        ep = ep.run_decompositions()
    small = lower(ep)
    with torch.no_grad():
        assert_close(small.module()(x), model(x))
    report = {e.name: e for e in small._bitcompile_report}
    rewritten = [name for name, e in report.items() if e.action == "rewritten"]
    assert rewritten and len(_ops(small)) == len(rewritten)
    # the float weights of rewritten layers are gone, their packed forms are int32 buffers
    for name in rewritten:
        assert f"{name}.weight" not in small.state_dict
        assert small.state_dict[f"{name}.weight_packed"].dtype == torch.int32
    assert all(not str(n.target).startswith("bitcompile.ste_sign") for n in small.graph.nodes)


def test_lower_keeps_unmatched_layers_and_respects_skip():
    model = XnorMLP().eval()
    x = torch.randn(3, 45)
    small = lower(torch.export.export(model, (x,)), skip=["fc"])
    assert _ops(small) == []
    assert "fc.weight" in small.state_dict and "head.weight" in small.state_dict
    assert_close(small.module()(x), model(x))


def test_lower_unknown_option():
    ep = torch.export.export(SteMLP(), (torch.randn(2, 37),))
    with pytest.raises(ValueError, match="unknown option"):
        lower(ep, quantise="binary")


class Big(nn.Module):
    """Large enough that the weights dominate the saved file."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(512, 512)
        self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x, img):
        y = F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.fc1.weight), self.fc1.bias)
        z = F.conv2d(bitcompile.ste_sign(img), bitcompile.ste_sign(self.conv.weight), padding=1)
        return self.fc2(y), z.mean((2, 3))


def test_save_load_in_fresh_process_and_file_shrinks(tmp_path):
    model = Big().eval()
    x, img = torch.randn(4, 512), torch.randn(2, 64, 6, 6)
    ep = torch.export.export(model, (x, img))
    small = lower(ep)
    full_path, small_path = tmp_path / "full.pt2", tmp_path / "small.pt2"
    torch.export.save(ep, str(full_path))
    torch.export.save(small, str(small_path))
    torch.save({"x": x, "img": img, "expected": [t.detach() for t in model(x, img)]}, tmp_path / "io.pt")
    full_size, small_size = full_path.stat().st_size, small_path.stat().st_size
    print(f"saved program: {full_size} bytes float, {small_size} bytes lowered ({full_size / small_size:.1f}x smaller)")
    # fc1 and conv (1.3 MB of fp32) shrink 32x; fc2 and the biases stay float
    assert small_size < full_size / 5
    script = textwrap.dedent(f"""
        import torch, bitcompile
        program = torch.export.load({str(small_path)!r})
        data = torch.load({str(tmp_path / 'io.pt')!r})
        with torch.no_grad():
            out = program.module()(data["x"], data["img"])
        for a, b in zip(out, data["expected"]):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
        print("ops:", sorted({{str(n.target) for n in program.graph.nodes if str(n.target).startswith("bitcompile")}}))
        print("OK")
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "OK" in result.stdout and "bitcompile.binary_conv2d.default" in result.stdout


@pytest.mark.parametrize("scheme", ["binary", "binary_weight", "apot4"])
def test_lower_with_quantize_matches_quantize_(scheme):
    import copy

    quantize = pytest.importorskip("bitcompile.quantize")
    from test_backend import PlainCNN

    model = PlainCNN().eval()
    x = torch.randn(2, 3, 9, 9)
    expected = quantize.quantize_(copy.deepcopy(model), scheme)(x)
    small = lower(torch.export.export(model, (x,)), quantize=scheme)
    with torch.no_grad():
        assert_close(small.module()(x), expected)
    report = {e.name: e.action for e in small._bitcompile_report}
    assert set(report.values()) == {"rewritten"}
    assert "conv1.weight" not in small.state_dict and "fc.weight" not in small.state_dict


def test_lower_apot_grid_weights():
    from bitcompile import apot

    model = nn.Sequential(nn.Linear(40, 24), nn.ReLU(), nn.Linear(24, 6)).eval()
    with torch.no_grad():
        codes, alpha = apot.quantize_weight(model[0].weight, "apot4")
        model[0].weight.copy_(apot.dequantize(codes, alpha, scheme="apot4"))
    x = torch.randn(5, 40)
    small = lower(torch.export.export(model, (x,)))
    assert [(e.name, e.op) for e in small._bitcompile_report] == [("0", "apot_linear"), ("2", None)]
    assert small.state_dict["0.weight_packed"].dtype == torch.uint8
    with torch.no_grad():
        assert_close(small.module()(x), model(x))


def test_lower_apot_layers_drops_latent_weights():
    from test_backend import apot_model

    model = apot_model()
    x = torch.randn(2, 3, 5, 5)
    small = lower(torch.export.export(model, (x,)))
    assert [(e.name, e.op) for e in small._bitcompile_report] == [
        ("0", "apot_conv2d"), ("3", "apot_linear"), ("5", "apot_linear")]
    assert not any(k.endswith(".weight") or k.endswith(".alpha") for k in small.state_dict)
    with torch.no_grad():
        assert_close(small.module()(x), model(x))


def test_lower_dynamic_batch_save_load(tmp_path):
    model = SteCNN().eval()
    x = torch.randn(4, 3, 9, 9)
    ep = torch.export.export(model, (x,), dynamic_shapes={"x": {0: torch.export.Dim("batch", min=1, max=1024)}})
    path = tmp_path / "dynamic.pt2"
    torch.export.save(lower(ep), str(path))
    loaded = torch.export.load(str(path)).module()
    with torch.no_grad():
        for batch in (1, 3, 17):
            xb = torch.randn(batch, 3, 9, 9)
            assert_close(loaded(xb), model(xb), f"batch {batch}")
