"""Pack a binary conv's activations in the graph, where inductor can fuse the packing into their producer.

conv2d_of_weight(x, W, ..., x_form="ste_sign") packs the signs of x in a pass of its own (the pack_signs
kernel reads all of x once more: in a binary ResNet-18 that is ~8% of a forward). Rewritten as

    x_bits = sum_j ((x_nhwc >= 0) << j) over each 32 channels   (aten ops: permute, ge, unflatten, shift, sum)
    packed_conv2d_of_weight(x_bits, W, ...)

the packing is ordinary pointwise-and-reduction code that inductor fuses into the kernel that produces x (a
residual add, a BatchNorm, a pool), which then writes the sign words beside x: bit for bit pack_signs' words (bit
1 for x >= 0; channels past C: 0), so the results do not change. That is the CUDA graph; a CPU graph calls
pack_signs on x instead (fuses_packing: inductor's C++ form of that reduction is 15-50x slower than the kernel). Where x is itself the output of a packed binary
conv read by nothing else (conv1 -> [BatchNorm, folded] -> conv2 of a BNN block), that conv outputs the sign words
instead (out_dtype int32, written by its epilogue): the float activation is never written. Those are the signs of
the fp32 values; eager takes them after rounding to the model's dtype, which differs only for a value that rounds
to -0. Only with inner="inductor" (nothing would fuse the packing elsewhere, and an eager pack in aten ops is slower
than the kernel); only x_form "ste_sign" (torch.sign's zeros need a second plane) and channels_last x (the packed
op's output is channels_last, as conv2d_of_weight's is for such an x: an NCHW model's tensors keep their strides).
Counter: counters["bitcompile"]["packed_input"].
"""

from __future__ import annotations

import logging

import torch
import torch.fx as fx
from torch._dynamo.utils import counters

from bitcompile.passes import ir

log = logging.getLogger("bitcompile")
aten = torch.ops.aten
bc = torch.ops.bitcompile


# meta key of the node that gives the sign words of x (the last node of _pack_nodes' packing): x, for
# passes/residual.py, which hands those readers the words written by x's conv instead
PACKS = "bitcompile_packs"


def fuses_packing(device) -> bool:
    """Whether the packing goes in the graph as aten ops for inductor to fuse (CUDA), or calls pack_signs (CPU).
    Inductor's C++ code for the aten form reduces each word's 32 shifted bits across vector lanes; on the 2-core
    AVX-512 CI machine (torch 2.13), B = 16 C = 64 56x56 fp32: a residual add fused with that packing 6.30 ms,
    against the add 0.38 and pack_signs (a compare to a 16-bit mask a vector) 0.12; 15-50x at every ResNet-18
    stage. Triton's form runs as the kernel does (see below)."""
    return torch.device(device).type != "cpu"


def _pack_nodes(graph: fx.Graph, x: fx.Node, channels: int, device, fake_mode) -> fx.Node:
    """Nodes computing pack_signs(x.permute(0, 2, 3, 1)) of a 4-D float x with `channels` channels."""
    emit = lambda target, args, kwargs=None: ir.emit(graph, target, args, kwargs, fake_mode)  # noqa: E731
    if not fuses_packing(device):
        return emit(bc.pack_signs.default, (emit(aten.permute.default, (x, [0, 2, 3, 1])),))
    if len(x.users) > 1:
        # An x that other nodes read too is stored, and inductor lays out such an intermediate (a pool's or an
        # add's output that no consumer asks a layout of) contiguous: the packing then gathers each word's 32
        # channels 2 * H * W bytes apart, and the other readers mix layouts (H200 ResNet-18: the max-pool's output,
        # 103 MB, packed in 92 us; pack_signs reads it in 36). So x keeps its channels_last strides (eager's). An x
        # read by the packing alone is left to fuse into it.
        from torch._inductor import inductor_prims  # noqa: F401  (registers prims.inductor_force_stride_order)
        x = emit(torch.ops.prims.inductor_force_stride_order.default, (x, list(ir.value(x).stride())))
    nhwc = emit(aten.permute.default, (x, [0, 2, 3, 1]))
    words = (channels + 31) // 32
    if words * 32 != channels:  # -1 fills the last word: sign bit 0, as pack_signs leaves it
        nhwc = emit(aten.constant_pad_nd.default, (nhwc, [0, words * 32 - channels], -1.0))
    signs = emit(aten.ge.Scalar, (nhwc, 0))
    grouped = emit(aten.unflatten.int, (signs, -1, [words, 32]))
    # int32 throughout: distinct bits add without carries, so the wrapping int32 sum is the word (bit 31 included).
    # H200, inductor, B = 256 C = 64 56x56 fp16: 35.5 us (2.9 TB/s, as the pack_signs kernel) against 51.3 us for
    # the int64 shift and sum this replaced (twenty-sixth session).
    wide = emit(aten._to_copy.default, (grouped,), {"dtype": torch.int32})
    shifts = emit(aten.arange.default, (32,), {"dtype": torch.int32, "device": device})
    bits = emit(aten.bitwise_left_shift.Tensor, (wide, shifts))
    return emit(aten.sum.dim_IntList, (bits, [-1]), {"dtype": torch.int32})


def pack_activations(graph: fx.Graph, fake_mode=None) -> int:
    """Rewrite every conv2d_of_weight with x_form "ste_sign" onto packed activations; returns how many."""
    done = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not bc.conv2d_of_weight.default:
            continue
        if node.kwargs.get("x_form") != "ste_sign" or len(node.args) < 5:
            continue
        x, weight = node.args[0], node.args[1]
        x_value, w_value = ir.value(x), ir.value(weight)
        if not (isinstance(x_value, torch.Tensor) and isinstance(w_value, torch.Tensor) and x_value.dim() == 4
                and w_value.dim() == 4 and x_value.is_floating_point()):
            continue
        # channels_last x only: the packed op's output is channels_last, as conv2d_of_weight's is for such an x
        # (an NCHW model keeps its NCHW outputs)
        if torch._prims_common.suggest_memory_format(x_value) != torch.channels_last:
            continue
        with graph.inserting_before(node):
            if x.target is bc.packed_conv2d_of_weight.default and len(x.users) == 1:
                x.update_kwarg("out_dtype", torch.int32)  # the producing conv writes the sign words itself
                ir.refresh_value(x, fake_mode)
                x_bits = x
                counters["bitcompile"]["packed_output"] += 1
            else:
                x_bits = _pack_nodes(graph, x, int(w_value.shape[1]), w_value.device, fake_mode)
                x_bits.meta[PACKS] = x
            scale = node.args[5] if len(node.args) > 5 else node.kwargs.get("scale")
            bias = node.args[6] if len(node.args) > 6 else node.kwargs.get("bias")
            packed = ir.emit(graph, bc.packed_conv2d_of_weight.default,
                             (x_bits, weight, *node.args[2:5], scale, bias),
                             {"weight_form": node.kwargs["weight_form"], "out_dtype": x_value.dtype,
                              "pad_value": node.kwargs.get("pad_value", 0.0)}, fake_mode)
        node.replace_all_uses_with(packed)
        packed.meta.update({k: v for k, v in node.meta.items()
                            if k not in packed.meta and k not in ("val", "example_value")})
        graph.erase_node(node)
        done += 1
        counters["bitcompile"]["packed_input"] += 1
        log.info("bitcompile: %s reads its activations packed in the graph", packed.name)
    return done
