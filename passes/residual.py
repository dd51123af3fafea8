"""Add a ResNet block's shortcut in the epilogue of the packed binary conv in front of it.

    y = packed_conv2d_of_weight(x_bits, W, ...)     # a block's last conv (its BatchNorm folded), read by the add alone
    out = y + identity                               # the shortcut: a tensor of y's shape and dtype

becomes packed_conv2d_of_weight(x_bits, W, ..., residual=identity): the conv's epilogue reads the shortcut and writes
the sum, where inductor would run an elementwise kernel reading y and the shortcut and writing the sum and (fused
into it) the sum's sign words for the next block's first conv. Where packed_input packs the sum for such a conv, the
op is packed_conv2d_of_weight_with_signs and that conv reads the sign words the same epilogue writes: the packing
nodes are left without readers. The op rounds y to its dtype and then adds, as eager's add of two such tensors does:
the same sum of the same y, bit for bit, and the signs of that sum.

Matched: add(y, identity) or add(identity, y) (operator.add, torch.add or Tensor.add, no alpha) where y is a
packed_conv2d_of_weight of a float out_dtype with no residual yet, read by nothing else, and identity has y's
shape, dtype and strides (channels_last: the op's layout, which it reads with the output's indexing; another
layout would be copied every call), and is written to memory anyway
(_materialized: not a downsample's BatchNorm read by the add alone).
Where: as packed_input.py (inner="inductor" inference graphs), after it.
Counters: counters["bitcompile"]["residual_epilogue"] (adds folded), ["residual_signs"] (packings replaced).
"""

from __future__ import annotations

import logging
import operator
from typing import Optional

import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from bitcompile.passes import ir, packed_input

log = logging.getLogger("bitcompile")
bc = torch.ops.bitcompile


def _materialized(identity: fx.Node) -> bool:
    """Whether the shortcut is written to memory whether or not the add is folded: a graph input, a tensor with other
    readers (the next block's input), or a bitcompile op's output. A shortcut read by the add alone and computed in
    the graph (a downsample's BatchNorm of its 1x1 conv) is left to inductor, which computes it inside the add's
    kernel: folding would make inductor write it and the conv read it again, the same bytes as the conv output's
    write and read that folding saves."""
    if identity.op == "placeholder" or len(identity.users) > 1:
        return True
    source = identity.args[0] if identity.target is operator.getitem else identity
    target = getattr(source, "target", None)
    return isinstance(target, torch._ops.OpOverload) and target.namespace == "bitcompile"


def _conv_and_shortcut(node: fx.Node) -> Optional[tuple[fx.Node, fx.Node]]:
    """(y, identity) of an add that can be folded into y's op, else None."""
    canonical = ir.view(node)
    if canonical is None or canonical.kind != "add":
        return None
    for y, identity in (canonical.operands, canonical.operands[::-1]):
        if not (isinstance(y, fx.Node) and isinstance(identity, fx.Node) and y is not identity):
            continue
        if y.op != "call_function" or y.target is not bc.packed_conv2d_of_weight.default or len(y.users) != 1:
            continue
        if len(y.args) > 9 or y.kwargs.get("residual") is not None or y.kwargs.get("out_dtype") not in (
                torch.float32, torch.float16, torch.bfloat16):
            continue
        y_value, identity_value, sum_value = ir.value(y), ir.value(identity), ir.value(node)
        if not all(isinstance(v, torch.Tensor) for v in (y_value, identity_value, sum_value)):
            continue
        if (identity_value.shape != y_value.shape or identity_value.dtype != y_value.dtype
                or sum_value.dtype != y_value.dtype or identity_value.device != y_value.device):
            continue
        # the output's strides (channels_last): a test that holds under a symbolic batch, where torch 2.11's
        # is_contiguous(memory_format=torch.channels_last) says False (ResNet-18 compiled again at a new batch size)
        if tuple(identity_value.stride()) != tuple(y_value.stride()):
            continue
        if not _materialized(identity):
            continue
        return y, identity
    return None


def add_residuals(graph: fx.Graph, fake_mode=None) -> int:
    """Fold every matching shortcut add into the packed conv in front of it (in place); returns how many."""
    packers: dict = {}  # x -> the nodes giving x's sign words (packed_input's packing of x)
    for node in graph.nodes:
        if packed_input.PACKS in node.meta:
            packers.setdefault(node.meta[packed_input.PACKS], []).append(node)
    done = 0
    for node in list(graph.nodes):
        found = _conv_and_shortcut(node)
        if found is None:
            continue
        y, identity = found
        kwargs = {**y.kwargs, "residual": identity}
        readers = [p for p in packers.get(node, []) if p.users]
        with graph.inserting_before(node):  # after both operands
            if readers:  # the sum's sign words from the same epilogue, for the next convs
                fused = ir.emit(graph, bc.packed_conv2d_of_weight_with_signs.default, y.args, kwargs, fake_mode)
                total = ir.emit(graph, operator.getitem, (fused, 0), None, fake_mode)
                words = ir.emit(graph, operator.getitem, (fused, 1), None, fake_mode)
            else:
                fused = total = ir.emit(graph, bc.packed_conv2d_of_weight.default, y.args, kwargs, fake_mode)
        fused.meta.update({k: v for k, v in y.meta.items() if k not in fused.meta and k not in ("val", "example_value")})
        node.replace_all_uses_with(total)
        for packer in readers:  # its packing nodes are left without readers (run_passes removes them)
            packer.replace_all_uses_with(words)
            counters["bitcompile"]["residual_signs"] += 1
        graph.erase_node(node)
        graph.erase_node(y)
        done += 1
        counters["bitcompile"]["residual_epilogue"] += 1
        log.info("bitcompile: %s adds its shortcut %s in the conv's epilogue%s", fused.name, identity.name,
                 " and writes the sum's sign words" if readers else "")
    return done
