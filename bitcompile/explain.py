"""bitcompile.explain: which Linear/Conv2d layers the backend would rewrite, into what, and why not.

    report = bitcompile.explain(model, x)                  # options as torch.compile's options=
    print(report)                                          # a table
    [e.name for e in report.entries if e.action == "rewritten"]

It captures the model with Dynamo (as torch.compile would, in the current grad mode: with grad
enabled and trainable parameters you see the training graph's STE ops, under torch.no_grad() the
inference ops) and runs the passes in a recording mode that decides but rewrites nothing. The
captured graphs run on a copy of the model, so the model's own state (a first-forward
initialization, say) is left alone; only layers that already call bitcompile ops (quantize_'d
modules) run a bitcompile kernel.
Every layer that runs on a bitcompile op is in the report: the layers the passes find, and the
modules bitcompile.quantize_ converted (action "quantized", their op and scheme), which reach
the graph as bitcompile op calls rather than Linear/Conv2d. Modules compiled with torch.compile
(the model itself or a submodule) are explained from their original module, under their plain
names.
An ExportedProgram can be explained too: that reports what bitcompile.lower would do.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # the passes load on first use: `import bitcompile` stays light
    from bitcompile.passes.context import Entry

_COLUMNS = ("name", "kind", "action", "op", "reason")


class Report:
    """One entry per Linear/Conv2d found (name, kind, action, op, reason); prints as a table."""

    def __init__(self, entries: list, graphs: int, graph_kind: str):
        self.entries: "list[Entry]" = entries
        self.graphs = graphs
        self.graph_kind = graph_kind

    @property
    def rewritten(self) -> list:
        return [e for e in self.entries if e.action == "rewritten"]

    @property
    def skipped(self) -> list:
        return [e for e in self.entries if e.action == "skipped"]

    @property
    def quantized(self) -> list:
        return [e for e in self.entries if e.action == "quantized"]

    def __str__(self) -> str:
        rows = [[str(getattr(e, c)) if getattr(e, c) is not None else "-" for c in _COLUMNS] for e in self.entries]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(_COLUMNS)]

        def line(cells):
            return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

        graphs = f"{self.graph_kind}, {self.graphs} graph{'s' if self.graphs != 1 else ''}"
        if self.quantized:
            done = len(self.rewritten) + len(self.quantized)
            title = (f"bitcompile: {done} of {len(self.entries)} layers rewritten or quantized "
                     f"({len(self.rewritten)} rewritten, {len(self.quantized)} quantized by quantize_; {graphs})")
        else:
            title = f"bitcompile: {len(self.rewritten)} of {len(self.entries)} layers rewritten ({graphs})"
        lines = [title,
                 line(_COLUMNS), line("-" * w for w in widths)]
        lines += [line(r) for r in rows]
        return "\n".join(lines)

    __repr__ = __str__


def explain(model, *example_inputs: Any, **options) -> Report:
    """What torch.compile(model, backend="bitcompile", options=options) would rewrite, without
    running any bitcompile kernel. `model` may also be a torch.export ExportedProgram."""
    from torch.export import ExportedProgram

    if isinstance(model, ExportedProgram):
        return _explain_exported(model, options)
    from bitcompile import backend, passes

    checked = backend.validate_options(options)
    entries: list = []
    kinds: list = []

    def recording_backend(gm, inputs, **unused):
        ctx = backend.make_context(gm, inputs, checked, mode="record")
        passes.run_passes(gm, ctx)
        entries.extend(ctx.entries)
        kinds.append("training" if ctx.training else "inference")
        return gm.forward

    subject = _uncompiled_copy(model) if isinstance(model, torch.nn.Module) else model
    _compile_without_shape_history(subject, recording_backend, example_inputs)
    graph_kind = " + ".join(sorted(set(kinds))) + " graph" if kinds else "no graph"
    if isinstance(subject, torch.nn.Module):
        entries = _with_quantized_modules(subject, entries)
    return Report(entries, len(kinds), graph_kind)


def _compile_without_shape_history(subject, compiler, example_inputs) -> None:
    """Run subject compiled with `compiler`, leaving Dynamo's automatic-dynamic record of the code's input sizes as
    it was. The copy shares the model's forward code, and Dynamo remembers the sizes each code was compiled for: a
    later torch.compile of the model at another batch size would otherwise compile a symbolic batch (less
    specialized kernels; on torch 2.11 such fake tensors also fail the channels_last contiguity test the passes
    see). The record is torch._dynamo.pgo's code state; where a torch lacks it, nothing is restored."""
    try:
        from torch._dynamo import pgo

        state = pgo.get_code_state()
        saved = copy.deepcopy(dict(state))
    except Exception:
        state = None
    try:
        torch.compile(subject, backend=compiler)(*example_inputs)
    finally:
        if state is not None:
            state.clear()
            state.update(saved)


def _uncompiled_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A deep copy of the model with every torch.compile'd module (OptimizedModule) replaced by its
    original module: the recording compile then sees their layers, named without `_orig_mod`."""
    from torch._dynamo.eval_frame import OptimizedModule

    def original(module):
        while isinstance(module, OptimizedModule):
            module = module._orig_mod
        return module

    subject = copy.deepcopy(original(model))
    for parent in list(subject.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, OptimizedModule):
                setattr(parent, name, original(child))
    return subject


def _quantized_op(module) -> str:
    """The op a QuantizedLinear / QuantizedConv2d forward calls (quantize.py)."""
    if module.scheme in ("apot3", "apot4", "apot5"):
        return "apot_linear" if module.kind == "linear" else "apot_conv2d"
    if module.kind == "conv2d":
        return "binary_conv2d" if module.scheme == "binary" else "binary_weight_conv2d"
    return "binary_linear" if module.scheme == "binary" else "binary_weight_linear"


def _with_quantized_modules(subject: torch.nn.Module, entries: list) -> list:
    """The graph's entries plus one "quantized" entry per quantize_'d module, in module order."""
    from bitcompile.passes.context import Entry
    from bitcompile.quantize import QuantizedConv2d, QuantizedLinear

    order = {name: i for i, (name, _) in enumerate(subject.named_modules())}
    quantized = []
    for name, module in subject.named_modules():
        if isinstance(module, (QuantizedLinear, QuantizedConv2d)):
            op = _quantized_op(module)
            quantized.append(Entry(name, module.kind, "quantized", op, f"quantize_ {module.scheme}: packed weight",
                                   scheme=module.scheme))
    names = {e.name for e in quantized}
    # a quantized module's entry replaces any the graph gave its name
    merged = [e for e in entries if e.name not in names] + quantized
    return sorted(merged, key=lambda e: order.get(e.name, len(order)))


def _explain_exported(ep, options) -> Report:
    from bitcompile import export, passes

    checked = export._options(options)
    lowering = export._Lowering(ep)
    ctx = passes.PassContext(mode="record", training=False, quantize=checked["quantize"], filter=checked["filter"],
                             skip=checked["skip"], real_value=lowering.real_value, fqn_of=lowering.fqn_of)
    passes.run_passes(lowering.gm, ctx)
    return Report(list(ctx.entries), 1, "exported program, lowering")
