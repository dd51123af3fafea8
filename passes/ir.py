"""One small canonical view of the two graphs the passes see, so that matching is written once.

- Dynamo graphs (torch level): `torch._C._nn.linear`, `torch.conv2d`, `torch.sign`, `x.sign()`,
  `operator.mul`, `torch._C._nn.pad`, `torch.ops.bitcompile.ste_sign` (the packet), ...;
  example values in `node.meta["example_value"]`.
- torch.export graphs (ATen): `aten.linear`, `aten.addmm`/`aten.mm` on a transposed weight,
  `aten.conv2d`, `aten.convolution`, `aten.sign`, `aten.mul.Tensor`, `aten.constant_pad_nd`, ...;
  values in `node.meta["val"]`.

`view(node)` returns a `Canonical(kind, operands)` or None. Kinds and operands:
  linear(x, weight, bias)                    weight as stored: [out, in]
  conv2d(x, weight, bias, stride, padding, dilation, groups)   ints as 2-tuples
  ste_sign(x, clip)                          clip None: another STE with the forward s(x)
  sign(x)                                    torch.sign (0 at 0)
  mul(a, b) / add(a, b)
  pad(x, pads, value)                        constant mode only; pads as F.pad gives them
  abs(x)
  mean(x, dims, keepdim)
"""

from __future__ import annotations

import builtins
import operator
from typing import Any, NamedTuple, Optional

import torch
import torch.fx as fx
import torch.nn.functional as F

aten = torch.ops.aten


class Canonical(NamedTuple):
    kind: str
    operands: tuple


def value(node: Any):
    """The (fake) example value of a node, whichever IR it comes from; constants as they are."""
    if not isinstance(node, fx.Node):
        return node
    if "val" in node.meta:
        return node.meta["val"]
    return node.meta.get("example_value")


def _pair(v) -> Optional[tuple]:
    if isinstance(v, int):
        return (v, v)
    if isinstance(v, (list, tuple)) and len(v) == 1:
        return (v[0], v[0])
    if isinstance(v, (list, tuple)) and len(v) == 2:
        return tuple(v)
    return None


def _args(node: fx.Node, names: tuple, defaults: dict) -> Optional[dict]:
    """Positional + keyword arguments by name (for the method form args[0] is self)."""
    out = dict(defaults)
    if len(node.args) > len(names):
        return None
    for name, arg in zip(names, node.args):
        out[name] = arg
    for name, arg in node.kwargs.items():
        if name not in names:
            return None
        out[name] = arg
    return out


def _is(node: fx.Node, functions=(), methods=()) -> bool:
    if node.op == "call_function":
        return node.target in functions
    if node.op == "call_method":
        return node.target in methods
    return False


_LINEAR = (torch._C._nn.linear, F.linear, aten.linear.default)
_CONV = (torch.conv2d, F.conv2d, aten.conv2d.default, aten.conv2d.padding)
_SIGN = (torch.sign, aten.sign.default)
_MUL = (operator.mul, torch.mul, aten.mul.Tensor, aten.mul.Scalar)
_ADD = (operator.add, torch.add, aten.add.Tensor)
_PAD = (torch._C._nn.pad, F.pad)
_ABS = (torch.abs, aten.abs.default)
_MEAN = (torch.mean, aten.mean.dim)
_MATMUL = (operator.matmul, torch.matmul)


def _ste_sign_targets():
    ops = torch.ops.bitcompile
    return (ops.ste_sign, ops.ste_sign.default)


def _ste_sign_scaled_targets():
    ops = torch.ops.bitcompile
    if not hasattr(ops, "ste_sign_scaled"):
        return ()
    return (ops.ste_sign_scaled, ops.ste_sign_scaled.default)


