"""bitcompile.explain: which Linear/Conv2d layers the backend would rewrite, into what, and why not.

    report = bitcompile.explain(model, x)                  # options as torch.compile's options=
    print(report)                                          # a table
    [e.name for e in report.entries if e.action == "rewritten"]

It captures the model with Dynamo (as torch.compile would, in the current grad mode: with grad
enabled and trainable parameters you see the training graph's STE ops, under torch.no_grad() the
inference ops) and runs the passes in a recording mode that decides but rewrites nothing. The
captured graphs run as plain PyTorch on a copy of the model, so no bitcompile kernel is built or
run and the model's own state (a first-forward initialization, say) is left alone.
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

    def __str__(self) -> str:
        rows = [[str(getattr(e, c)) if getattr(e, c) is not None else "-" for c in _COLUMNS] for e in self.entries]
        widths = [max([len(c)] + [len(r[i]) for r in rows]) for i, c in enumerate(_COLUMNS)]

        def line(cells):
            return "  ".join(cell.ljust(width) for cell, width in zip(cells, widths)).rstrip()

        lines = [f"bitcompile: {len(self.rewritten)} of {len(self.entries)} layers rewritten "
                 f"({self.graph_kind}, {self.graphs} graph{'s' if self.graphs != 1 else ''})",
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

    subject = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    torch.compile(subject, backend=recording_backend)(*example_inputs)
    graph_kind = " + ".join(sorted(set(kinds))) + " graph" if kinds else "no graph"
    return Report(entries, len(kinds), graph_kind)


def _explain_exported(ep, options) -> Report:
    from bitcompile import export, passes

    checked = export._options(options)
    lowering = export._Lowering(ep)
    ctx = passes.PassContext(mode="record", training=False, quantize=checked["quantize"], filter=checked["filter"],
                             skip=checked["skip"], real_value=lowering.real_value, fqn_of=lowering.fqn_of)
    passes.run_passes(lowering.gm, ctx)
    return Report(list(ctx.entries), 1, "exported program, lowering")
