"""Rewrite the layers found by layers.py into bitcompile ops.

Matches: a `Layer` (linear / conv2d with its binarizers, scales, bias, explicit pad).
Emits, by graph kind:
  training graph  binary_linear_ste / binary_weight_linear_ste / binary_conv2d_ste on the float
                  latent weight; an operand binarized by torch.sign (x or W) is passed with
                  sign_zero / weight_sign_zero: its zeros count 0 and its gradient is
                  torch.sign's, exactly 0, while scales, bias and the other operand keep theirs
  inference graph linear_of_weight / conv2d_of_weight on the live float weight, which run
                  binary_linear / binary_weight_linear / binary_conv2d / apot_linear /
                  apot_conv2d on a weight converted once per weight version (weight_ops.py),
                  or the dense math while the weight has no packed form
  lowering        the kernel ops themselves on packed constants (bitcompile.lower)
Weights without a binarizer are rewritten in inference graphs only when their real values sit on
a binary (+-alpha per row) or APoT grid (grid.py), or with options={"quantize": scheme}.
Counters: torch._dynamo.utils.counters["bitcompile"][<op>] per rewritten layer, and
["skipped"] per layer left alone.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from bitcompile import weight_ops
from bitcompile.passes import computed_weight, grid, ir
from bitcompile.passes.context import PassContext
from bitcompile.passes.layers import Layer

aten = torch.ops.aten
bc = torch.ops.bitcompile


@dataclasses.dataclass
class Plan:
    op: str                        # the kernel op the layer runs on (for the report)
    x_in: fx.Node                  # what goes in as x
    x_form: str                    # "float" | "ste_sign" | "sign" (how x_in is binarized)
    weight_form: Optional[str]     # weight_ops.py weight form (inference / lowering)
    clip: float = 1.0              # STE window (training)
    row_scale: bool = False
    n_post: int = 0                # how many post multiplications are folded
    fold_post_bias: bool = False
    padding: tuple = (0, 0)
    pad_value: float = 0.0
    note: str = ""
    computed: object = None        # computed_weight.ComputedWeight (weight derived from parameters)
    weight_value: object = None    # the weight's real value when it is not a placeholder (lowering)


def _pads(layer: Layer) -> Optional[tuple]:
    """(top, left) of a symmetric explicit pad that can fold into the conv's padding, else None."""
    pads, _, _ = layer.explicit_pad
    if len(pads) == 2:
        pads = tuple(pads) + (0, 0)
    if len(pads) != 4 or layer.padding != (0, 0):
        return None
    left, right, top, bottom = pads
    if left != right or top != bottom or min(pads) < 0:
        return None
    return (top, left)


def _foldable_post(layer: Layer, allow_row: bool) -> int:
    if layer.bias is not None:  # (dot + b) * s is not dot * s + b
        return 0
    n = 0
    for kind, _, _ in layer.post:
        if kind == "row" and not allow_row:
            break
        n += 1
    return n


def plan_layer(layer: Layer, ctx: PassContext) -> Union[Plan, str]:
    """A Plan, or the reason (str) the layer stays as it is."""
    if layer.kind == "conv2d" and layer.groups != 1:
        return "groups > 1 (grouped binary conv has no kernel)"
    if ctx.training:
        return _plan_training(layer)
    plan = _plan_inference(layer, ctx)
    if (isinstance(plan, Plan) and plan.op == "binary_weight_conv2d" and ctx.mode != "lower"
            and not plan.weight_form.startswith("quantize:")
            and getattr(ir.value(layer.weight), "device", torch.device("cpu")).type != "cpu"):
        # Its CUDA form dequantizes the weight at every call: no faster than the graph's own dense conv on s(W).
        # (quantize_'s conversion and lower() take it on any device: there the weight is stored packed.)
        return "binary-weight conv2d off the CPU (binary_weight_conv2d has a CPU kernel only): left dense"
    return plan


def _activation_geometry(layer: Layer, plan: Plan, pass_binarized: bool) -> Optional[str]:
    """Fill x_in / padding / pad_value of a conv or linear plan; a reason string if impossible."""
    plan.x_in = layer.x_binarized if pass_binarized else layer.x
    plan.padding = layer.padding
    if layer.explicit_pad is None:
        return None
    pads, value, pad_node = layer.explicit_pad
    if value not in (0.0, 1.0, -1.0):
        return f"F.pad value {value} before the conv (only 0, +1, -1)"
    folded = _pads(layer)
    if folded is not None:
        plan.padding, plan.pad_value = folded, value
        return None
    # Asymmetric: keep the pad of the signs, the conv pads with zeros on top of it.
    plan.x_in = pad_node
    if ctx_training(plan):
        if value == 0.0 and plan.x_form != "sign":
            return "asymmetric zero F.pad of ste_sign signs in a training graph"
        return None
    if value == 0.0:
        plan.x_form = "sign"  # padded zeros must contribute 0
    return None