def untranspose(node: Any) -> Optional[fx.Node]:
    """W when `node` is W transposed (a 2-D transpose in either IR), else None."""
    if not isinstance(node, fx.Node):
        return None
    if _is(node, (aten.t.default, torch.t), ("t",)):
        return node.args[0]
    if node.op == "call_function" and node.target is builtins.getattr and node.args[1] in ("T", "mT"):
        return node.args[0]
    if _is(node, (aten.permute.default, torch.permute), ("permute",)):
        dims = node.args[1:] if node.op == "call_method" and len(node.args) > 2 else node.args[1]
        if list(dims) == [1, 0]:
            return node.args[0]
    if _is(node, (aten.transpose.int, torch.transpose), ("transpose",)) and len(node.args) == 3:
        source = node.args[0]
        rank = getattr(value(source), "ndim", None)
        if rank == 2 and sorted(d % 2 for d in node.args[1:]) == [0, 1]:
            return source
    return None


def view(node: fx.Node) -> Optional[Canonical]:
    """The canonical form of `node`, or None if it is none of the kinds above."""
    if node.op not in ("call_function", "call_method"):
        return None
    target = node.target
    if _is(node, _LINEAR):
        a = _args(node, ("input", "weight", "bias"), {"bias": None})
        return a and Canonical("linear", (a["input"], a["weight"], a["bias"]))
    if _is(node, (aten.addmm.default,)):
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1 or len(node.args) != 3:
            return None
        weight = untranspose(node.args[2])
        return weight is not None and Canonical("linear", (node.args[1], weight, node.args[0])) or None
    if _is(node, (aten.mm.default,) + _MATMUL, ("matmul", "__matmul__")):
        if len(node.args) != 2 or node.kwargs:
            return None
        weight = untranspose(node.args[1])
        rank = getattr(value(node.args[0]), "ndim", 0)
        return weight is not None and rank >= 2 and Canonical("linear", (node.args[0], weight, None)) or None
    if _is(node, _CONV):
        a = _args(node, ("input", "weight", "bias", "stride", "padding", "dilation", "groups"),
                  {"bias": None, "stride": 1, "padding": 0, "dilation": 1, "groups": 1})
        return a and _conv(a)
    if _is(node, (aten.convolution.default,)):
        a = _args(node, ("input", "weight", "bias", "stride", "padding", "dilation", "transposed",
                         "output_padding", "groups"), {})
        if a is None or len(a) != 9 or a["transposed"]:
            return None
        return _conv(a)
    if _is(node, _ste_sign_targets()):
        a = _args(node, ("x", "clip"), {"clip": 1.0})
        # A clip Dynamo made symbolic (dynamic=True turns Python floats into graph inputs) is
        # unknown here: None, as for an STE of another kind (inference does not need it).
        clip = float(a["clip"]) if isinstance(a["clip"], (int, float)) else None
        return a and Canonical("ste_sign", (a["x"], clip))
    if _is(node, _ste_sign_scaled_targets()):
        return Canonical("ste_sign", (node.args[0], None))
    if _is(node, _SIGN, ("sign",)) and len(node.args) == 1 and not node.kwargs:
        return Canonical("sign", (node.args[0],))
    if _is(node, _MUL, ("mul", "__mul__")) and len(node.args) == 2 and not node.kwargs:
        return Canonical("mul", tuple(node.args))
    if _is(node, _ADD, ("add", "__add__")) and len(node.args) == 2 and not node.kwargs:
        return Canonical("add", tuple(node.args))
    if _is(node, _PAD):
        a = _args(node, ("input", "pad", "mode", "value"), {"mode": "constant", "value": None})
        if a is None or a["mode"] != "constant":
            return None
        return Canonical("pad", (a["input"], tuple(a["pad"]), float(a["value"] or 0.0)))
    if _is(node, (aten.constant_pad_nd.default,)):
        a = _args(node, ("input", "pad", "value"), {"value": 0.0})
        return a and Canonical("pad", (a["input"], tuple(a["pad"]), float(a["value"])))
    if _is(node, (aten.pad.default,)):
        a = _args(node, ("input", "pad", "mode", "value"), {"mode": "constant", "value": None})
        if a is None or a["mode"] != "constant":
            return None
        return Canonical("pad", (a["input"], tuple(a["pad"]), float(a["value"] or 0.0)))
    if _is(node, _ABS, ("abs",)) and len(node.args) == 1:
        return Canonical("abs", (node.args[0],))
    if _is(node, _MEAN, ("mean",)):
        a = _args(node, ("input", "dim", "keepdim"), {"dim": None, "keepdim": False})
        if a is None or a["dim"] is None or "dtype" in node.kwargs:
            return None
        dims = (a["dim"],) if isinstance(a["dim"], int) else tuple(a["dim"])
        return Canonical("mean", (a["input"], dims, bool(a["keepdim"])))
    del target
    return None


