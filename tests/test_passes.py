"""Graph-level tests of bitcompile.passes: the canonical view of both IRs, what each rewrite emits,
the placeholders it must not touch, failure isolation, and bitcompile.explain."""

import copy
import logging
import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import bitcompile
from bitcompile import backend, passes
from bitcompile.passes import binary, layers

sys.path.insert(0, os.path.dirname(__file__))
from test_backend import SignCNN, SteCNN, SteMLP, XnorMLP, assert_close  # noqa: E402

OPTIONS = backend.validate_options({"inner": "eager"})


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Captured:
    """A Dynamo graph as a backend receives it. Dynamo clears the placeholders' `grapharg` meta
    (sources, real parameters) after the backend returns, so what the passes read from it is
    resolved during the call."""

    def __init__(self, gm, example_inputs):
        self.gm = backend._copy(gm)
        self.inputs = list(example_inputs)
        probe = backend.make_context(gm, example_inputs, OPTIONS, mode="backend")
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        self.fqn = {n.name: probe.fqn_of(n) for n in placeholders}
        self.real = {n.name: probe.real_value(n) for n in placeholders}
        self.training = probe.training


def dynamo_graph(model, *inputs):
    """The (first) Dynamo graph of model with its example inputs."""
    captured = []

    def capture(gm, example_inputs, **kwargs):
        captured.append(Captured(gm, example_inputs))
        return gm.forward

    torch.compile(model, backend=capture, fullgraph=True)(*inputs)
    return captured[0], captured[0].inputs


def run(captured, example_inputs, mode="backend", inner_inductor=False, **options):
    """The captured graph after the passes (inner_inductor: with the rewrites made for an inner inductor)."""
    checked = backend.validate_options({"inner": "eager", **options})
    new = backend._copy(captured.gm)
    ctx = passes.PassContext(mode=mode, training=captured.training, quantize=checked["quantize"],
                             filter=checked["filter"], skip=checked["skip"], inner_inductor=inner_inductor,
                             real_value=lambda n: captured.real.get(n.name) if n.op == "placeholder" else None,
                             fqn_of=lambda n: captured.fqn.get(n.name) if n.op == "placeholder" else None)
    passes.run_passes(new, ctx)
    return new, ctx


def targets(gm):
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def describe_all(graph):
    return [(l.kind, l.x_form, l.w_form, tuple(k for k, _, _ in l.post), l.weight_scale is not None,
             l.explicit_pad is not None) for l in layers.find_layers(graph)]


# ----------------------------------------------------------------------------------------------
# One canonical view of both IRs
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("model_and_shape", [(XnorMLP, (4, 45)), (SteCNN, (2, 3, 9, 9)), (SignCNN, (2, 4, 8, 8))],
                         ids=["xnor", "ste_cnn", "sign_cnn"])
def test_dynamo_and_aten_graphs_give_the_same_layers(model_and_shape):
    model_class, shape = model_and_shape
    model = model_class().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        gm, _ = dynamo_graph(model, x)
    ep = torch.export.export(model, (x,))
    torch_level = describe_all(gm.gm.graph)
    assert torch_level, "no layer found in the Dynamo graph"
    assert describe_all(ep.graph) == torch_level
    assert describe_all(ep.run_decompositions().graph) == torch_level


def test_xnor_pattern_is_described_fully():
    with torch.no_grad():
        gm, _ = dynamo_graph(XnorMLP(), torch.randn(3, 45))
    fc = layers.find_layers(gm.gm.graph)[0]
    assert (fc.x_form, fc.w_form, fc.weight_scale is not None) == ("ste_sign", "ste_sign", True)
    assert [k for k, _, _ in fc.post] == ["row"] and fc.post_bias is not None


# ----------------------------------------------------------------------------------------------
# What the rewrites emit
# ----------------------------------------------------------------------------------------------
def test_inference_rewrite_emits_run_time_ops_and_keeps_placeholders():
    model = XnorMLP()
    x = torch.randn(3, 45)
    with torch.no_grad():
        gm, inputs = dynamo_graph(model, x)
        new, ctx = run(gm, inputs)
    assert not ctx.training
    before = [(n.name, n.target) for n in gm.gm.graph.nodes if n.op == "placeholder"]
    after = [(n.name, n.target) for n in new.graph.nodes if n.op == "placeholder"]
    assert before == after, "placeholders must never change"
    ops_ = [n for n in new.graph.nodes if n.target == torch.ops.bitcompile.linear_of_weight.default]
    assert len(ops_) == 1
    kwargs = ops_[0].kwargs
    assert kwargs == {"weight_form": "ste_sign", "x_form": "ste_sign", "row_scale": True}
    assert ops_[0].args[3] is not None and ops_[0].args[0].op == "placeholder"  # bias folded, raw x passed
    assert torch.ops.bitcompile.ste_sign not in targets(new)  # binarizers gone
    with torch.no_grad():
        assert_close(new(*inputs)[0], model(x))