def ctx_training(plan: Plan) -> bool:
    return plan.op.endswith("_ste")


def _plan_training(layer: Layer) -> Union[Plan, str]:
    if layer.w_form == "float":
        return "float weight in a training graph"
    weight_sign = layer.w_form == "sign"  # torch.sign weight: no STE window of its own
    weight_form = "sign" if weight_sign else None
    if weight_sign:
        clip = layer.x_clip if layer.x_form == "ste_sign" and layer.x_clip is not None else 1.0
    else:
        clip = layer.w_clip
        if clip is None:
            return "weight STE clip not known at compile time (a symbolic float)"
    if layer.x_form == "float":
        if layer.kind == "conv2d":
            return ("float activations with a binary conv2d weight in a training graph "
                    "(binary_weight_conv2d has no training form)")
        plan = Plan("binary_weight_linear_ste", layer.x, "float", weight_form, clip=clip)
        plan.n_post = _foldable_post(layer, allow_row=False)
        plan.fold_post_bias = plan.n_post == len(layer.post) and layer.post_bias is not None
        return plan
    op = "binary_linear_ste" if layer.kind == "linear" else "binary_conv2d_ste"
    plan = Plan(op, layer.x, layer.x_form, weight_form, clip=clip)
    # x goes in raw when the op's window is x's own (same clip), or x came through torch.sign
    # (the op applies torch.sign and its zero gradient); else the binarized x, its STE kept.
    same = layer.x_form == "sign" or (layer.x_clip is not None and layer.x_clip == clip)
    if not same and clip < 1.0:
        return f"activation binarizer differs from the weight's and the weight clip {clip} < 1"
    reason = _activation_geometry(layer, plan, pass_binarized=not same)
    if reason:
        return reason
    plan.n_post = _foldable_post(layer, allow_row=same and plan.x_in is layer.x)
    plan.row_scale = any(kind == "row" for kind, _, _ in layer.post[: plan.n_post])
    plan.fold_post_bias = plan.n_post == len(layer.post) and layer.post_bias is not None
    plan.note = "" if same else "binarized activation passed in (its own STE kept)"
    return plan


def _plan_inference(layer: Layer, ctx: PassContext) -> Union[Plan, str]:
    note = ""
    if layer.w_form == "ste_sign":
        weight_form = "ste_sign"
    elif layer.w_form == "sign":
        weight_form = "sign"
        real = ctx.real_value(layer.weight)
        if real is not None and bool((real == 0).any()):
            note = "weight has exact zeros: dense math until it has none"
    else:
        real = ctx.real_value(layer.weight)
        if real is None:
            if ctx.mode == "lower":
                computed_value = ctx.evaluate(layer.weight)
            else:
                computed = computed_weight.extract(layer.weight, ctx)
                computed_value = None if computed is None else computed.value
            if computed_value is None:
                return "float weight computed from run-time inputs"
            weight_form = grid.grid_of(computed_value, float_activations=(layer.x_form == "float"))
            if weight_form is None:
                return "computed weight, not on a binary or APoT grid"
            plan = _finish_inference(layer, weight_form, f"computed weight on the {weight_form} grid")
            if isinstance(plan, Plan):
                plan.computed = None if ctx.mode == "lower" else computed
                plan.weight_value = computed_value
            return plan
        if ctx.quantize is not None and layer.x_form == "float" and layer.weight_scale is None:
            # exactly what bitcompile.quantize_ does to this layer (its conversion function)
            weight_form = f"quantize:{ctx.quantize}"
            note = f"quantized ({ctx.quantize}, as quantize_)"
        else:
            weight_form = grid.grid_of(real, float_activations=(layer.x_form == "float"))
            if weight_form is None:
                return "float weight, not on a binary or APoT grid"
            note = f"weight on the {weight_form} grid"
    return _finish_inference(layer, weight_form, note)


def _finish_inference(layer: Layer, weight_form: str, note: str) -> Union[Plan, str]:
    apot = weight_form in grid.APOT_SCHEMES or weight_form in ("quantize:apot3", "quantize:apot4", "quantize:apot5")
    x_binarized = layer.x_form != "float" or weight_form == "quantize:binary"
    if apot and layer.x_form != "float":
        return "binarized activations with an APoT weight"
    if layer.kind == "conv2d":
        op = "apot_conv2d" if apot else ("binary_conv2d" if x_binarized else "binary_weight_conv2d")
    else:
        op = "apot_linear" if apot else ("binary_linear" if x_binarized else "binary_weight_linear")
    plan = Plan(op, layer.x, layer.x_form, weight_form, note=note)
    reason = _activation_geometry(layer, plan, pass_binarized=False)
    if reason:
        return reason
    if apot and plan.pad_value != 0.0:
        return "APoT conv2d with a nonzero pad value"
    plan.n_post = _foldable_post(layer, allow_row=(layer.kind == "linear" and plan.x_form != "float"))
    plan.row_scale = any(kind == "row" for kind, _, _ in layer.post[: plan.n_post])
    plan.fold_post_bias = plan.n_post == len(layer.post) and layer.post_bias is not None
    return plan


