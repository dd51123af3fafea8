"""The backend's weight ops: a live float weight converted for the kernels at run time, cached by
tensor version (linear_of_weight, conv2d_of_weight, packed_conv2d_of_weight, linear_of_computed_weight,
conv2d_of_computed_weight).

These sit above the op catalogue (ops.py) and quantize.py: they run the catalogue's kernel ops
and convert weights with quantize_'s own conversion functions (options={"quantize": scheme}), so
the layering is _build <- ops <- apot, quantize <- weight_ops <- passes, backend. The schemas,
fake kernels and implementations of these five ops are all in this file.
"""

from __future__ import annotations

import threading
from typing import Optional, Sequence

import torch
from torch import Tensor
from torch.multiprocessing.reductions import StorageWeakRef

from bitcompile import apot, quantize
from bitcompile.ops import (
    _binary_conv2d_packed_fake,
    _check,
    _check_alpha,
    _check_code_table,
    _check_conv_geometry,
    _check_float_input,
    _check_packed_linear,
    _check_same_device,
    _check_scale_bias,
    _conv_output,
    _sign,
    _with_sign_words_fake,
    packed_code_bytes,
    packed_words,
    register_not_differentiable,
)
from bitcompile.ops import unpack_signs as unpack_sign_words

_lib = torch.library.Library("bitcompile", "FRAGMENT")

#
# The bitcompile backend must not bake a weight packed at compile time into a compiled graph:
# Dynamo hands parameters to the backend as graph inputs, so two instances of one module class
# share one compiled artifact, and an in-place update (optimizer step, load_state_dict, copy_)
# after compiling would go unseen (DESIGN.md, hazards). The rewritten layers therefore call the
# ops below with the live float weight. They convert it (pack signs, find its grid, quantize
# it) on first use and keep the result in a cache keyed by the weight's storage, view geometry
# and `_version`: an unchanged weight is never converted twice, and an in-place update bumps
# `_version`, so the next call converts again. The converted weight never leaves the op, so no
# compiler can alias, reuse or copy it (inductor may hand the memory of an op's output to a
# later buffer: a cached tensor returned as an output could be overwritten that way).
# CUDA graphs (mode="reduce-overhead"): conversions run outside the graphs' memory pool (see
# _build_outside_graph_pools; none is made while a graph is captured), a replay reads the cached
# tensor in place, with no copy per call, and, as with inductor's freezing, does not see an
# in-place weight update made after capture (the replay skips the Python cache lookup);
# re-capture (torch._dynamo.reset()) after such an update
# (tests/test_backend.py::test_cuda_reduce_overhead_replays_without_repacking and
# tests/test_passes_epilogue_params.py::test_cuda_epilogue_under_reduce_overhead: pass on the
# H200 with torch 2.11 + CUDA 13.0).
#
# Weight forms (the `weight_form` argument): how the float weight W becomes kernel operands.
#   "ste_sign"       s(W) (+1 at 0): always packed signs.
#   "sign"           torch.sign(W): packed signs only while W has no exact zero (sign(0) = 0
#                    would need a zero plane for weights); with a zero, that call is dense math.
#   "binary_grid"    W itself, when every row is +-alpha[n] (alpha[n] = max|W[n]| > 0): packed
#                    signs and alpha as a per-output scale; dense while W is off that grid.
#   "apot3|4|5"      W itself, when bitcompile.apot.is_on_grid(W, scheme): packed codes, alpha;
#                    dense while W is off the grid.
#   "quantize:<s>"   W converted as bitcompile.quantize_ converts it (scheme s): always packed.
# Activation forms (`x_form`): "float" (x as is), "ste_sign" (s(x)), "sign" (torch.sign(x):
# an exact zero contributes 0).
_WEIGHT_FORMS = ("ste_sign", "sign", "binary_grid", "apot3", "apot4", "apot5")
_X_FORMS = ("float", "ste_sign", "sign")


class KernelWeight:
    """A float weight converted for the kernels: kind "binary" (int32 packed signs, `alpha` an
    optional per-output scale), "apot" (uint8 packed codes, bits, code_values, alpha) or "dense"
    (no packed form for these values: the layer runs its original float math)."""

    __slots__ = ("kind", "packed", "alpha", "bits", "code_values", "x_binarized", "dense_weight")

    def __init__(self, kind, packed=None, alpha=None, bits=0, code_values=None, x_binarized=None):
        self.dense_weight = None  # a computed weight's value, for the dense math (computed weights)
        self.kind = kind
        self.packed = packed
        self.alpha = alpha
        self.bits = bits
        self.code_values = code_values
        self.x_binarized = x_binarized  # quantize:"binary" binarizes activations too


def _conv_rows(weight: Tensor) -> Tensor:
    """The layout conv weights are packed in: [OC, KH, KW, C] (ops.py header)."""
    return weight.permute(0, 2, 3, 1).contiguous() if weight.dim() == 4 else weight


def _row_view(weight: Tensor) -> Tensor:
    return weight.reshape(weight.shape[0], -1)


