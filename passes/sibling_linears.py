"""Merge packed linears that read the same input into one call: attention's q / k / v, SwiGLU's w1 / w3.

At batch 1 a packed GEMV is latency-bound (its weight is 16x or 4x fewer bytes than bf16), so each call costs about
the same whatever its size, two launches at M = 1 (x's planes, then the weight kernel), and a launch gap in a CUDA
graph. Matches: two or more binary_weight_linear, or apot_linear of one width, with the same x node and in_features,
whose weights, scales, biases (and APoT tables) are graph inputs (a quantize_'d model's buffers). Emits:

    y = packed_linear_group(x, [w_1, ..., w_n], in_features, [scale_i], [bias_i], [code_values_i], bits=b)
    out_i = clone(y[..., o_i : o_i + n_i])          (o_i: the outputs before member i)

packed_linear_group (bitcompile/weight_ops.py) stacks the members' weights once per version of their tensors and
runs the member op once. The clone keeps each output contiguous, as the member's was (a slice of y along the last
dim is not, for M > 1): inductor fuses it into pointwise readers. Each column is the member's own math, but the
kernel chosen for the stacked N may sum K in another order than the member's own call: outputs match to rounding,
not bit for bit. Only under the backend (the run-time cache), with inference graphs.
Counter: counters["bitcompile"]["sibling_linears"] (members merged).
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
from torch._dynamo.utils import counters
from torch.fx.operator_schemas import normalize_function

from bitcompile.passes import ir

log = logging.getLogger("bitcompile")
aten = torch.ops.aten
bc = torch.ops.bitcompile

_OPS = ("binary_weight_linear", "apot_linear")


def _op_name(node: fx.Node):
    if node.op != "call_function":
        return None
    for name in _OPS:
        packet = getattr(bc, name)
        if node.target is packet or node.target is packet.default:
            return name
    return None


def _arguments(node: fx.Node):
    """Every argument by name, defaults filled in (the op's schema says where each one sits), or None."""
    normalized = normalize_function(node.target, node.args, node.kwargs, normalize_to_only_use_kwargs=True)
    if normalized is None:
        return None
    found = dict(normalized.kwargs)
    found.setdefault("scale", None)  # apot_linear has none (its alpha is required)
    return found


def _is_input(arg) -> bool:
    """A graph input (a module's parameter or buffer under Dynamo, a lifted one under torch.export)."""
    return isinstance(arg, fx.Node) and arg.op in ("placeholder", "get_attr")


def _member(node: fx.Node):
    """(group key, arguments) of a mergeable call, else None."""
    name = _op_name(node)
    if name is None:
        return None
    a = _arguments(node)
    if a is None or not isinstance(a["x"], fx.Node) or not isinstance(a["in_features"], int):
        return None
    tensors = [a["w_packed"], a["scale"], a["bias"]] + ([a["alpha"], a["code_values"]] if name == "apot_linear" else [])
    if not all(t is None or _is_input(t) for t in tensors) or not _is_input(a["w_packed"]):
        return None
    out = ir.value(node)
    if not isinstance(out, torch.Tensor) or not isinstance(out.shape[-1], int):
        return None
    bits = a["bits"] if name == "apot_linear" else 0
    if not isinstance(bits, int):
        return None
    key = (name, a["x"], a["in_features"], bits, a["scale"] is None and name != "apot_linear", a["bias"] is None)
    return key, a


def merge_sibling_linears(graph: fx.Graph, fake_mode=None) -> int:
    """Rewrite every group of sibling packed linears into one packed_linear_group call; returns the members merged."""
    groups: dict = {}
    for node in graph.nodes:
        found = _member(node)
        if found is not None:
            groups.setdefault(found[0], []).append((node, found[1]))
    merged = 0
    for (name, x, in_features, bits, no_scale, no_bias), members in groups.items():
        if len(members) < 2:
            continue
        # The group runs where the first member did: a weight, scale or table written in place before a later
        # member reads it would be read too early. Such a group stays as it is.
        tensors = {t for _, a in members for t in a.values() if isinstance(t, fx.Node) and t is not x}
        span, node = [], members[0][0].next
        while node is not members[-1][0]:
            span.append(node)
            node = node.next
        if any(not ir.side_effect_free(n) and tensors & set(n.all_input_nodes) for n in span):
            continue
        apot = name == "apot_linear"
        scales = [] if no_scale else [a["alpha"] if apot else a["scale"] for _, a in members]
        biases = [] if no_bias else [a["bias"] for _, a in members]
        tables = [a["code_values"] for _, a in members] if apot else []
        first = members[0][0]
        with graph.inserting_before(first):
            group = ir.emit(graph, bc.packed_linear_group.default,
                            (x, [a["w_packed"] for _, a in members], in_features, scales, biases, tables),
                            {"bits": bits}, fake_mode)
            start = 0
            for node, _ in members:
                width = ir.value(node).shape[-1]
                part = ir.emit(graph, aten.slice.Tensor, (group, -1, start, start + width), None, fake_mode)
                part = ir.emit(graph, aten.clone.default, (part,), {"memory_format": torch.contiguous_format},
                               fake_mode)
                part.meta.update({k: v for k, v in node.meta.items() if k not in part.meta
                                  and k not in ("val", "example_value")})
                node.replace_all_uses_with(part)
                start += width
        for node, _ in members:
            graph.erase_node(node)
        merged += len(members)
        counters["bitcompile"]["sibling_linears"] += len(members)
        log.info("bitcompile: %d %s calls on %s merged into %s", len(members), name, x.name, group.name)
    return merged
