"""Inference ops with inputs that require grad (ops.py, "Inference ops under autograd").

Every inference op, on each of its kernel paths (the small-M and GEMM paths: CPU apot_linear
switches to BLAS above 16 rows, binary_linear to the AVX-512 panel GEMM from 24, CUDA
binary_weight_linear to cuBLAS above 256 rows (2048 in fp32) and apot_linear above 4), returns
with grad enabled and inputs that require grad exactly what it returns under torch.no_grad(); a
backward through it raises an error naming the op and what to use instead. Issue 12, finding 2:
apot_linear's CPU GEMM path raised "mm(): functions with out=... arguments don't support
automatic differentiation" for a quantize_'d Llama run without torch.no_grad. Once a device's kernels are
loaded, that Autograd kernel is C++ (csrc/inference_autograd.h), with no Python on the way to the kernel.
"""

import sys
from pathlib import Path

import pytest
import torch

import bitcompile
from bitcompile import ops, weight_ops
from bitcompile.quantize import convert_conv2d_weight, convert_linear_weight, quantize_

K, N = 128, 24  # K a multiple of 128: the CUDA b1 tensor-core GEMM takes it above 64 rows
ROWS = {"small": 3, "gemm": 2100}  # above every GEMM threshold, CPU and CUDA, fp32 included
BATCH = {"small": 1, "gemm": 9}  # conv: 1 or 9 images of 16x16 (256 or 2304 output pixels)


def _linear_case(op, m, device):
    x = torch.randn(m, K, device=device)
    weight = torch.randn(N, K, device=device)
    bias = torch.randn(N, device=device)
    if op in ("binary_linear", "binary_weight_linear"):
        converted = convert_linear_weight(weight, "binary")
        float_args = {"x": x, "scale": converted["scale"], "bias": bias}
        return lambda a: getattr(torch.ops.bitcompile, op)(a["x"], converted["packed"], K, a["scale"], a["bias"]), float_args
    converted = convert_linear_weight(weight, "apot4")
    if op == "apot_linear":
        float_args = {"x": x, "code_values": converted["code_values"], "alpha": converted["alpha"], "bias": bias}
        return (lambda a: torch.ops.bitcompile.apot_linear(a["x"], converted["packed"], K, converted["bits"],
                                                         a["code_values"], a["alpha"], a["bias"]), float_args)
    q_x = torch.randint(0, 256, (m, K), dtype=torch.uint8, device=device)
    float_args = {"x_scale": torch.tensor(0.02, device=device), "alpha": converted["alpha"], "bias": bias}
    zero_point = torch.tensor(7, device=device)
    return (lambda a: torch.ops.bitcompile.apot_linear_int(
        q_x, a["x_scale"], zero_point, converted["packed"], K, converted["bits"], converted["code_numerators"],
        float(converted["denominator"]), a["alpha"], a["bias"]), float_args)


def _conv_case(op, batch, device):
    x = torch.randn(batch, 40, 16, 16, device=device)
    weight = torch.randn(8, 40, 3, 3, device=device)
    bias = torch.randn(8, device=device)
    geometry = ([3, 3], [1, 1], [1, 1], [1, 1])
    if op == "binary_conv2d":
        converted = convert_conv2d_weight(weight, "binary")
        float_args = {"x": x, "scale": converted["scale"], "bias": bias}
        return (lambda a: torch.ops.bitcompile.binary_conv2d(a["x"], converted["packed"], 40, *geometry, a["scale"],
                                                           a["bias"]), float_args)
    if op == "binary_conv2d_packed":  # x_bits are integers: only scale and bias can require grad
        converted = convert_conv2d_weight(weight, "binary")
        x_bits = torch.ops.bitcompile.pack_signs(x.permute(0, 2, 3, 1))
        float_args = {"scale": converted["scale"], "bias": bias}
        return (lambda a: torch.ops.bitcompile.binary_conv2d_packed(
            x_bits, converted["packed"], 40, *geometry, a["scale"], a["bias"], out_dtype=torch.float32), float_args)
    converted = convert_conv2d_weight(weight, "apot4")
    float_args = {"x": x, "code_values": converted["code_values"], "alpha": converted["alpha"], "bias": bias}
    return (lambda a: torch.ops.bitcompile.apot_conv2d(a["x"], converted["packed"], 40, *geometry, converted["bits"],
                                                     a["code_values"], a["alpha"], a["bias"]), float_args)


