"""Epilogue values computed from parameters only, moved into the run-time op (inference graphs).

Matches: the scale and bias arguments of linear_of_weight / conv2d_of_weight / packed_conv2d_of_weight that are
functions of parameters and buffers alone: XNOR-Net's alpha = mean|W| per output channel, times and plus a folded
BatchNorm's gamma / sqrt(var + eps) and shift (batchnorm.py). Emits: that function as a small GraphModule
returning (scale, bias), registered in weight_ops.py, passed as the op's epilogue_fn with its parameters as
epilogue_inputs (scale and bias None). The op runs it once per version of those parameters
(weight_ops.epilogue_cache) instead of inductor computing them on every forward: a reduction kernel or two a
layer, whose launches cost host time where the forward is host-bound (binary ResNet-18 on the H200 machine:
3.7 ms of host time a forward against 2.8 ms of kernels). An in-place update of a BatchNorm statistic or of the
weight bumps its version, and the next call computes the values again.

Where: inference graphs of the torch.compile backend with inner="inductor", after the BatchNorm fold (the
same place as batchnorm.py); the values are computed by eager PyTorch, as the model computes them.
Counter: torch._dynamo.utils.counters["bitcompile"]["epilogue_cached"].
"""

from __future__ import annotations

import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from bitcompile.passes import computed_weight
from bitcompile.passes.context import PassContext

bc = torch.ops.bitcompile


def _epilogue_args() -> dict:
    """Op overload -> positional index of scale, of bias, of epilogue_inputs, of epilogue_fn."""
    return {
        bc.linear_of_weight.default: (2, 3, 4, 5),
        bc.conv2d_of_weight.default: (5, 6, 7, 8),
        bc.packed_conv2d_of_weight.default: (5, 6, 7, 8),
    }


def _arg(node: fx.Node, index: int, name: str):
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name)


def cache_epilogues(graph: fx.Graph, ctx: PassContext) -> int:
    """Move every parameter-only scale / bias into its op (in place); returns how many ops changed."""
    ops = _epilogue_args()
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in ops:
            continue
        scale_at, bias_at, inputs_at, fn_at = ops[node.target]
        scale, bias = _arg(node, scale_at, "scale"), _arg(node, bias_at, "bias")
        if _arg(node, fn_at, "epilogue_fn") or all(v is None or v.op == "placeholder" for v in (scale, bias)):
            continue  # nothing computed: a parameter passed as it is costs nothing a call
        found = computed_weight.extract_values([scale, bias], ctx)
        if found is None:
            continue
        key, inputs = found
        args = list(node.args) + [None] * (fn_at + 1 - len(node.args))
        args[scale_at], args[bias_at], args[inputs_at], args[fn_at] = None, None, list(inputs), key
        node.args = tuple(args)
        node.kwargs = {k: v for k, v in node.kwargs.items() if k not in ("scale", "bias", "epilogue_inputs",
                                                                        "epilogue_fn")}
        moved += 1
        counters["bitcompile"]["epilogue_cached"] += 1
    return moved