def test_training_rewrite_emits_ste_ops():
    model = SteMLP(x_clip=0.5, w_clip=1.5)
    gm, inputs = dynamo_graph(model, torch.randn(3, 37))
    new, ctx = run(gm, inputs)
    assert ctx.training
    # bitcompile's *_ste ops only (torch 2.11's graph also calls torch._C._log_api_usage_once, whose
    # repr holds "system")
    nodes = [n for n in new.graph.nodes if n.op == "call_function" and str(n.target).startswith("bitcompile.")
             and str(n.target).endswith("_ste.default")]
    assert [str(n.target) for n in nodes] == ["bitcompile.binary_weight_linear_ste.default"] + \
        ["bitcompile.binary_linear_ste.default"] * 2
    # clips differ: the binarized activation goes in (its ste_sign stays), the weight's clip is used
    for n in nodes[1:]:
        assert n.args[0].target in (torch.ops.bitcompile.ste_sign, torch.ops.bitcompile.ste_sign.default)
        assert n.kwargs["clip"] == 1.5


def test_conv_pads_symmetric_folded_asymmetric_kept():
    with torch.no_grad():
        gm, inputs = dynamo_graph(SteCNN(), torch.randn(2, 3, 9, 9))
        new, _ = run(gm, inputs)
    convs = [n for n in new.graph.nodes if n.target == torch.ops.bitcompile.conv2d_of_weight.default]
    assert [n.kwargs["pad_value"] for n in convs] == [0.0, -1.0, 0.0]
    assert [n.args[3] for n in convs] == [[1, 1], [1, 1], [1, 0]]
    with torch.no_grad():
        gm, inputs = dynamo_graph(SignCNN(), torch.randn(2, 4, 8, 8))
        new, _ = run(gm, inputs)
    convs = [n for n in new.graph.nodes if n.target == torch.ops.bitcompile.conv2d_of_weight.default]
    assert [n.kwargs["x_form"] for n in convs] == ["sign", "sign"]
    assert convs[1].args[0].target is torch._C._nn.pad and convs[1].args[3] == [0, 0]


def test_in_place_state_updates_survive_dead_code_removal():
    """BinaryLinear initializes scale_a in place on its first forward: a node nobody uses."""
    binary_layers = pytest.importorskip("bitcompile.nn.binary")
    eager = nn.Sequential(binary_layers.BinaryLinear(20, 16), nn.ReLU(), binary_layers.BinaryLinear(16, 4))
    model = copy.deepcopy(eager)
    x = torch.randn(5, 20)
    with torch.no_grad():
        out = torch.compile(model, backend="bitcompile", options={"inner": "aot_eager"})(x)
        assert_close(out, eager(x))
    assert float(model[0].scale_a.detach()) != 0.0
    assert_close(model[0].scale_a, eager[0].scale_a)


def test_a_failing_rewrite_leaves_that_layer_alone(monkeypatch, caplog):
    original = binary.rewrite_layer

    def flaky(graph, layer, plan, ctx):
        if layer.fqn == "layers.1":
            raise RuntimeError("boom")
        return original(graph, layer, plan, ctx)

    monkeypatch.setattr(binary, "rewrite_layer", flaky)
    model = SteMLP()
    x = torch.randn(4, 37)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="bitcompile"):
        out = torch.compile(model, backend="bitcompile", options={"inner": "aot_eager"})(x)
        assert_close(out, model(x))
    report = {e.name: e for e in backend.last_report}
    assert report["layers.1"].action == "skipped" and "boom" in report["layers.1"].reason
    assert report["layers.2"].action == "rewritten"
    assert "boom" in caplog.text


def test_unmatched_patterns_are_left_alone():
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(8, 8)
            self.conv = nn.Conv2d(4, 4, 3, groups=2)

        def forward(self, x, img):
            y = F.linear(bitcompile.ste_sign(x) * 2.0, bitcompile.ste_sign(self.fc.weight))  # not a binarizer output
            z = F.conv2d(F.pad(torch.sign(img), (1, 1, 1, 1), mode="reflect"), torch.sign(self.conv.weight), groups=2)
            return y, z

    model = Odd()
    x, img = torch.randn(3, 8), torch.randn(1, 4, 6, 6)
    with torch.no_grad():
        gm, inputs = dynamo_graph(model, x, img)
        new, ctx = run(gm, inputs)
        for a, b in zip(new(*inputs), model(x, img)):
            assert_close(a, b)
    # a float activation (s(x) * 2) with a binarized weight is W1A32: rewritten; the reflect pad
    # and groups=2 are not matched
    assert {e.name: e.action for e in ctx.entries} == {"fc": "rewritten", "conv": "skipped"}


class BinaryWeightCNN(nn.Module):
    """Binary-weight convs (BinaryConnect / XNOR-Net's BWN): float activations, conv2d(x, s(W)) * mean|W| per
    output channel; conv1 on the CPU kernel's table lookups (64 channels), conv2 on its dense fallback (5)."""

    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(5, 64, 3, padding=1, bias=False)
        self.conv1 = nn.Conv2d(64, 40, 3, stride=2, padding=1, bias=False)
        self.conv2 = nn.Conv2d(5, 7, 1, bias=True)

    def forward(self, x, small):
        y = self.stem(x).relu()
        alpha = self.conv1.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(y, bitcompile.ste_sign(self.conv1.weight), None, 2, 1) * alpha.view(1, -1, 1, 1)
        z = F.conv2d(small, torch.sign(self.conv2.weight), self.conv2.bias)
        return y, z


