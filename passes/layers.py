"""Find Linear and Conv2d computations and describe their operands (no rewriting here).

Matches, around every `linear` / `conv2d` of the canonical view (passes/ir.py):
  activation  x, ste_sign(x, clip), sign(x); for a conv also pad(<that>, pads, value)
  weight      W, ste_sign(W, clip), sign(W), each optionally `* s` with s a scalar or one
              value per output row ([N, 1] / [N, 1, 1, 1]: XNOR-Net's mean|W| per row)
  after it    a chain of single-use `* s` with s per output channel or a scalar tensor, or
              `* mean(abs(x), -1, keepdim=True)` on the binarized activation's input (XNOR-Net's
              beta, linear only), then at most one `+ b` with b per output channel.
Emits: a `Layer` per match; binary.py decides what to rewrite it into.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

import torch
import torch.fx as fx

from bitcompile.passes import ir


@dataclasses.dataclass
class Layer:
    kind: str                      # "linear" | "conv2d"
    node: fx.Node                  # the linear / conv node
    x: fx.Node                     # the activation before its binarizer (or the float activation)
    x_form: str                    # "float" | "ste_sign" | "sign"
    x_clip: Optional[float]        # ste_sign clip; None: another STE with the same forward
    x_binarized: Optional[fx.Node]  # the binarizer node (training graphs may keep it)
    weight: fx.Node                # the weight before its binarizer
    w_form: str                    # "float" | "ste_sign" | "sign"
    w_clip: Optional[float]
    weight_scale: Optional[fx.Node] = None   # sign(W) * weight_scale, per row or scalar
    bias: Optional[fx.Node] = None
    # conv geometry
    stride: tuple = (1, 1)
    padding: tuple = (0, 0)
    dilation: tuple = (1, 1)
    groups: int = 1
    explicit_pad: Optional[tuple] = None     # (pads, value, pad node) of F.pad(s(x)) before the conv
    # after the layer: [("channel" | "row", mul node, scale node)], then maybe a bias add
    post: list = dataclasses.field(default_factory=list)
    post_bias: Optional[tuple] = None        # (add node, bias node)
    fqn: Optional[str] = None
    name: str = ""

    @property
    def last(self) -> fx.Node:
        if self.post_bias is not None:
            return self.post_bias[0]
        return self.post[-1][1] if self.post else self.node


def _binarizer(node) -> Optional[tuple]:
    """(input, form, clip, node) if `node` is ste_sign / sign of something."""
    if not isinstance(node, fx.Node):
        return None
    c = ir.view(node)
    if c is None:
        return None
    if c.kind == "ste_sign":
        return c.operands[0], "ste_sign", c.operands[1], node
    if c.kind == "sign":
        return c.operands[0], "sign", None, node
    return None


def _numel(v) -> Optional[int]:
    try:
        return int(v.numel())
    except Exception:
        return None


def _is_tensor_node(node) -> bool:
    return isinstance(node, fx.Node) and isinstance(ir.value(node), torch.Tensor)


def _per_row_weight_scale(scale: fx.Node, weight_value) -> bool:
    """s in sign(W) * s scales whole output rows: numel 1, or [N, 1, ...] against W [N, ...]."""
    v = ir.value(scale)
    if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.ndim > weight_value.ndim:
        return False
    if _numel(v) == 1:
        return True
    shape = (1,) * (weight_value.ndim - v.ndim) + tuple(v.shape)
    return shape[0] == weight_value.shape[0] and all(d == 1 for d in shape[1:])


def _per_channel_output_scale(scale: fx.Node, kind: str, out_features: int, out_rank: int) -> bool:
    """s in y * s scales whole output channels: numel 1, [N] / [1, N] (linear), [N, 1, 1] /
    [1, N, 1, 1] (conv)."""
    v = ir.value(scale)
    if not isinstance(v, torch.Tensor) or not v.is_floating_point() or v.ndim > out_rank:
        return False
    if _numel(v) == 1:
        return True
    dims = list(v.shape)
    if kind == "linear":
        return dims[-1] == out_features and all(d == 1 for d in dims[:-1])
    dims = [1] * (4 - len(dims)) + dims
    return dims[1] == out_features and dims[0] == 1 and dims[2] == 1 and dims[3] == 1


def _is_row_scale(scale, x_raw: fx.Node) -> bool:
    """scale is mean(abs(x_raw), -1, keepdim=True)."""
    if not isinstance(scale, fx.Node):
        return False
    c = ir.view(scale)
    if c is None or c.kind != "mean" or not c.operands[2]:
        return False
    rank = getattr(ir.value(x_raw), "ndim", None)
    if rank is None or [d % rank for d in c.operands[1]] != [rank - 1]:
        return False
    inner = ir.view(c.operands[0]) if isinstance(c.operands[0], fx.Node) else None
    return inner is not None and inner.kind == "abs" and inner.operands[0] is x_raw


def _same_dtype(a: fx.Node, b: fx.Node) -> bool:
    va, vb = ir.value(a), ir.value(b)
    return isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) and va.dtype == vb.dtype


def describe(node: fx.Node) -> Optional[Layer]:
    c = ir.view(node)
    if c is None or c.kind not in ("linear", "conv2d"):
        return None
    x_operand, w_operand, bias = c.operands[:3]
    if not isinstance(x_operand, fx.Node) or not isinstance(w_operand, fx.Node):
        return None
    if bias is not None and not isinstance(bias, fx.Node):
        return None

    # weight side: [binarizer] [* per-row scale]
    weight_scale = None
    w = ir.view(w_operand)
    if w is not None and w.kind == "mul":
        for mine, other in (w.operands, w.operands[::-1]):
            b = _binarizer(mine)
            if b is not None and _is_tensor_node(other) and _per_row_weight_scale(other, ir.value(b[0])):
                weight_scale, w_operand = other, mine
                break
    b = _binarizer(w_operand)
    if b is not None:
        weight, w_form, w_clip = b[0], b[1], b[2]
    else:
        weight, w_form, w_clip = w_operand, "float", None
    weight_value = ir.value(weight)
    if not isinstance(weight_value, torch.Tensor) or weight_value.ndim != (2 if c.kind == "linear" else 4):
        return None

    # activation side: [pad] [binarizer]
    explicit_pad = None
    if c.kind == "conv2d":
        p = ir.view(x_operand)
        if p is not None and p.kind == "pad" and _binarizer(p.operands[0]) is not None:
            explicit_pad = (p.operands[1], p.operands[2], x_operand)
            x_operand = p.operands[0]
    b = _binarizer(x_operand)
    if b is not None:
        x, x_form, x_clip, x_binarized = b
    else:
        x, x_form, x_clip, x_binarized = x_operand, "float", None, None
        if explicit_pad is not None:
            return None
    if not isinstance(x, fx.Node):
        return None

    layer = Layer(kind=c.kind, node=node, x=x, x_form=x_form, x_clip=x_clip, x_binarized=x_binarized,
                  weight=weight, w_form=w_form, w_clip=w_clip, weight_scale=weight_scale, bias=bias,
                  explicit_pad=explicit_pad)
    if c.kind == "conv2d":
        layer.stride, layer.padding, layer.dilation, layer.groups = c.operands[3:7]

    # after the layer: single-use multiplications by per-channel / row scales, then one bias add
    out_features = weight_value.shape[0]
    out_value = ir.value(node)
    out_rank = getattr(out_value, "ndim", 0)
    current = node
    while len(current.users) == 1:
        user = next(iter(current.users))
        u = ir.view(user)
        if u is None or u.kind not in ("mul", "add") or not _same_dtype(user, node):
            break
        other = u.operands[1] if u.operands[0] is current else u.operands[0]
        if other is current or not isinstance(other, fx.Node):
            break
        if u.kind == "mul" and layer.post_bias is None:
            if c.kind == "linear" and x_form != "float" and not any(k == "row" for k, _, _ in layer.post) \
                    and _is_row_scale(other, x):
                layer.post.append(("row", user, other))
            elif _per_channel_output_scale(other, c.kind, out_features, out_rank):
                layer.post.append(("channel", user, other))
            else:
                break
        elif u.kind == "add" and layer.post_bias is None and bias is None \
                and _per_channel_output_scale(other, c.kind, out_features, out_rank) and _numel(ir.value(other)) > 1:
            layer.post_bias = (user, other)
        else:
            break
        current = user
    return layer


def find_layers(graph: fx.Graph) -> list[Layer]:
    layers = []
    for node in list(graph.nodes):
        layer = describe(node)
        if layer is not None:
            layers.append(layer)
    return layers