# ----------------------------------------------------------------------------------------------
# Emitting
# ----------------------------------------------------------------------------------------------
def _reshape(graph, node, ctx):
    return ir.emit(graph, aten.reshape.default, (node, [-1]), fake_mode=ctx.fake_mode)


def _scale_and_bias(graph: fx.Graph, layer: Layer, plan: Plan, ctx: PassContext):
    scales = []
    if layer.weight_scale is not None:
        scales.append(layer.weight_scale)
    scales += [s for kind, _, s in layer.post[: plan.n_post] if kind == "channel"]
    scale = None
    for s in scales:
        s = _reshape(graph, s, ctx)
        scale = s if scale is None else ir.emit(graph, aten.mul.Tensor, (scale, s), fake_mode=ctx.fake_mode)
    bias = layer.bias
    if plan.fold_post_bias:
        bias = _reshape(graph, layer.post_bias[1], ctx)
    return scale, bias


def _replaced(layer: Layer, plan: Plan) -> fx.Node:
    """The last node the rewrite replaces."""
    if plan.fold_post_bias:
        return layer.post_bias[0]
    return layer.post[plan.n_post - 1][1] if plan.n_post else layer.node


def rewrite_layer(graph: fx.Graph, layer: Layer, plan: Plan, ctx: PassContext) -> Optional[str]:
    """Emit the plan's op in place of the layer's nodes; a reason string if lowering gave up."""
    last = _replaced(layer, plan)
    with graph.inserting_before(last):
        scale, bias = _scale_and_bias(graph, layer, plan, ctx)
        if ctx.mode == "lower":
            new = _emit_lowered(graph, layer, plan, scale, bias, ctx)
            if isinstance(new, str):
                return new
        elif ctx.training:
            new = _emit_training(graph, layer, plan, scale, bias, ctx)
        else:
            new = _emit_runtime(graph, layer, plan, scale, bias, ctx)
    last.replace_all_uses_with(new)
    new.meta.update({k: v for k, v in last.meta.items() if k not in new.meta and k not in ("val", "example_value")})
    return None


def _emit_training(graph, layer, plan, scale, bias, ctx):
    # torch.sign operands (only named when set, so ste_sign layers keep their plain calls)
    signs = {}
    if plan.x_form == "sign":
        signs["sign_zero"] = True
    if plan.weight_form == "sign":
        signs["weight_sign_zero"] = True
    if plan.op == "binary_linear_ste":
        return ir.emit(graph, bc.binary_linear_ste.default, (plan.x_in, layer.weight, scale, bias),
                       {"clip": plan.clip, "row_scale": plan.row_scale, **signs}, ctx.fake_mode)
    if plan.op == "binary_weight_linear_ste":
        return ir.emit(graph, bc.binary_weight_linear_ste.default, (plan.x_in, layer.weight, scale, bias),
                       {"clip": plan.clip, **signs}, ctx.fake_mode)
    return ir.emit(graph, bc.binary_conv2d_ste.default,
                   (plan.x_in, layer.weight, list(layer.stride), list(plan.padding), list(layer.dilation), scale, bias),
                   {"pad_value": plan.pad_value, "clip": plan.clip, **signs}, ctx.fake_mode)


def _prefetch_cuda(layer, plan, ctx) -> None:
    """Convert a CUDA weight at compile time too (not baked in: the cache still checks storage and
    version at every call). Under CUDA graphs the first call is a warm-up whose allocations go
    to the graph's private pool, where a cached tensor must not live; with the conversion done
    here that call is a cache hit."""
    try:
        if plan.computed is not None:
            inputs = [ctx.real_value(n) for n in plan.computed.inputs]
            if all(isinstance(t, torch.Tensor) and t.is_cuda for t in inputs):
                weight_ops._computed("prefetch", inputs, plan.computed.key, plan.weight_form)
        else:
            real = ctx.real_value(layer.weight)
            if real is not None and real.is_cuda:
                weight_ops.cached_kernel_weight(real, plan.weight_form)
    except Exception:  # the run-time op converts, and reports any error, on its first call
        pass