def _binary_grid_alpha(weight: Tensor) -> Optional[Tensor]:
    """alpha[n] when every element of row n is +alpha[n] or -alpha[n] with alpha[n] > 0, else None."""
    rows = _row_view(weight.detach())
    alpha = rows.abs().amax(1)
    if not bool((alpha > 0).all()) or not bool((rows.abs() == alpha[:, None]).all()):
        return None
    return alpha.to(torch.float32)


def _apot_kernel_weight(weight: Tensor, scheme_name: str, require_on_grid: bool) -> KernelWeight:
    if require_on_grid and not apot.is_on_grid(weight.detach(), scheme_name):
        return KernelWeight("dense")
    scheme = apot.get_scheme(scheme_name)
    codes, alpha = apot.quantize_weight(weight.detach(), scheme_name, True)
    code_values = scheme.code_values.to(weight.device)
    packed = torch.ops.bitcompile.pack_codes(_row_view(_conv_rows(codes)), scheme.bits)
    return KernelWeight("apot", packed, alpha.reshape(-1).to(torch.float32), scheme.bits, code_values)


def kernel_weight(weight: Tensor, weight_form: str) -> KernelWeight:
    """Convert a float weight for the kernels (uncached; see `cached_kernel_weight`)."""
    weight = weight.detach()
    if weight_form == "ste_sign":
        return KernelWeight("binary", torch.ops.bitcompile.pack_signs(_conv_rows(weight)))
    if weight_form == "sign":
        if bool((weight == 0).any()):
            return KernelWeight("dense")
        return KernelWeight("binary", torch.ops.bitcompile.pack_signs(_conv_rows(weight)))
    if weight_form == "binary_grid":
        alpha = _binary_grid_alpha(weight)
        if alpha is None:
            return KernelWeight("dense")
        return KernelWeight("binary", torch.ops.bitcompile.pack_signs(_conv_rows(weight)), alpha)
    if weight_form in ("apot3", "apot4", "apot5"):
        return _apot_kernel_weight(weight, weight_form, require_on_grid=True)
    if weight_form.startswith("quantize:"):
        return _quantized_kernel_weight(weight, weight_form.split(":", 1)[1])
    raise ValueError(f"bitcompile: unknown weight form {weight_form!r}")


def _quantized_kernel_weight(weight: Tensor, scheme: str) -> KernelWeight:
    """The weight as bitcompile.quantize_ converts it (same conversion function, same numerics)."""
    convert = quantize.convert_conv2d_weight if weight.dim() == 4 else quantize.convert_linear_weight
    converted = convert(weight, scheme)
    if scheme in ("binary", "binary_weight"):
        return KernelWeight("binary", converted["packed"], converted.get("scale"),
                            x_binarized=(scheme == "binary"))
    return KernelWeight("apot", converted["packed"], converted["alpha"], converted["bits"],
                        converted["code_values"])


class _KernelWeightCache:
    """Converted weights keyed by (form, storage, view geometry), valid for one `_version`.

    A weak reference to the storage tells a live entry from one whose storage was freed (its
    address may be reused by a new tensor, whose version count starts again at 0)."""

    def __init__(self):
        self.entries: dict = {}
        self.lock = threading.Lock()
        self.conversions = 0  # how many times a weight was converted (tests assert on it)

    def get(self, weight: Tensor, weight_form: str, remember=None) -> KernelWeight:
        return self.get_for((weight,), weight_form, lambda: kernel_weight(weight, weight_form), remember)

    def get_for(self, inputs: Sequence[Tensor], tag: str, build, remember=None) -> KernelWeight:
        """build() once per version of `inputs` (the tensors the converted weight depends on). remember(converted),
        where given, is called whenever the result is one the cache keeps (the C++ memo's entry, below)."""
        key, versions = [tag], []
        for t in inputs:  # one loop, no generators: this runs on every call of a weight op (host time counts)
            if t.is_inference():  # no version counter: convert every call
                self.conversions += 1
                return build()
            key.append((t.device, t.dtype, t.untyped_storage().data_ptr(), t.storage_offset(), t.shape, t.stride()))
            versions.append(t._version)
        key = tuple(key)
        entry = self.entries.get(key)  # a dict read is atomic; the lock guards the writes
        if entry is not None and entry[1] == versions:
            for ref in entry[0]:
                if ref.expired():
                    break
            else:
                if remember is not None:
                    remember(entry[2])
                return entry[2]
        device = inputs[0].device if inputs else None
        if device is not None and device.type == "cuda":
            if torch.cuda.is_current_stream_capturing():  # memory of the graph being captured: not cached
                return build()
            converted = _build_outside_graph_pools(build, device)
        else:
            converted = build()
        with self.lock:
            self.conversions += 1
            if len(self.entries) >= 256:
                self.entries = {k: e for k, e in self.entries.items() if not any(r.expired() for r in e[0])}
            refs = tuple(StorageWeakRef(t.untyped_storage()) for t in inputs)
            self.entries[key] = (refs, versions, converted)
        if remember is not None:
            remember(converted)
        return converted

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            if _memo_loaded():
                torch.ops.bitcompile.forget_kernel_weights()


weight_cache = _KernelWeightCache()


