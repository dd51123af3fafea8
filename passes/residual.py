"""Add a ResNet block's shortcut in the epilogue of the packed binary conv in front of it.

    y = packed_conv2d_of_weight(x_bits, W, ...)     # a block's last conv (its BatchNorm folded), read by the add alone
    out = y + identity                               # the shortcut: a tensor of y's shape and dtype

becomes packed_conv2d_of_weight(x_bits, W, ..., residual=identity): the conv's epilogue reads the shortcut and writes
the sum, where inductor would run an elementwise kernel reading y and the shortcut and writing the sum (the next
block's sign packing, fused into that kernel today, then reads the sum in a kernel of its own). The op rounds y to
its dtype and then adds, as eager's add of two such tensors does: the same sum of the same y, bit for bit.

Matched: add(y, identity) or add(identity, y) (operator.add, torch.add or Tensor.add, no alpha) where y is a
packed_conv2d_of_weight of a float out_dtype with no residual yet, read by nothing else, and identity has y's
shape and dtype (so the sum has them too, no broadcast) and channels_last strides (the op's layout, which it reads
with the output's indexing; another layout would be copied every call).
Where: as packed_input.py (inner="inductor" inference graphs), after it.
Counter: counters["bitcompile"]["residual_epilogue"].
"""

from __future__ import annotations

import logging
from typing import Optional

import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from bitcompile.passes import ir

log = logging.getLogger("bitcompile")
bc = torch.ops.bitcompile


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
        if not identity_value.is_contiguous(memory_format=torch.channels_last):
            continue
        return y, identity
    return None


def add_residuals(graph: fx.Graph, fake_mode=None) -> int:
    """Fold every matching shortcut add into the packed conv in front of it (in place); returns how many."""
    done = 0
    for node in list(graph.nodes):
        found = _conv_and_shortcut(node)
        if found is None:
            continue
        y, identity = found
        with graph.inserting_before(node):  # after both operands
            fused = ir.emit(graph, bc.packed_conv2d_of_weight.default, y.args, {**y.kwargs, "residual": identity},
                            fake_mode)
        fused.meta.update({k: v for k, v in y.meta.items() if k not in fused.meta and k not in ("val", "example_value")})
        node.replace_all_uses_with(fused)
        graph.erase_node(node)
        graph.erase_node(y)
        done += 1
        counters["bitcompile"]["residual_epilogue"] += 1
        log.info("bitcompile: %s adds its shortcut %s in the conv's epilogue", fused.name, identity.name)
    return done
