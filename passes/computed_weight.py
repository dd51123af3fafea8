"""Weights computed from parameters inside the forward (inference graphs).

Matches: a Linear/Conv2d weight operand that is not a parameter but a function of parameters and
buffers only, such as bitcompile.nn.APoTLinear's fake-quantized weight
(alpha * code_values[quantize(W)]), in at most MAX_NODES side-effect-free nodes.
Emits: that function as a small GraphModule of those parameters, registered in weight_ops.py under a
hash of its code, and the weight's value now (to find its grid). The run-time op
(linear_of_computed_weight / conv2d_of_computed_weight) re-runs the function and converts its
result once per version of the parameters, never per call.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.fx as fx

from bitcompile import weight_ops
from bitcompile.passes import ir
from bitcompile.passes.context import PassContext

MAX_NODES = 400


@dataclasses.dataclass
class ComputedWeight:
    key: str                 # weight_ops.py registry key of the function
    inputs: list             # the parameter / buffer placeholders it reads, in call order
    value: torch.Tensor      # its value now (real tensors)


def _function_of(outputs: list, ctx: PassContext):
    """(GraphModule of the parameters and buffers, its input placeholders in call order) that computes the nodes of
    `outputs` (a single node: returns it; a list: returns a tuple, None entries as None), or None where it reads
    anything else (a run-time input, a side effect) or takes more than MAX_NODES nodes."""
    single = isinstance(outputs, fx.Node)
    targets = [outputs] if single else [n for n in outputs if n is not None]
    if not targets or not all(isinstance(n, fx.Node) for n in targets):
        return None
    needed, inputs, stack = set(), [], list(targets)
    while stack:
        node = stack.pop()
        if node in needed:
            continue
        needed.add(node)
        if len(needed) > MAX_NODES:
            return None
        if node.op == "placeholder":
            if ctx.real_value(node) is None:
                return None  # a run-time input
            inputs.append(node)
            continue
        if not ir.side_effect_free(node):
            return None
        stack.extend(n for n in node.all_input_nodes)
    if not inputs:
        return None
    order = {n: i for i, n in enumerate(targets[0].graph.nodes)}
    inputs.sort(key=order.get)
    graph = fx.Graph()
    env = {}
    for node in inputs:
        env[node] = graph.placeholder(node.name)
    for node in sorted(needed - set(inputs), key=order.get):
        env[node] = graph.node_copy(node, lambda n: env[n])
    graph.output(env[outputs] if single else tuple(None if n is None else env[n] for n in outputs))
    return fx.GraphModule(torch.nn.Module(), graph), inputs


def extract(weight: fx.Node, ctx: PassContext) -> Optional[ComputedWeight]:
    """The function of parameters that computes `weight`, or None if it reads anything else."""
    found = _function_of(weight, ctx)
    if found is None:
        return None
    function, inputs = found
    with torch.no_grad():
        value = function(*[ctx.real_value(n) for n in inputs])
    if not isinstance(value, torch.Tensor):
        return None
    return ComputedWeight(weight_ops.register_weight_function(function), inputs, value)


def extract_values(values: list, ctx: PassContext) -> Optional[tuple]:
    """(registry key, input placeholders) of the function of parameters that computes the nodes of `values` as a
    tuple (None entries stay None), or None if one reads anything else (epilogue_params.py)."""
    found = _function_of(values, ctx)
    if found is None:
        return None
    function, inputs = found
    return weight_ops.register_weight_function(function), inputs