# The C++ memo of the binary libraries (csrc/weight_memo.h): the five weight ops (linear_of_weight,
# conv2d_of_weight, packed_conv2d_of_weight, packed_conv2d_of_weight_with_signs and packed_linear_group) find their
# converted weight there without running Python (their Python kernel below runs on a miss, or for a dense form). It
# holds what weight_cache holds for the binary and APoT forms, told by remember_kernel_weight each time this cache
# hands such an entry to one of those ops; the memo's kernels are registered by the first binary library to load
# (until then nothing is remembered).
_lib.define(
    "remember_kernel_weight(Tensor[] inputs, str tag, Tensor packed, Tensor? alpha, Tensor? code_values, "
    "Tensor? scale, Tensor? bias, int bits, bool x_binarized) -> ()"
)
_lib.define("forget_kernel_weights() -> int")  # empties the memo; returns how many entries it held
_memo_state = {"loaded": False}


def _memo_loaded() -> bool:
    if not _memo_state["loaded"]:
        _memo_state["loaded"] = torch._C._dispatch_has_kernel_for_dispatch_key(
            "bitcompile::remember_kernel_weight", "BackendSelect")
    return _memo_state["loaded"]


def _remember_for(inputs: Sequence[Tensor], tag: str, served):
    """get_for's remember callback for a weight op's entry, (KernelWeight, scale, bias) or a KernelWeight: the memo
    is told of it where served(KernelWeight) (a weight it would be asked for again)."""

    def remember(entry) -> None:
        converted, scale, bias = entry if isinstance(entry, tuple) else (entry, None, None)
        if not served(converted) or not _memo_loaded():
            return
        torch.ops.bitcompile.remember_kernel_weight(
            list(inputs), tag, converted.packed, converted.alpha, converted.code_values, scale, bias,
            converted.bits if converted.kind == "apot" else 0, bool(converted.x_binarized))

    return remember


# CUDA graph trees (mode="reduce-overhead") route every allocation of the calling thread to the graphs' private
# pool while they warm a graph up, and fail the warm-up on finding a live tensor there that is not an output: a
# converted weight kept in the cache. A conversion on CUDA therefore runs on a helper thread (allocations there go
# to the ordinary pool), on the caller's stream, so it is ordered with the caller's kernels as before.
_helper = None
_helper_lock = threading.Lock()
_HELPER_NAME = "bitcompile-weights"


def _build_outside_graph_pools(build, device: torch.device):
    global _helper
    if threading.current_thread().name.startswith(_HELPER_NAME):  # a conversion inside a conversion
        return build()
    if _helper is None:
        with _helper_lock:
            if _helper is None:
                from concurrent.futures import ThreadPoolExecutor
                _helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix=_HELPER_NAME)
    stream = torch.cuda.current_stream(device)

    def run():
        with torch.cuda.device(device), torch.cuda.stream(stream), torch.no_grad():
            return build()

    return _helper.submit(run).result()


def cached_kernel_weight(weight: Tensor, weight_form: str) -> KernelWeight:
    """`kernel_weight(weight, weight_form)`, converted once per weight version."""
    return weight_cache.get(weight, weight_form)


_lib.define(
    "linear_of_weight(Tensor x, Tensor weight, Tensor? scale=None, Tensor? bias=None, Tensor[]? epilogue_inputs=None, "
    "str epilogue_fn=\"\", *, str weight_form, str x_form=\"float\", bool row_scale=False) -> Tensor"
)
_lib.define(
    "conv2d_of_weight(Tensor x, Tensor weight, SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, "
    "Tensor? scale=None, Tensor? bias=None, Tensor[]? epilogue_inputs=None, str epilogue_fn=\"\", *, str weight_form, "
    "str x_form=\"float\", float pad_value=0.0) -> Tensor"
)


# conv2d_of_weight(x, ..., x_form="ste_sign") on x_bits = pack_signs(x.permute(0, 2, 3, 1)) (the passes let
# inductor compute that packing inside x's producer): the same values, in out_dtype, channels_last; out_dtype
# int32: their sign words (binary_conv2d_packed), the packed input of a next binary conv. residual: added as
# binary_conv2d_packed adds it (passes/residual.py: a ResNet block's shortcut).
_lib.define(
    "packed_conv2d_of_weight(Tensor x_bits, Tensor weight, SymInt[2] stride, SymInt[2] padding, "
    "SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None, Tensor[]? epilogue_inputs=None, str epilogue_fn=\"\", "
    "Tensor? residual=None, *, str weight_form, ScalarType out_dtype, float pad_value=0.0) -> Tensor"
)


# packed_conv2d_of_weight with a float out_dtype, and the output's sign words (binary_conv2d_packed_with_signs):
# a ResNet block's sum and the packed input of the next block's first conv from one epilogue (passes/residual.py).
_lib.define(
    "packed_conv2d_of_weight_with_signs(Tensor x_bits, Tensor weight, SymInt[2] stride, SymInt[2] padding, "
    "SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None, Tensor[]? epilogue_inputs=None, "
    "str epilogue_fn=\"\", Tensor? residual=None, *, str weight_form, ScalarType out_dtype, float pad_value=0.0) "
    "-> (Tensor, Tensor)"
)


