"""bitcompile.explain lists every layer that runs on a bitcompile op: quantize_'d modules (action
"quantized", their op and scheme) and layers inside modules compiled by the backend (issue 12,
finding 3: after quantize_ it printed "0 of 1 layers rewritten" and listed only lm_head)."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import bitcompile
from bitcompile.quantize import quantize_


class SmallCNN(torch.nn.Module):
    """resnet-like: a stem conv, a block of two convs, a classifier."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, 16, 3, padding=1)
        self.block = torch.nn.Sequential(torch.nn.Conv2d(16, 32, 3, padding=1), torch.nn.ReLU(),
                                         torch.nn.Conv2d(32, 32, 3, padding=1, bias=False))
        self.fc = torch.nn.Linear(32, 10)
        self.head = torch.nn.Linear(10, 4)

    def forward(self, x):
        h = self.block(torch.relu(self.stem(x)))
        return self.head(self.fc(h.mean((2, 3))))


class BitcompileOpsRun(TorchDispatchMode):
    """Records which torch.ops.bitcompile ops a forward really calls."""

    def __init__(self):
        super().__init__()
        self.ops = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        namespace, _, name = func._schema.name.partition("::")
        if namespace == "bitcompile":
            self.ops.add(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("scheme", ["binary", "binary_weight", "apot4"])
def test_explain_lists_quantized_modules(scheme):
    model = SmallCNN()
    quantize_(model, scheme, filter=lambda fqn, kind: fqn != "head")
    x = torch.randn(2, 3, 8, 8)
    report = bitcompile.explain(model, x)

    converted = {name: m for name, m in model.named_modules() if type(m).__name__.startswith("Quantized")}
    assert len(converted) == 4
    quantized = {e.name: e for e in report.entries if e.action == "quantized"}
    assert set(quantized) == set(converted), str(report)
    for name, entry in quantized.items():
        assert entry.kind == converted[name].kind
        assert entry.scheme == scheme and scheme in entry.reason
    assert [e.name for e in report.entries] == ["stem", "block.0", "block.2", "fc", "head"], "module order"
    assert [e.action for e in report.entries if e.name == "head"] == ["skipped"]
    assert report.quantized == list(quantized.values())
    assert f"{len(converted)} of {len(converted) + 1} layers rewritten or quantized" in str(report)

    # the ops the report names are the ops the layers run on
    with torch.no_grad(), BitcompileOpsRun() as run:
        model(x)
    reported = {e.op for e in quantized.values()}
    assert reported and reported <= run.ops, (reported, run.ops)


def test_explain_quantized_llama():
    """The report's model: 2 Llama layers of 7 linears each, quantize_'d, lm_head left float."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    quantize_(model, "binary_weight", filter=lambda fqn, kind: "lm_head" not in fqn)
    report = bitcompile.explain(model, torch.randint(0, 256, (2, 12)))
    assert len(report.quantized) == 14, str(report)
    assert {e.op for e in report.quantized} == {"binary_weight_linear"}
    assert [e.name for e in report.skipped] == ["lm_head"]


class BinaryBlock(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(64, 64)

    def forward(self, x):
        return F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.fc.weight))


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = BinaryBlock()
        self.head = torch.nn.Linear(64, 4)

    def forward(self, x):
        return self.head(self.block(x))


@pytest.mark.parametrize("compiled", ["submodule", "model"])
def test_explain_sees_inside_compiled_modules(compiled):
    options = {"inner": "aot_eager"}
    net = Net()
    if compiled == "submodule":
        net.block = torch.compile(net.block, backend="bitcompile", options=options)
    else:
        net = torch.compile(net, backend="bitcompile", options=options)
    report = bitcompile.explain(net, torch.randn(3, 64))
    assert [(e.name, e.action, e.op) for e in report.entries] == [
        ("block.fc", "rewritten", "binary_linear_ste"), ("head", "skipped", None)], str(report)


def test_explain_leaves_later_compiles_static():
    """explain at one batch size, then torch.compile at another: the compile is specialized to its own sizes, as
    without the explain (Dynamo would otherwise remember the explain's sizes and compile a symbolic batch)."""
    seen = []

    def recording(gm, inputs, **unused):
        seen.append([i for i in inputs if isinstance(i, torch.SymInt)])
        return gm.forward

    model = SmallCNN()
    bitcompile.explain(model, torch.randn(1, 3, 8, 8))
    torch.compile(model, backend=recording)(torch.randn(4, 3, 8, 8))
    assert seen == [[]], f"symbolic sizes after explain: {seen}"
