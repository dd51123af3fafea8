"""Fold an inference BatchNorm into the epilogue of the bitcompile conv / linear op in front of it.

The run-time ops (conv2d_of_weight, linear_of_weight and their computed-weight forms) end in a per-channel
affine map, y = dot * scale[c] + bias[c], computed in fp32 and rounded once to the output dtype. An eval-mode
BatchNorm on y is another per-channel affine map,

    z = (y - mean) * g + beta,   g = gamma / sqrt(var + eps),

so the two are one: z = dot * (scale * g) + ((bias - mean) * g + beta). Folding it drops the BatchNorm's
read and write of the whole activation (in a binary ResNet block that is an elementwise pass over every
conv output). Matched: torch.nn.functional.batch_norm / torch.batch_norm with training=False and running
statistics, whose input is the op's output and nothing else reads that output; conv outputs (4-D, channel
dim 1) and 2-D linear outputs (BatchNorm1d on [N, C]).

Where: inference graphs of the torch.compile backend with inner="inductor" only. The fold rounds once, in fp32,
where eager PyTorch first rounds y to the output dtype and then normalizes it, so results can differ from eager
in the last bit (inductor's own BatchNorm kernels already round differently from eager). With inner "eager" or
"aot_eager" and in bitcompile.lower the graph keeps eager's numerics, bit for bit.
Counter: torch._dynamo.utils.counters["bitcompile"]["batchnorm_folded"].
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx as fx
import torch.nn.functional as F
from torch._dynamo.utils import counters

from bitcompile.passes import ir

log = logging.getLogger("bitcompile")
aten = torch.ops.aten
bc = torch.ops.bitcompile

_BATCH_NORM = (F.batch_norm, torch.batch_norm)
_BN_ARGS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum", "eps")
_TORCH_BN_ARGS = ("input", "weight", "bias", "running_mean", "running_var", "training", "momentum", "eps",
                  "cudnn_enabled")


def _epilogue_args() -> dict:
    """Op overload -> (positional index of scale, of bias, output rank that BatchNorm normalizes per dim 1)."""
    return {
        bc.conv2d_of_weight.default: (5, 6, 4),
        bc.conv2d_of_computed_weight.default: (7, 8, 4),
        bc.linear_of_weight.default: (2, 3, 2),
        bc.linear_of_computed_weight.default: (4, 5, 2),
    }


def _batch_norm(node: fx.Node) -> Optional[dict]:
    """The arguments of an eval-mode batch_norm call with running statistics, else None."""
    if node.op != "call_function" or node.target not in _BATCH_NORM:
        return None
    names = _BN_ARGS if node.target is F.batch_norm else _TORCH_BN_ARGS
    a = ir._args(node, names, {"weight": None, "bias": None, "training": False, "momentum": 0.1, "eps": 1e-5})
    if a is None or a.get("training") is not False:
        return None
    if not all(isinstance(a.get(k), fx.Node) for k in ("input", "running_mean", "running_var")):
        return None
    if not isinstance(a["eps"], (int, float)):
        return None
    return a


def _f32(graph: fx.Graph, node: fx.Node, fake_mode) -> fx.Node:
    return ir.emit(graph, aten._to_copy.default, (node,), {"dtype": torch.float32}, fake_mode)


def fold_batchnorms(graph: fx.Graph, fake_mode=None) -> int:
    """Fold every matching BatchNorm into its producer op (in place); returns how many were folded."""
    epilogues = _epilogue_args()
    folded = 0
    for node in list(graph.nodes):
        a = _batch_norm(node)
        if a is None:
            continue
        producer = a["input"]
        if producer.op != "call_function" or producer.target not in epilogues or len(producer.users) != 1:
            continue
        scale_at, bias_at, rank = epilogues[producer.target]
        out = ir.value(node)  # the BatchNorm's example value (the emitted op may have none): the op's shape
        if not isinstance(out, torch.Tensor) or out.dim() != rank or len(producer.args) <= bias_at:
            continue
        scale, bias = producer.args[scale_at], producer.args[bias_at]
        with graph.inserting_before(producer):
            emit = lambda target, *args: ir.emit(graph, target, args, None, fake_mode)  # noqa: E731
            # g = gamma / sqrt(var + eps), every factor in fp32 (the epilogue's precision)
            g = emit(aten.rsqrt.default, emit(aten.add.Scalar, _f32(graph, a["running_var"], fake_mode), float(a["eps"])))
            if a["weight"] is not None:
                g = emit(aten.mul.Tensor, g, _f32(graph, a["weight"], fake_mode))
            mean = _f32(graph, a["running_mean"], fake_mode)
            new_scale = g if scale is None else emit(aten.mul.Tensor, _f32(graph, scale, fake_mode), g)
            centred = emit(aten.neg.default, mean) if bias is None else \
                emit(aten.sub.Tensor, _f32(graph, bias, fake_mode), mean)
            new_bias = emit(aten.mul.Tensor, centred, g)
            if a["bias"] is not None:
                new_bias = emit(aten.add.Tensor, new_bias, _f32(graph, a["bias"], fake_mode))
        producer.update_arg(scale_at, new_scale)
        producer.update_arg(bias_at, new_bias)
        node.replace_all_uses_with(producer)
        graph.erase_node(node)
        folded += 1
        counters["bitcompile"]["batchnorm_folded"] += 1
        log.info("bitcompile: BatchNorm %s folded into %s", node.name, producer.name)
    return folded