# The epilogue's scale and bias as a function of parameters (passes/epilogue_params.py): epilogue_fn names a
# function registered below (register_weight_function) of the epilogue_inputs that returns (scale, bias); the op
# runs it once per version of those inputs instead of taking scale and bias computed in the graph on every call
# (XNOR-Net's alpha = mean|W| and a folded BatchNorm: a reduction kernel or two a layer a forward, and their
# launches, where the forward is host-bound). The values share one cache entry with the converted weight, keyed by
# the weight and the function's inputs: one lookup a call (host time), the weight listed once where it is also an
# input of the function (alpha = mean|W|).
def _kernel_weight_and_epilogue(op: str, weight: Tensor, weight_form: str, scale, bias, epilogue_inputs, fn: str,
                                served):
    """(converted weight, scale, bias) of a weight op's call. served(converted): whether the op's C++ memo serves
    calls with that converted weight (the memo is told of it then)."""
    if not fn:
        return weight_cache.get(weight, weight_form, _remember_for((weight,), weight_form, served)), scale, bias
    _check_epilogue(op, scale, bias, fn)
    function = _weight_functions.get(fn)
    _check(function is not None, op, lambda: f"epilogue function {fn} is not registered in this process "
           "(graphs using it come from the bitcompile backend; compile again)")
    fn_inputs = tuple(epilogue_inputs or ())

    def build():
        with torch.no_grad():
            return (kernel_weight(weight, weight_form), *function(*fn_inputs))

    inputs = (weight, *(t for t in fn_inputs if t is not weight))
    tag = f"{weight_form}|epilogue:{fn}"
    return weight_cache.get_for(inputs, tag, build, _remember_for(inputs, tag, served))


def _check_epilogue(op: str, scale, bias, fn: str) -> None:
    _check(not fn or (scale is None and bias is None), op,
           "scale and bias must be None where epilogue_fn computes them")


def _per_output(scale: Optional[Tensor]) -> Optional[Tensor]:
    return None if scale is None else scale.reshape(-1).to(torch.float32)


def _combined_scale(alpha: Optional[Tensor], scale: Optional[Tensor]) -> Optional[Tensor]:
    if alpha is None:
        return scale
    if scale is None:
        return alpha
    return alpha * _per_output(scale)


def _binarize_dense(x: Tensor, x_form: str) -> Tensor:
    if x_form == "ste_sign":
        return _sign(x)
    if x_form == "sign":
        return torch.sign(x)
    return x


def _dense_weight(weight: Tensor, weight_form: str) -> Tensor:
    if weight_form == "ste_sign":
        return _sign(weight)
    if weight_form == "sign":
        return torch.sign(weight)
    return weight


def _check_forms(op: str, weight_form: str, x_form: str) -> None:
    _check(weight_form in _WEIGHT_FORMS or weight_form.startswith("quantize:"), op,
           lambda: f"weight_form must be one of {_WEIGHT_FORMS} or 'quantize:<scheme>', got {weight_form!r}")
    _check(x_form in _X_FORMS, op, lambda: f"x_form must be one of {_X_FORMS}, got {x_form!r}")


def _run_linear(x, converted: KernelWeight, dense_weight, k, scale, bias, x_form, row_scale):
    """The converted weight's kernel, or the layer's original float math when it has none."""
    if converted.x_binarized:
        x_form = "ste_sign"
    if converted.kind == "binary":
        total = _combined_scale(converted.alpha, scale)
        if x_form == "float":
            return torch.ops.bitcompile.binary_weight_linear(x, converted.packed, k, total, bias)
        return torch.ops.bitcompile.binary_linear(x, converted.packed, k, total, bias,
                                                  sign_zero=(x_form == "sign"), row_scale=row_scale)
    if converted.kind == "apot" and x_form == "float":
        alpha = _combined_scale(converted.alpha, scale)
        return torch.ops.bitcompile.apot_linear(x, converted.packed, k, converted.bits, converted.code_values,
                                                alpha, bias)
    # Dense: the layer's original math (this weight has no packed form right now).
    y = torch.nn.functional.linear(_binarize_dense(x, x_form), dense_weight())
    if row_scale:
        y = y * x.abs().mean(-1, keepdim=True)
    if scale is not None:
        y = y * (scale.reshape(-1) if scale.numel() > 1 else scale.reshape(()))
    return y if bias is None else y + bias


@torch.library.impl(_lib, "linear_of_weight", "CompositeExplicitAutograd")
def _linear_of_weight_impl(x, weight, scale=None, bias=None, epilogue_inputs=None, epilogue_fn="", *, weight_form,
                           x_form="float", row_scale=False):
    converted, scale, bias = _kernel_weight_and_epilogue(
        "linear_of_weight", weight, weight_form, scale, bias, epilogue_inputs, epilogue_fn,
        lambda c: c.kind == "binary" or (c.kind == "apot" and x_form == "float" and not c.x_binarized))
    return _run_linear(x, converted, lambda: _dense_weight(weight, weight_form), weight.shape[1], scale, bias,
                       x_form, row_scale)


