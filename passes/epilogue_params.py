"""Epilogue values computed from parameters only, moved into the run-time op (inference graphs).

Matches: the scale and bias arguments of linear_of_weight / conv2d_of_weight / packed_conv2d_of_weight (and its
_with_signs form) that are
functions of parameters and buffers alone: XNOR-Net's alpha = mean|W| per output channel, times and plus a folded
BatchNorm's gamma / sqrt(var + eps) and shift (batchnorm.py). Emits: that function as a small GraphModule
returning (scale, bias), registered in weight_ops.py, passed as the op's epilogue_fn with its parameters as
epilogue_inputs (scale and bias None). The op runs it once per version of those parameters (cached with the
converted weight in weight_ops.weight_cache) instead of inductor computing them on every forward: a reduction
kernel or two a layer, whose launches cost host time where the forward is host-bound (binary ResNet-18 on the H200 machine:
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
from torch.fx.operator_schemas import normalize_function

from bitcompile.passes import computed_weight
from bitcompile.passes.context import PassContext

bc = torch.ops.bitcompile
_OPS = (bc.linear_of_weight.default, bc.conv2d_of_weight.default, bc.packed_conv2d_of_weight.default,
        bc.packed_conv2d_of_weight_with_signs.default)


def cache_epilogues(graph: fx.Graph, ctx: PassContext) -> int:
    """Move every parameter-only scale / bias into its op (in place); returns how many ops changed."""
    moved = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _OPS:
            continue
        # every argument by name, defaults filled in (the op's schema says where each one sits)
        kwargs = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True).kwargs
        scale, bias = kwargs["scale"], kwargs["bias"]
        if kwargs["epilogue_fn"] or all(v is None or v.op == "placeholder" for v in (scale, bias)):
            continue  # nothing computed: a parameter passed as it is costs nothing a call
        found = computed_weight.extract_values([scale, bias], ctx)
        if found is None:
            continue
        key, inputs = found
        kwargs.update(scale=None, bias=None, epilogue_inputs=list(inputs), epilogue_fn=key)
        node.args, node.kwargs = (), kwargs
        moved += 1
        counters["bitcompile"]["epilogue_cached"] += 1
    return moved