@pytest.mark.parametrize("inner_inductor", [False, True])
@torch.no_grad()
def test_binary_weight_conv_rewritten(inner_inductor):
    model = BinaryWeightCNN().eval()
    x, small = torch.randn(2, 5, 9, 11), torch.randn(3, 5, 4, 6)
    gm, inputs = dynamo_graph(model, x, small)
    new, ctx = run(gm, inputs, inner_inductor=inner_inductor)
    assert {e.name: e.op for e in ctx.entries if e.action == "rewritten"} == {
        "conv1": "binary_weight_conv2d", "conv2": "binary_weight_conv2d"}
    for actual, expected in zip(new(*inputs), model(x, small)):
        assert_close(actual, expected)
    exported = bitcompile.lower(torch.export.export(model, (x, small)))
    assert {e.name: e.op for e in exported._bitcompile_report if e.op} == {
        "conv1": "binary_weight_conv2d", "conv2": "binary_weight_conv2d"}
    assert exported.state_dict["conv1.weight_packed"].dtype == torch.int32
    assert "conv1.weight" not in exported.state_dict
    for actual, expected in zip(exported.module()(x, small), model(x, small)):
        assert_close(actual, expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_binary_weight_conv_left_dense_on_cuda():
    """On CUDA the op would dequantize the weight at every call: the graph keeps its dense conv; quantize_ and lower
    (packed storage) still use the op."""
    model = BinaryWeightCNN().eval().cuda()
    x, small = torch.randn(2, 5, 9, 11, device="cuda"), torch.randn(3, 5, 4, 6, device="cuda")
    gm, inputs = dynamo_graph(model, x, small)
    new, ctx = run(gm, inputs)
    assert {e.name: e.action for e in ctx.entries if e.name in ("conv1", "conv2")} == {
        "conv1": "skipped", "conv2": "skipped"}
    exported = bitcompile.lower(torch.export.export(model, (x, small)))
    assert {e.name: e.op for e in exported._bitcompile_report if e.op} == {
        "conv1": "binary_weight_conv2d", "conv2": "binary_weight_conv2d"}
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):  # the op's fp32 is fp32: eager's must be too
        for actual, expected in zip(exported.module()(x, small), model(x, small)):
            assert_close(actual, expected)


# ----------------------------------------------------------------------------------------------
# explain
# ----------------------------------------------------------------------------------------------
def test_explain_reports_each_layer_without_touching_the_model():
    model = nn.Sequential(SteMLP(), nn.Linear(10, 4))
    before = copy.deepcopy(model.state_dict())
    report = bitcompile.explain(model, torch.randn(2, 37))
    assert [(e.name, e.kind, e.action, e.op) for e in report.entries] == [
        ("0.layers.0", "linear", "rewritten", "binary_weight_linear_ste"),
        ("0.layers.1", "linear", "rewritten", "binary_linear_ste"),
        ("0.layers.2", "linear", "rewritten", "binary_linear_ste"),
        ("1", "linear", "skipped", None),
    ]
    text = str(report)
    assert "0.layers.1" in text and "binary_linear_ste" in text and "float weight" in text and repr(report) == text
    with torch.no_grad():
        inference = bitcompile.explain(model, torch.randn(2, 37), filter=lambda fqn, kind: fqn != "0.layers.2")
    assert [e.op for e in inference.entries] == ["binary_weight_linear", "binary_linear", None, None]
    assert inference.entries[2].reason == "filter returned False"
    for key, value in model.state_dict().items():
        assert torch.equal(value, before[key])


def test_explain_exported_program():
    model = SignCNN().eval()
    report = bitcompile.explain(torch.export.export(model, (torch.randn(1, 4, 8, 8),)))
    assert [(e.name, e.op) for e in report.entries] == [("conv1", "binary_conv2d"), ("conv2", "binary_conv2d")]


def test_backend_copy_keeps_what_aot_autograd_reads_from_dynamo():
    """Without _param_name_to_source / _dynamo_source, AOTAutograd sees no parameter among the
    inputs: no static inputs for CUDA graphs (every replay would copy every weight)."""
    import torch._functorch.aot_autograd as aot_autograd
    from torch._functorch._aot_autograd import frontend_utils

    seen = []
    original = frontend_utils._try_get_metadata_from_dynamo

    def spy(*args, **kwargs):
        result = original(*args, **kwargs)
        seen.append(list(result[1]))
        return result

    modules = [m for m in (frontend_utils, aot_autograd) if hasattr(m, "_try_get_metadata_from_dynamo")]
    for module in modules:
        module._try_get_metadata_from_dynamo = spy
    try:
        with torch.no_grad():
            torch.compile(SteMLP(), backend="bitcompile", options={"inner": "aot_eager"})(torch.randn(2, 37))
    finally:
        for module in modules:
            module._try_get_metadata_from_dynamo = original
    assert seen and len(seen[0]) == 6, seen  # the six parameters of SteMLP; x is not static
