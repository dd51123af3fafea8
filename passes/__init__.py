"""FX graph passes of bitcompile (installed as bitcompile.passes), one concern a file:

  ir.py       one canonical view of Dynamo (torch-level) and torch.export (ATen) graphs
  layers.py   find Linear / Conv2d computations and describe operands, scales, bias, pad
  grid.py     weights already on a binary or APoT grid (inference graphs)
  computed_weight.py  weights computed from parameters in the forward (APoT fake quantization)
  binary.py   decide and emit the bitcompile op of each layer
  batchnorm.py  fold an eval BatchNorm into the epilogue of the op in front of it (inner="inductor" only)
  packed_input.py  binary convs read activations packed by aten ops that inductor fuses (inner="inductor" only)
  residual.py  a ResNet block's shortcut add in the packed conv's epilogue (the same)
  epilogue_params.py  scale / bias computed from parameters only, once per their version inside the op (the same)
  sibling_linears.py  packed linears reading the same x (q / k / v, w1 / w3) as one call (the same)
  context.py  what a run knows (graph kind, options, real weights) and its report entries

`run_passes(gm, ctx)` is the pipeline used by the backend (bitcompile.backend), by
`bitcompile.lower` and by `bitcompile.explain`. Counters: torch._dynamo.utils.counters["bitcompile"].
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx

from bitcompile.passes import batchnorm, binary, epilogue_params, ir, layers, packed_input, residual, sibling_linears
from bitcompile.passes.context import Entry, PassContext

__all__ = ["run_passes", "PassContext", "Entry"]

log = logging.getLogger("bitcompile")


def _selected(fqn, kind: str, ctx: PassContext):
    """None if the user's skip/filter options leave the layer to us, else the reason to skip."""
    if fqn is not None:
        for prefix in ctx.skip:
            if fqn == prefix or fqn.startswith(prefix + ".") or prefix == "":
                return f"skipped by option skip={prefix!r}"
    if ctx.filter is not None and not ctx.filter(fqn or "", kind):
        return "filter returned False"
    return None


def _layer_fqn(weight_fqn):
    if weight_fqn is None:
        return None
    return weight_fqn.rsplit(".", 1)[0] if "." in weight_fqn else ""


def _weight_fqn(weight: fx.Node, ctx: PassContext):
    """The parameter name behind a weight operand; for a weight computed from parameters (a
    fake-quantizer), the first "*.weight" parameter it reads."""
    fqn = ctx.fqn_of(weight)
    if fqn is not None or weight.op == "placeholder":
        return fqn
    seen, stack, found = set(), [weight], []
    while stack and len(seen) < 500:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if node.op == "placeholder":
            name = ctx.fqn_of(node)
            if name is not None:
                found.append(name)
        stack.extend(node.all_input_nodes)
    weights = [name for name in found if name.endswith("weight")]
    return (weights or found or [None])[0]


def run_passes(gm: fx.GraphModule, ctx: PassContext) -> list[Entry]:
    """Rewrite (or, in mode "record", only decide) every Linear/Conv2d of gm's graph in place."""
    graph = gm.graph
    if ctx.fake_mode is None:
        ctx.fake_mode = ir.fake_mode_of(graph)
    for node in list(graph.nodes):
        if not node.users and node.op != "output":
            continue  # left over from an earlier rewrite
        try:
            layer = layers.describe(node)
        except Exception as error:  # a matcher bug must not fail compilation
            log.warning("bitcompile: could not match %s: %s", node.format_node(), error)
            continue
        if layer is None:
            continue
        layer.fqn = _layer_fqn(_weight_fqn(layer.weight, ctx))
        name = layer.fqn if layer.fqn else node.name
        reason = _selected(layer.fqn, layer.kind, ctx)
        if reason is None:
            try:
                plan = binary.plan_layer(layer, ctx)
                if isinstance(plan, str):
                    reason = plan
                elif ctx.mode != "record":
                    reason = binary.rewrite_layer(graph, layer, plan, ctx)
            except Exception as error:
                log.warning("bitcompile: left %s (%s) as it was: %s: %s", name, layer.kind, type(error).__name__, error)
                reason = f"error while rewriting: {type(error).__name__}: {error}"
        if reason is None:
            detail = f"{plan.x_form} x, {plan.weight_form or 'ste_sign'} weight"
            if plan.note:
                detail += f"; {plan.note}"
            ctx.record(name, layer.kind, "rewritten", plan.op, detail)
            binary.count(plan.op)
            log.info("bitcompile: %s (%s) -> %s (%s)", name, layer.kind, plan.op, detail)
        else:
            ctx.record(name, layer.kind, "skipped", None, reason)
            binary.count(None)
            log.info("bitcompile: %s (%s) left as it was: %s", name, layer.kind, reason)
    if ctx.mode != "record":
        if ctx.inner_inductor and not ctx.training:
            remove_dead_nodes(graph)  # the rewrites' leftovers (binarizers): they would count as readers below
            batchnorm.fold_batchnorms(graph, ctx.fake_mode)
            packed_input.pack_activations(graph, ctx.fake_mode)
            residual.add_residuals(graph, ctx.fake_mode)
            if ctx.mode == "backend":
                epilogue_params.cache_epilogues(graph, ctx)
                sibling_linears.merge_sibling_linears(graph, ctx.fake_mode)
        remove_dead_nodes(graph)
        graph.lint()
        gm.recompile()
    return ctx.entries


_PURE_METHODS = {"sign", "abs", "mean", "t", "view", "reshape", "permute", "transpose", "contiguous", "detach",
                 "mul", "add", "div", "float", "to", "clone", "expand", "unsqueeze", "squeeze", "flatten"}


def _removable(node: fx.Node) -> bool:
    """Unused and certainly free of side effects (Dynamo graphs keep in-place method calls such as
    `scale_a.copy_(...)` whose result nobody uses: fx's eliminate_dead_code would drop those)."""
    if node.users or node.op not in ("call_function", "call_method"):
        return False
    if node.target is torch.ops.aten._assert_tensor_metadata.default:
        # torch.export's dtype/device check of a value: goes with the value once nothing else reads it
        checked = node.args[0]
        return isinstance(checked, fx.Node) and all(
            user.target is torch.ops.aten._assert_tensor_metadata.default for user in checked.users)
    if node.op == "call_method":
        return node.target in _PURE_METHODS
    if ir.view(node) is not None:
        return True
    target = node.target
    if isinstance(target, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        schema = target.default._schema if isinstance(target, torch._ops.OpOverloadPacket) else target._schema
        return not schema.is_mutable and not node.is_impure()
    import builtins
    import operator

    return target in (builtins.getattr, operator.getitem, operator.mul, operator.truediv, operator.neg)


def remove_dead_nodes(graph: fx.Graph) -> None:
    """Drop the nodes the rewrites left unused (binarizers, scale math, the dense layer)."""
    changed = True
    while changed:
        changed = False
        for node in reversed(list(graph.nodes)):
            if _removable(node):
                graph.erase_node(node)
                changed = True