def _conv(a: dict) -> Optional[Canonical]:
    weight_value = value(a["weight"])
    if weight_value is None or getattr(weight_value, "ndim", 0) != 4:
        return None
    padding = a["padding"]
    if isinstance(padding, str):
        if padding == "valid":
            padding = 0
        elif padding == "same" and _pair(a["stride"]) == (1, 1):
            dilation = _pair(a["dilation"])
            totals = [dilation[i] * (weight_value.shape[2 + i] - 1) for i in range(2)]
            if any(t % 2 for t in totals):
                return None  # asymmetric "same": leave it
            padding = (totals[0] // 2, totals[1] // 2)
        else:
            return None
    geometry = [_pair(a["stride"]), _pair(padding), _pair(a["dilation"])]
    if any(g is None for g in geometry):
        return None
    return Canonical("conv2d", (a["input"], a["weight"], a["bias"], *geometry, a["groups"]))


def fake_mode_of(graph: fx.Graph):
    """The fake mode of the graph's own example values (under a backend, the tracing context's mode can be
    another one, and mixing two raises)."""
    from torch._guards import detect_fake_mode
    from torch._subclasses.fake_tensor import FakeTensor

    values = [value(n) for n in graph.nodes]
    for v in values:
        if isinstance(v, FakeTensor):
            return v.fake_mode
    return detect_fake_mode([v for v in values if isinstance(v, torch.Tensor)])


def refresh_value(node: fx.Node, fake_mode) -> None:
    """Recompute a call_function node's example value after its arguments changed (dropped if it cannot be)."""
    key = "val" if "val" in node.meta else "example_value"
    node.meta.pop(key, None)
    if fake_mode is None:
        return
    fake_args, fake_kwargs = fx.node.map_arg((node.args, node.kwargs), value)
    try:
        with fake_mode:
            node.meta[key] = node.target(*fake_args, **fake_kwargs)
    except Exception:
        pass


def emit(graph: fx.Graph, target, args: tuple, kwargs: Optional[dict] = None, fake_mode=None) -> fx.Node:
    """A call_function node with its example value filled in, in whichever meta key the graph uses."""
    node = graph.call_function(target, args, kwargs or {})
    if fake_mode is not None:
        fake_args, fake_kwargs = fx.node.map_arg((args, kwargs or {}), value)
        try:
            with fake_mode:
                result = target(*fake_args, **fake_kwargs)
        except Exception:  # meta is a convenience; the inner compiler traces again anyway
            result = None
        if result is not None:
            key = "val" if any("val" in n.meta for n in graph.nodes if n.op == "placeholder") else "example_value"
            node.meta[key] = result
    return node


def side_effect_free(node: fx.Node) -> bool:
    """Whether a call node is known not to write anything in place (no mutable schema, no in-place method or operator,
    no higher-order op); False for every other kind of node."""
    if node.op == "call_method":
        return not node.target.endswith("_")
    if node.op == "call_function":
        if isinstance(node.target, torch._ops.OpOverload):
            return not node.target._schema.is_mutable
        if isinstance(node.target, torch._ops.HigherOrderOperator):
            return False
        name = getattr(node.target, "__name__", "")
        if getattr(node.target, "__module__", None) in ("_operator", "operator"):
            return not name.startswith(("i", "__i", "set", "del")) or name in ("index", "is_", "is_not", "inv", "invert")
        return not name.endswith("_")
    return False