@torch.library.register_fake("bitcompile::linear_of_weight")
def _linear_of_weight_fake(x, weight, scale=None, bias=None, epilogue_inputs=None, epilogue_fn="", *, weight_form,
                           x_form="float", row_scale=False):
    op = "linear_of_weight"
    _check_epilogue(op, scale, bias, epilogue_fn)
    _check_float_input(op, x)
    _check_forms(op, weight_form, x_form)
    _check(weight.dim() == 2, op, lambda: f"weight must be 2-D, got {weight.dim()}-D")
    _check(x.shape[-1] == weight.shape[1], op, lambda: f"x has {x.shape[-1]} features, weight has {weight.shape[1]}")
    _check(not row_scale or x_form != "float", op, "row_scale needs a binarized x")
    _check_same_device(op, x, weight=weight)
    _check_scale_bias(op, x, weight.shape[0], scale, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def _run_conv2d(x, converted: KernelWeight, dense_weight, weight_shape, stride, padding, dilation, scale, bias,
                x_form, pad_value):
    if converted.x_binarized:
        x_form = "ste_sign"
    channels, kernel_size = weight_shape[1], [weight_shape[2], weight_shape[3]]
    if converted.kind == "binary" and x_form != "float":
        return torch.ops.bitcompile.binary_conv2d(
            x, converted.packed, channels, kernel_size, stride, padding, dilation,
            _combined_scale(converted.alpha, scale), bias, pad_value=pad_value, sign_zero=(x_form == "sign"))
    if converted.kind == "apot" and x_form == "float" and pad_value == 0.0:
        return torch.ops.bitcompile.apot_conv2d(
            x, converted.packed, channels, kernel_size, stride, padding, dilation, converted.bits,
            converted.code_values, _combined_scale(converted.alpha, scale), bias)
    if converted.kind == "binary" and x_form == "float":
        return torch.ops.bitcompile.binary_weight_conv2d(
            x, converted.packed, channels, kernel_size, stride, padding, dilation,
            _combined_scale(converted.alpha, scale), bias)
    # Dense: the layer's original math.
    xs = _binarize_dense(x, x_form)
    if padding[0] or padding[1]:
        xs = torch.nn.functional.pad(xs, (padding[1], padding[1], padding[0], padding[0]), value=pad_value)
    y = torch.nn.functional.conv2d(xs, dense_weight(), None, list(stride), 0, list(dilation))
    if scale is not None:
        y = y * (scale.reshape(1, -1, 1, 1) if scale.numel() > 1 else scale.reshape(()))
    return y if bias is None else y + bias.reshape(1, -1, 1, 1)


@torch.library.impl(_lib, "conv2d_of_weight", "CompositeExplicitAutograd")
def _conv2d_of_weight_impl(x, weight, stride, padding, dilation, scale=None, bias=None, epilogue_inputs=None,
                           epilogue_fn="", *, weight_form, x_form="float", pad_value=0.0):
    converted, scale, bias = _kernel_weight_and_epilogue(
        "conv2d_of_weight", weight, weight_form, scale, bias, epilogue_inputs, epilogue_fn,
        lambda c: c.kind == "binary" or (c.kind == "apot" and x_form == "float" and pad_value == 0.0
                                         and not c.x_binarized))
    dense = (lambda: weight) if weight_form.startswith("quantize:") else (lambda: _dense_weight(weight, weight_form))
    return _run_conv2d(x, converted, dense, weight.shape, stride, padding, dilation, scale, bias, x_form,
                       pad_value)


@torch.library.register_fake("bitcompile::conv2d_of_weight")
def _conv2d_of_weight_fake(x, weight, stride, padding, dilation, scale=None, bias=None, epilogue_inputs=None,
                           epilogue_fn="", *, weight_form, x_form="float", pad_value=0.0):
    op = "conv2d_of_weight"
    _check_epilogue(op, scale, bias, epilogue_fn)
    _check_float_input(op, x)
    _check_forms(op, weight_form, x_form)
    _check(weight.dim() == 4, op, lambda: f"weight must be 4-D, got {weight.dim()}-D")
    _check(pad_value in (0.0, 1.0, -1.0), op, lambda: f"pad_value must be 0, 1 or -1, got {pad_value}")
    kernel_size = [weight.shape[2], weight.shape[3]]
    _check_conv_geometry(op, x, weight.shape[1], kernel_size, stride, padding, dilation)
    _check_same_device(op, x, weight=weight)
    _check_scale_bias(op, x, weight.shape[0], scale, bias)
    return _conv_output(op, x, weight.shape[0], kernel_size, stride, padding, dilation)


def unpack_signs(x_bits: Tensor, channels: int, dtype: torch.dtype) -> Tensor:
    """The +-1 values of pack_signs words [N, H, W, words] as an [N, C, H, W] channels_last tensor of dtype."""
    return unpack_sign_words(x_bits, channels, dtype).permute(0, 3, 1, 2)


def _binary_form(converted: KernelWeight) -> bool:
    return converted.kind == "binary"


@torch.library.impl(_lib, "packed_conv2d_of_weight", "CompositeExplicitAutograd")
def _packed_conv2d_of_weight_impl(x_bits, weight, stride, padding, dilation, scale=None, bias=None,
                                  epilogue_inputs=None, epilogue_fn="", residual=None, *, weight_form, out_dtype,
                                  pad_value=0.0):
    converted, scale, bias = _kernel_weight_and_epilogue("packed_conv2d_of_weight", weight, weight_form, scale, bias,
                                                         epilogue_inputs, epilogue_fn, _binary_form)
    channels, kernel_size = weight.shape[1], [weight.shape[2], weight.shape[3]]
    if converted.kind == "binary":
        return torch.ops.bitcompile.binary_conv2d_packed(
            x_bits, converted.packed, channels, kernel_size, stride, padding, dilation,
            _combined_scale(converted.alpha, scale), bias, residual, out_dtype=out_dtype, pad_value=pad_value)
    # No binary form of this weight right now (exact zeros of a torch.sign weight): the dense math on the signs
    dense = (lambda: weight) if weight_form.startswith("quantize:") else (lambda: _dense_weight(weight, weight_form))
    signs = out_dtype == torch.int32
    y = _run_conv2d(unpack_signs(x_bits, channels, torch.float32 if signs else out_dtype), converted, dense,
                    weight.shape, stride, padding, dilation, scale, bias, "ste_sign", pad_value)
    if signs:
        return torch.ops.bitcompile.pack_signs(y.permute(0, 2, 3, 1).contiguous())
    y = y.to(out_dtype)
    if residual is not None:
        y = y + residual
    return y.contiguous(memory_format=torch.channels_last)


@torch.library.register_fake("bitcompile::packed_conv2d_of_weight")
def _packed_conv2d_of_weight_fake(x_bits, weight, stride, padding, dilation, scale=None, bias=None,
                                  epilogue_inputs=None, epilogue_fn="", residual=None, *, weight_form, out_dtype,
                                  pad_value=0.0):
    op = "packed_conv2d_of_weight"
    _check_epilogue(op, scale, bias, epilogue_fn)
    _check_forms(op, weight_form, "ste_sign")
    _check(weight.dim() == 4, op, lambda: f"weight must be 4-D, got {weight.dim()}-D")
    _check_same_device(op, x_bits, weight=weight)
    words = (weight.shape[1] + 31) // 32
    w_packed = weight.new_empty((weight.shape[0], weight.shape[2], weight.shape[3], words), dtype=torch.int32)
    return _binary_conv2d_packed_fake(x_bits, w_packed, weight.shape[1], [weight.shape[2], weight.shape[3]], stride,
                                      padding, dilation, scale, bias, residual, out_dtype=out_dtype,
                                      pad_value=pad_value)


@torch.library.impl(_lib, "packed_conv2d_of_weight_with_signs", "CompositeExplicitAutograd")
def _packed_conv2d_of_weight_with_signs_impl(x_bits, weight, stride, padding, dilation, scale=None, bias=None,
                                             epilogue_inputs=None, epilogue_fn="", residual=None, *, weight_form,
                                             out_dtype, pad_value=0.0):
    converted, scale, bias = _kernel_weight_and_epilogue("packed_conv2d_of_weight_with_signs", weight, weight_form,
                                                         scale, bias, epilogue_inputs, epilogue_fn, _binary_form)
    if converted.kind == "binary":
        return torch.ops.bitcompile.binary_conv2d_packed_with_signs(
            x_bits, converted.packed, weight.shape[1], [weight.shape[2], weight.shape[3]], stride, padding, dilation,
            _combined_scale(converted.alpha, scale), bias, residual, out_dtype=out_dtype, pad_value=pad_value)
    # no binary form of the weight right now: packed_conv2d_of_weight's dense math, then the stored values' signs
    out = _packed_conv2d_of_weight_impl(x_bits, weight, stride, padding, dilation, scale, bias, None, "", residual,
                                        weight_form=weight_form, out_dtype=out_dtype, pad_value=pad_value)
    return out, torch.ops.bitcompile.pack_signs(out.permute(0, 2, 3, 1).contiguous())


@torch.library.register_fake("bitcompile::packed_conv2d_of_weight_with_signs")
def _packed_conv2d_of_weight_with_signs_fake(x_bits, weight, stride, padding, dilation, scale=None, bias=None,
                                             epilogue_inputs=None, epilogue_fn="", residual=None, *, weight_form,
                                             out_dtype, pad_value=0.0):
    return _with_sign_words_fake("packed_conv2d_of_weight_with_signs", x_bits, out_dtype, lambda: (
        _packed_conv2d_of_weight_fake(x_bits, weight, stride, padding, dilation, scale, bias, epilogue_inputs,
                                      epilogue_fn, residual, weight_form=weight_form, out_dtype=out_dtype,
                                      pad_value=pad_value)))


# Computed weights: a weight the model derives from parameters in its forward (APoTLinear's
# fake-quantized weight, say) is rewritten with the function that computes it. The passes extract
# that part of the graph as a small GraphModule of the parameters and register it here under a
# hash of its code; the ops below run it, and convert its result, once per version of those
# parameters (the same cache), so the fake quantization does not run per call either.
_weight_functions: dict = {}


def register_weight_function(function) -> str:
    """Register a GraphModule (parameters -> weight); returns its key (a hash of its code)."""
    import hashlib

    key = hashlib.sha1(function.code.encode()).hexdigest()[:20]
    _weight_functions.setdefault(key, function)
    return key


def _computed(op: str, inputs, weight_fn: str, weight_form: str) -> tuple:
    function = _weight_functions.get(weight_fn)
    _check(function is not None, op, lambda: f"weight function {weight_fn} is not registered in this process "
           "(graphs using it come from the bitcompile backend; compile again)")
    def build():
        with torch.no_grad():
            weight = function(*inputs)
        converted = kernel_weight(weight, weight_form)
        if converted.kind == "dense":
            converted.dense_weight = weight
        return converted

    converted = weight_cache.get_for(list(inputs), f"{weight_fn}:{weight_form}", build)
    return converted, lambda: converted.dense_weight


_lib.define(
    "linear_of_computed_weight(Tensor x, Tensor[] weight_inputs, str weight_fn, int[] weight_shape, "
    "Tensor? scale=None, Tensor? bias=None, *, str weight_form, str x_form=\"float\", bool row_scale=False) -> Tensor"
)
_lib.define(
    "conv2d_of_computed_weight(Tensor x, Tensor[] weight_inputs, str weight_fn, int[] weight_shape, "
    "SymInt[2] stride, SymInt[2] padding, SymInt[2] dilation, Tensor? scale=None, Tensor? bias=None, *, "
    "str weight_form, str x_form=\"float\", float pad_value=0.0) -> Tensor"
)


@torch.library.impl(_lib, "linear_of_computed_weight", "CompositeExplicitAutograd")
def _linear_of_computed_weight_impl(x, weight_inputs, weight_fn, weight_shape, scale=None, bias=None, *,
                                    weight_form, x_form="float", row_scale=False):
    converted, dense = _computed("linear_of_computed_weight", weight_inputs, weight_fn, weight_form)
    return _run_linear(x, converted, dense, weight_shape[1], scale, bias, x_form, row_scale)


@torch.library.register_fake("bitcompile::linear_of_computed_weight")
def _linear_of_computed_weight_fake(x, weight_inputs, weight_fn, weight_shape, scale=None, bias=None, *,
                                    weight_form, x_form="float", row_scale=False):
    op = "linear_of_computed_weight"
    _check_float_input(op, x)
    _check_forms(op, weight_form, x_form)
    _check(len(weight_shape) == 2, op, lambda: f"weight_shape must have 2 sizes, got {list(weight_shape)}")
    _check(x.shape[-1] == weight_shape[1], op, lambda: f"x has {x.shape[-1]} features, weight has {weight_shape[1]}")
    _check_scale_bias(op, x, weight_shape[0], scale, bias)
    return x.new_empty((*x.shape[:-1], weight_shape[0]))


@torch.library.impl(_lib, "conv2d_of_computed_weight", "CompositeExplicitAutograd")
def _conv2d_of_computed_weight_impl(x, weight_inputs, weight_fn, weight_shape, stride, padding, dilation, scale=None,
                                    bias=None, *, weight_form, x_form="float", pad_value=0.0):
    converted, dense = _computed("conv2d_of_computed_weight", weight_inputs, weight_fn, weight_form)
    return _run_conv2d(x, converted, dense, weight_shape, stride, padding, dilation, scale, bias, x_form, pad_value)


@torch.library.register_fake("bitcompile::conv2d_of_computed_weight")
def _conv2d_of_computed_weight_fake(x, weight_inputs, weight_fn, weight_shape, stride, padding, dilation, scale=None,
                                    bias=None, *, weight_form, x_form="float", pad_value=0.0):
    op = "conv2d_of_computed_weight"
    _check_float_input(op, x)
    _check_forms(op, weight_form, x_form)
    _check(len(weight_shape) == 4, op, lambda: f"weight_shape must have 4 sizes, got {list(weight_shape)}")
    kernel_size = [weight_shape[2], weight_shape[3]]
    _check_conv_geometry(op, x, weight_shape[1], kernel_size, stride, padding, dilation)
    _check_scale_bias(op, x, weight_shape[0], scale, bias)
    return _conv_output(op, x, weight_shape[0], kernel_size, stride, padding, dilation)


# ---- Sibling linears in one call (passes/sibling_linears.py) ------------------------------------------------------
# Packed linears that read the same x (attention's q / k / v, SwiGLU's w1 / w3) as one kernel call on their weights
# stacked along the outputs, made once per version of the members' tensors (the cache above): at batch 1 each such
# GEMV is latency-bound, so one call on 3N rows costs little more than one on N, and the launches (two a call at
# M = 1) go too. bits 0: binary_weight_linear (int32 signs, scale an optional per-member scalar or vector); bits
# > 0: apot_linear of that width (uint8 codes, scale = alpha, code_values one table a member). The output is every member's
# output side by side along the last dim, in member order. Members whose APoT tables differ run one call each.
_lib.define(
    "packed_linear_group(Tensor x, Tensor[] w_packed, SymInt in_features, Tensor[] scale, Tensor[] bias, "
    "Tensor[] code_values, *, int bits=0) -> Tensor"
)


def _rows(values: Sequence[Tensor], sizes: Sequence[int]) -> Tensor:
    """Per-member scalars or vectors as one vector over the stacked rows (float32, as the kernels read them)."""
    return torch.cat([v.reshape(-1).to(torch.float32).expand(n) if v.numel() == 1 else v.reshape(-1).to(torch.float32)
                      for v, n in zip(values, sizes)])


def _check_group(op, x, w_packed, in_features, scale, bias, code_values, bits) -> None:
    signs = bits == 0
    _check(len(w_packed) >= 1, op, "w_packed must hold at least one weight")
    _check(len(scale) in ((0, len(w_packed)) if signs else (len(w_packed),)), op,
           lambda: f"scale must hold one tensor a weight{' or none' if signs else ''}, got {len(scale)}")
    _check(len(bias) in (0, len(w_packed)), op, lambda: f"bias must hold one tensor a weight or none, got {len(bias)}")
    _check(len(code_values) == (0 if signs else len(w_packed)), op,
           lambda: f"code_values must hold {0 if signs else len(w_packed)} tables, got {len(code_values)}")
    _check_float_input(op, x)
    width, dtype = ((packed_words(in_features), torch.int32) if signs
                    else (packed_code_bytes(in_features, bits), torch.uint8))
    for i, w in enumerate(w_packed):
        _check_packed_linear(op, x, w, in_features, width, dtype)
        _check_scale_bias(op, x, w.shape[0], scale[i] if signs and scale else None, bias[i] if bias else None)
        if not signs:
            _check_alpha(op, x, scale[i], w.shape[0])
            _check_code_table(op, bits, code_values[i], "code_values", x)
            _check(code_values[i].dtype == torch.float32, op,
                   lambda: f"code_values must be float32, got {code_values[i].dtype}")


def _stacked(w_packed, scale, bias, code_values, bits):
    """(packed, scale, bias) of the members stacked along the outputs, or None where their APoT tables differ."""
    if any(not torch.equal(c, code_values[0]) for c in code_values[1:]):
        return None
    sizes = [w.shape[0] for w in w_packed]
    same_dtype = all(b.dtype == bias[0].dtype for b in bias)
    return (torch.cat(list(w_packed)),
            _rows(scale, sizes) if scale else None,
            (torch.cat(list(bias)) if same_dtype else _rows(bias, sizes)) if bias else None)


def _remember_group(inputs, tag, stacked, code_values, bits) -> None:
    """The memo's entry of a stacked group (csrc/weight_memo.h): packed, scale, bias, the members' APoT table."""
    if stacked is None or not _memo_loaded():  # APoT members with different tables: a call each, in Python
        return
    packed, total_scale, total_bias = stacked
    torch.ops.bitcompile.remember_kernel_weight(inputs, tag, packed, None, code_values[0] if bits else None,
                                                total_scale, total_bias, bits, False)


@torch.library.impl(_lib, "packed_linear_group", "CompositeExplicitAutograd")
def _packed_linear_group_impl(x, w_packed, in_features, scale, bias, code_values, *, bits=0):
    def build():  # the members' checks once per version: a hit has the same shapes, dtypes and devices
        _check_group("packed_linear_group", x, w_packed, in_features, scale, bias, code_values, bits)
        return _stacked(w_packed, scale, bias, code_values, bits)

    # x itself is checked by the member op against the stacked weight (dtype, features, device)
    inputs, tag = [*w_packed, *scale, *bias, *code_values], f"group:{bits}"
    stacked = weight_cache.get_for(inputs, tag, build, lambda entry: _remember_group(inputs, tag, entry, code_values,
                                                                                     bits))
    bc = torch.ops.bitcompile
    if stacked is None:  # APoT members with different tables: a call each
        return torch.cat([bc.apot_linear(x, w, in_features, bits, c, a, bias[i] if bias else None)
                          for i, (w, c, a) in enumerate(zip(w_packed, code_values, scale))], dim=-1)
    packed, total_scale, total_bias = stacked
    if bits == 0:
        return bc.binary_weight_linear(x, packed, in_features, total_scale, total_bias)
    return bc.apot_linear(x, packed, in_features, bits, code_values[0], total_scale, total_bias)


@torch.library.register_fake("bitcompile::packed_linear_group")
def _packed_linear_group_fake(x, w_packed, in_features, scale, bias, code_values, *, bits=0):
    _check_group("packed_linear_group", x, w_packed, in_features, scale, bias, code_values, bits)
    return x.new_empty((*x.shape[:-1], sum(w.shape[0] for w in w_packed)))


# Inference graphs only (the passes emit them when grad is off); with inputs that require grad they
# still run, below autograd, and have no gradient (ops.py, "Inference ops under autograd").
# Once a device's binary library is loaded, the three weight ops and packed_linear_group take its C++ Autograd
# kernel instead (csrc/inference_autograd.h, which repeats TRAINING_FORM and also looks into their Tensor[]
# inputs): fewer host microseconds a call. The two computed-weight ops keep this Python one.
TRAINING_FORM = "torch.compile(backend='bitcompile') with grad enabled (the *_ste ops)"
CPP_AUTOGRAD_OPS = ("linear_of_weight", "conv2d_of_weight", "packed_conv2d_of_weight",
                    "packed_conv2d_of_weight_with_signs", "packed_linear_group")
for _name in CPP_AUTOGRAD_OPS + ("linear_of_computed_weight", "conv2d_of_computed_weight"):
    register_not_differentiable(_name, TRAINING_FORM)