def _emit_runtime(graph, layer, plan, scale, bias, ctx):
    _prefetch_cuda(layer, plan, ctx)
    if plan.computed is not None:
        c = plan.computed
        shape = list(c.value.shape)
        if layer.kind == "linear":
            return ir.emit(graph, bc.linear_of_computed_weight.default, (plan.x_in, c.inputs, c.key, shape, scale, bias),
                           {"weight_form": plan.weight_form, "x_form": plan.x_form, "row_scale": plan.row_scale},
                           ctx.fake_mode)
        return ir.emit(graph, bc.conv2d_of_computed_weight.default,
                       (plan.x_in, c.inputs, c.key, shape, list(layer.stride), list(plan.padding), list(layer.dilation),
                        scale, bias),
                       {"weight_form": plan.weight_form, "x_form": plan.x_form, "pad_value": plan.pad_value},
                       ctx.fake_mode)
    if layer.kind == "linear":
        return ir.emit(graph, bc.linear_of_weight.default, (plan.x_in, layer.weight, scale, bias),
                       {"weight_form": plan.weight_form, "x_form": plan.x_form, "row_scale": plan.row_scale},
                       ctx.fake_mode)
    return ir.emit(graph, bc.conv2d_of_weight.default,
                   (plan.x_in, layer.weight, list(layer.stride), list(plan.padding), list(layer.dilation), scale, bias),
                   {"weight_form": plan.weight_form, "x_form": plan.x_form, "pad_value": plan.pad_value},
                   ctx.fake_mode)


def _constant_scale(graph, scale, alpha, name, ctx):
    """alpha (a lowering-time tensor or None) times the scale node, as one node (constant when the
    scale depends on weights only, so that the float weight can leave the program)."""
    folded = None
    if scale is not None:
        folded = ctx.evaluate(scale)
        if folded is None:  # depends on run-time inputs: keep it as a node
            if alpha is None:
                return scale
            return ir.emit(graph, aten.mul.Tensor, (ctx.add_constant(name, alpha), scale), fake_mode=ctx.fake_mode)
        folded = folded.reshape(-1).to(torch.float32)
    if alpha is not None:
        folded = alpha if folded is None else alpha * folded
    return None if folded is None else ctx.add_constant(name, folded.contiguous())


def _emit_lowered(graph, layer, plan, scale, bias, ctx):
    real = plan.weight_value if plan.weight_value is not None else ctx.real_value(layer.weight)
    if real is None:
        return "weight not known at lowering time"
    converted = weight_ops.kernel_weight(real, plan.weight_form)
    if converted.kind == "dense":
        return "weight has no packed form (exact zeros, or off its grid)"
    prefix = layer.fqn or layer.node.name
    packed = ctx.add_constant(f"{prefix}.weight_packed", converted.packed.contiguous())
    x_form = "ste_sign" if converted.x_binarized else plan.x_form
    k = real.shape[1]
    if converted.kind == "apot":
        alpha = _constant_scale(graph, scale, converted.alpha, f"{prefix}.weight_alpha", ctx)
        code_values = ctx.add_constant(f"{prefix}.apot_code_values", converted.code_values)
        if layer.kind == "linear":
            return ir.emit(graph, bc.apot_linear.default,
                           (plan.x_in, packed, k, converted.bits, code_values, alpha, bias), fake_mode=ctx.fake_mode)
        return ir.emit(graph, bc.apot_conv2d.default,
                       (plan.x_in, packed, k, [real.shape[2], real.shape[3]], list(layer.stride), list(plan.padding),
                        list(layer.dilation), converted.bits, code_values, alpha, bias), fake_mode=ctx.fake_mode)
    scale = _constant_scale(graph, scale, converted.alpha, f"{prefix}.weight_scale", ctx)
    if layer.kind == "linear":
        if x_form == "float":
            return ir.emit(graph, bc.binary_weight_linear.default, (plan.x_in, packed, k, scale, bias),
                           fake_mode=ctx.fake_mode)
        return ir.emit(graph, bc.binary_linear.default, (plan.x_in, packed, k, scale, bias),
                       {"sign_zero": x_form == "sign", "row_scale": plan.row_scale}, ctx.fake_mode)
    geometry = (plan.x_in, packed, k, [real.shape[2], real.shape[3]], list(layer.stride), list(plan.padding),
                list(layer.dilation), scale, bias)
    if x_form == "float":
        return ir.emit(graph, bc.binary_weight_conv2d.default, geometry, fake_mode=ctx.fake_mode)
    return ir.emit(graph, bc.binary_conv2d.default, geometry,
                   {"pad_value": plan.pad_value, "sign_zero": x_form == "sign"}, ctx.fake_mode)


def count(op: Optional[str]) -> None:
    counters["bitcompile"][op or "skipped"] += 1