def _weight_op_case(op, m, device):
    """The backend's run-time weight ops, whose float weight may require grad too."""
    if op == "linear_of_weight":
        float_args = {"x": torch.randn(m, K, device=device), "weight": torch.randn(N, K, device=device),
                      "bias": torch.randn(N, device=device)}
        return (lambda a: torch.ops.bitcompile.linear_of_weight(a["x"], a["weight"], None, a["bias"],
                                                              weight_form="quantize:apot4"), float_args)
    float_args = {"x": torch.randn(max(1, m // 256), 40, 16, 16, device=device),
                  "weight": torch.randn(8, 40, 3, 3, device=device)}
    return (lambda a: torch.ops.bitcompile.conv2d_of_weight(a["x"], a["weight"], [1, 1], [1, 1], [1, 1],
                                                          weight_form="ste_sign", x_form="ste_sign"), float_args)


def _pack_case(op, m, device):
    if op == "pack_signs":
        return (lambda a: torch.ops.bitcompile.pack_signs(a["x"])), {"x": torch.randn(m, K, device=device)}
    codes = torch.randint(0, 16, (m, K), device=device)
    # pack_codes has no float input; requires_grad applies to nothing and the call must still work
    return (lambda a: torch.ops.bitcompile.pack_codes(codes, 4)), {}


CASES = {
    "pack_signs": _pack_case, "pack_codes": _pack_case,
    "binary_linear": _linear_case, "binary_weight_linear": _linear_case, "apot_linear": _linear_case,
    "apot_linear_int": _linear_case,
    "binary_conv2d": _conv_case, "binary_conv2d_packed": _conv_case, "apot_conv2d": _conv_case,
    "linear_of_weight": _weight_op_case, "conv2d_of_weight": _weight_op_case,
}


@pytest.mark.parametrize("requires_grad", [False, True], ids=["no_grad_inputs", "requires_grad"])
@pytest.mark.parametrize("path", ["small", "gemm"])
@pytest.mark.parametrize("op", list(CASES))
def test_inference_op_with_inputs_that_require_grad(op, path, requires_grad, device):
    make = CASES[op]
    size = BATCH[path] if make is _conv_case else ROWS[path]
    call, float_args = make(op, size, device)
    with torch.no_grad():
        expected = call(float_args)
    inputs = {name: t.detach().clone().requires_grad_(requires_grad) for name, t in float_args.items()}
    actual = call(inputs)  # grad enabled
    assert torch.equal(actual, expected), f"{op} ({path}): the result changed with grad enabled"
    if requires_grad and actual.is_floating_point():
        with pytest.raises(RuntimeError, match=rf"bitcompile::{op}: .*no gradient.*torch\.no_grad"):
            actual.sum().backward()


KERNEL_CASES = [op for op in CASES if op in ops.KERNEL_OPS]
# The kernel ops and the backend's weight ops without a Tensor[] input take the C++ Autograd kernel.
CPP_AUTOGRAD = {**ops._TRAINING_FORMS, **{op: weight_ops.TRAINING_FORM for op in weight_ops.CPP_AUTOGRAD_OPS}}


@pytest.mark.parametrize("op", [op for op in CASES if op in CPP_AUTOGRAD and not op.startswith("pack")])
def test_backward_error_is_the_python_kernels(op, device):
    """Once a device's library is loaded, its C++ Autograd kernel (csrc/inference_autograd.h, with its own copy of
    the training forms) serves the op: a backward raises word for word what ops.py's not_differentiable says."""
    call, float_args = CASES[op](op, BATCH["small"] if CASES[op] is _conv_case else ROWS["small"], device)
    torch.ops.bitcompile.pack_signs(torch.ones(1, 32, device=device))  # the device's library loaded
    inputs = {name: t.detach().clone().requires_grad_() for name, t in float_args.items()}
    with pytest.raises(RuntimeError) as from_backward:
        call(inputs).sum().backward()
    with pytest.raises(RuntimeError) as from_python:
        ops._not_differentiable_impl(None, [], None, op, CPP_AUTOGRAD[op])
    assert str(from_backward.value) == str(from_python.value)
    if op in weight_ops.CPP_AUTOGRAD_OPS:  # the C++ kernel's backward is a torch::autograd::Function
        assert "CppFunction" in type(call(inputs).grad_fn).__name__


def test_backward_error_under_compiled_autograd(device):
    """Compiled autograd calls the C++ kernel's backward at run time (a torch::autograd::Function that is not
    traceable), where it raises the op's error as the Python kernel's does."""
    call, float_args = CASES["binary_weight_linear"]("binary_weight_linear", ROWS["small"], device)
    inputs = {name: t.detach().clone().requires_grad_() for name, t in float_args.items()}
    loss = (call(inputs) * 2).sum()
    with torch._dynamo.compiled_autograd._enable(torch.compile(backend="eager")):
        with pytest.raises(RuntimeError, match=r"bitcompile::binary_weight_linear: .*no gradient"):
            loss.backward()


@pytest.mark.parametrize("grad", ["no_grad", "grad_enabled"])
def test_no_python_between_the_call_and_the_kernel(grad, device):
    """The Autograd kernel of a loaded inference op is C++: no Python of torch.library (register_autograd's
    autograd_impl) or of bitcompile runs on a call under no_grad or with no input that requires grad. A Python one
    cost more than the small CPU kernels themselves and made eager GPU calls host-bound."""
    ops.load_kernels(device)
    key = {"cpu": "AutogradCPU", "cuda": "AutogradCUDA"}[device]
    for name in ops.KERNEL_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"bitcompile::{name}", key), name
    for name in weight_ops.CPP_AUTOGRAD_OPS:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(f"bitcompile::{name}", key), name
    library = str(Path(torch.__file__).parent / "_library")
    watched = (str(Path(bitcompile.__file__).parent), library)
    # The weight ops' kernels are Python (weight_ops.py), but no Python of torch.library's autograd runs before them.
    for op in KERNEL_CASES + [op for op in CASES if op in weight_ops.CPP_AUTOGRAD_OPS]:
        if op in weight_ops.CPP_AUTOGRAD_OPS:
            watched = (library,)
        call, float_args = CASES[op](op, 1, device)
        call(float_args)  # anything a first call does once
        entered = []

        def profile(frame, event, arg):
            if event == "call" and frame.f_code.co_filename.startswith(watched):
                entered.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

        with torch.no_grad() if grad == "no_grad" else torch.enable_grad():
            sys.setprofile(profile)
            try:
                call(float_args)
            finally:
                sys.setprofile(None)
        assert not entered, f"{op}: Python ran on the way to the kernel: {entered}"


def test_quantized_llama_runs_with_grad_enabled():
    """The finding as reported: a quantize_'d LlamaForCausalLM (apot4, lm_head left float) called
    the ordinary way, grad enabled, gives the no_grad logits."""
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
    model = transformers.LlamaForCausalLM(config)
    quantize_(model, "apot4", filter=lambda fqn, kind: "lm_head" not in fqn)
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():
        expected = model(ids).logits
    logits = model(ids).logits
    assert torch.equal(logits, expected)
    with pytest.raises(RuntimeError, match=r"bitcompile::apot_linear: .*no gradient"):
        logits.sum().backward()
