"""The weight ops' C++ memo (csrc/weight_memo.h): a hit runs the kernel op without the Python kernel, with the
same result; a changed, swapped or freed weight, a dense form and every other call go to the Python kernel."""

import pytest
import torch

from bitcompile import ops, weight_ops

bc = torch.ops.bitcompile


@pytest.fixture
def python_calls(device, monkeypatch):
    """How many times the weight ops' Python kernel looked a weight up (each call that did not hit the memo)."""
    ops.load_kernels(device)
    assert weight_ops._memo_loaded()
    bc.forget_kernel_weights()
    calls = [0]
    original = weight_ops._kernel_weight_and_epilogue

    def counted(*args, **kwargs):
        calls[0] += 1
        return original(*args, **kwargs)

    monkeypatch.setattr(weight_ops, "_kernel_weight_and_epilogue", counted)
    yield calls
    bc.forget_kernel_weights()


def _python(fn):
    """fn() through the Python kernel (the memo emptied first; the Python cache still holds the weight)."""
    bc.forget_kernel_weights()
    return fn()


def _served(fn, calls, expect_hits=True):
    """fn()'s value on a miss (the Python kernel) and on two later calls; asserts the later calls did or did not
    reach Python, and that all three agree exactly."""
    first = _python(fn)
    before = calls[0]
    second, third = fn(), fn()
    assert (calls[0] == before) == expect_hits, f"Python kernel calls {calls[0] - before} on the two later calls"
    for later in (second, third):
        for a, b in zip(*(t if isinstance(t, tuple) else (t,) for t in (first, later))):
            assert torch.equal(a, b)
    return first


@pytest.mark.parametrize("case", ["float_x", "ste_sign_x", "sign_x_row_scale", "binary_grid", "apot4",
                                  "quantize_binary", "quantize_apot4"])
@torch.no_grad()
def test_linear_of_weight_hits_match_python(device, python_calls, case):
    x = torch.randn(3, 5, 70, device=device)
    w = torch.randn(13, 70, device=device)
    scale, bias = torch.rand(13, device=device) + 0.5, torch.randn(13, device=device)
    kwargs = {"weight_form": "ste_sign", "x_form": "float"}
    if case == "ste_sign_x":
        kwargs["x_form"] = "ste_sign"
    elif case == "sign_x_row_scale":
        x[0, 0, :7] = 0
        kwargs.update(x_form="sign", row_scale=True, weight_form="sign")
    elif case == "binary_grid":
        w = torch.where(w >= 0, 1.0, -1.0) * (torch.rand(13, 1, device=device) + 0.1)
        kwargs["weight_form"] = "binary_grid"
    elif case == "apot4":
        from bitcompile import apot

        codes, alpha = apot.quantize_weight(w, "apot4", True)
        w = apot.get_scheme("apot4").code_values.to(device)[codes.long()] * alpha.reshape(-1, 1)
        assert apot.is_on_grid(w, "apot4")
        kwargs["weight_form"] = "apot4"
    elif case.startswith("quantize_"):
        kwargs["weight_form"] = "quantize:" + case.split("_", 1)[1]
    _served(lambda: bc.linear_of_weight(x, w, scale, bias, **kwargs), python_calls)


@pytest.mark.parametrize("case", ["ste_sign_x", "sign_x", "float_x", "apot4", "apot4_pad_value", "quantize_binary"])
@torch.no_grad()
def test_conv2d_of_weight_hits_match_python(device, python_calls, case):
    """binary_conv2d, binary_weight_conv2d or apot_conv2d from the memo; an APoT weight with a pad value is dense
    math, so its calls stay in Python."""
    x = torch.randn(2, 37, 7, 6, device=device)
    w = torch.randn(9, 37, 3, 3, device=device)
    scale, bias = torch.rand(9, device=device) + 0.5, torch.randn(9, device=device)
    kwargs = {"weight_form": "ste_sign", "x_form": "ste_sign", "pad_value": 0.0}
    if case == "sign_x":
        x[0, :5, 0] = 0
        kwargs.update(x_form="sign", pad_value=-1.0)
    elif case == "float_x":
        kwargs["x_form"] = "float"
    elif case.startswith("apot4"):
        from bitcompile import apot

        codes, alpha = apot.quantize_weight(w, "apot4", True)
        w = apot.get_scheme("apot4").code_values.to(device)[codes.long()] * alpha.reshape(-1, 1, 1, 1)
        kwargs.update(weight_form="apot4", x_form="float", pad_value=1.0 if case.endswith("pad_value") else 0.0)
    elif case == "quantize_binary":
        kwargs.update(weight_form="quantize:binary", x_form="float")
    _served(lambda: bc.conv2d_of_weight(x, w, [1, 2], [1, 1], [1, 1], scale, bias, **kwargs), python_calls,
            expect_hits=case != "apot4_pad_value")


@pytest.mark.parametrize("out_dtype", [torch.float32, torch.float16, torch.int32])
@pytest.mark.parametrize("with_signs", [False, True])
@torch.no_grad()
def test_packed_conv2d_of_weight_hits_match_python(device, python_calls, out_dtype, with_signs):
    if with_signs and out_dtype == torch.int32:
        pytest.skip("with_signs takes a float out_dtype")
    x_bits = bc.pack_signs(torch.randn(2, 6, 7, 37, device=device))
    w = torch.randn(9, 37, 3, 3, device=device)
    scale, bias = torch.rand(9, device=device) + 0.5, torch.randn(9, device=device)
    residual = None
    if out_dtype != torch.int32:
        residual = torch.randn(2, 9, 3, 7, device=device, dtype=out_dtype).contiguous(memory_format=torch.channels_last)
    op = bc.packed_conv2d_of_weight_with_signs if with_signs else bc.packed_conv2d_of_weight
    _served(lambda: op(x_bits, w, [2, 1], [1, 1], [1, 1], scale, bias, None, "", residual, weight_form="ste_sign",
                       out_dtype=out_dtype, pad_value=-1.0), python_calls)


@torch.no_grad()
def test_epilogue_function_entries(device, python_calls):
    """epilogue_fn's scale and bias come from the memo too, keyed on the function's inputs as well as the weight."""
    gamma = torch.rand(9, device=device) + 0.5
    beta = torch.randn(9, device=device)
    w = torch.randn(9, 37, 3, 3, device=device)

    class Fold(torch.nn.Module):
        def forward(self, weight, g, b):
            return weight.abs().mean((1, 2, 3)) * g, b

    fn = weight_ops.register_weight_function(torch.fx.symbolic_trace(Fold()))
    x_bits = bc.pack_signs(torch.randn(2, 5, 5, 37, device=device))

    def call():
        return bc.packed_conv2d_of_weight(x_bits, w, [1, 1], [1, 1], [1, 1], None, None, [w, gamma, beta], fn,
                                          weight_form="ste_sign", out_dtype=torch.float32)

    first = _served(call, python_calls)
    expected = bc.binary_conv2d_packed(x_bits, weight_ops.kernel_weight(w, "ste_sign").packed, 37, [3, 3], [1, 1],
                                       [1, 1], [1, 1], w.abs().mean((1, 2, 3)) * gamma, beta,
                                       out_dtype=torch.float32)
    torch.testing.assert_close(first, expected)
    gamma.mul_(2)  # an input of the function changed: the memo's entry is stale
    before = python_calls[0]
    doubled = call()
    assert python_calls[0] == before + 1
    torch.testing.assert_close(doubled - beta.reshape(1, -1, 1, 1), 2 * (first - beta.reshape(1, -1, 1, 1)))
    # scale given beside an epilogue function: the Python kernel's error, memo or not
    with pytest.raises(RuntimeError, match="scale and bias must be None"):
        bc.packed_conv2d_of_weight(x_bits, w, [1, 1], [1, 1], [1, 1], gamma, None, [w, gamma, beta], fn,
                                   weight_form="ste_sign", out_dtype=torch.float32)


@torch.no_grad()
def test_changed_swapped_and_freed_weights_are_converted_again(device, python_calls):
    x = torch.randn(4, 40, device=device)
    w = torch.nn.Parameter(torch.randn(8, 40, device=device))

    def check():
        y = bc.linear_of_weight(x, w, weight_form="ste_sign", x_form="float")
        torch.testing.assert_close(y, x @ torch.where(w >= 0, 1.0, -1.0).T)

    check()
    check()
    calls = python_calls[0]
    check()
    assert python_calls[0] == calls, "an unchanged weight went to Python"
    w.mul_(-1)  # in place: a new version
    check()
    assert python_calls[0] == calls + 1
    w.data = -w.data  # a new storage, version unchanged
    check()
    w.data = w.data.t().contiguous().t()  # the same values, other strides
    check()
    for _ in range(5):  # freed and made again: a new storage, maybe at the old address, version 0 again
        del w
        w = torch.nn.Parameter(torch.randn(8, 40, device=device))
        check()
        check()


@torch.no_grad()
def test_dense_forms_and_inference_tensors_stay_in_python(device, python_calls):
    x = torch.randn(3, 40, device=device)
    w = torch.randn(8, 40, device=device)
    w[0, 3] = 0  # torch.sign weight with an exact zero: no packed form, dense math
    expected = torch.sign(x) @ torch.sign(w).T
    _served(lambda: bc.linear_of_weight(x, w, weight_form="sign", x_form="sign"), python_calls, expect_hits=False)
    torch.testing.assert_close(bc.linear_of_weight(x, w, weight_form="sign", x_form="sign"), expected)
    assert bc.forget_kernel_weights() == 0
    with torch.inference_mode():
        frozen = torch.randn(8, 40, device=device)  # an inference tensor: no version counter, nothing cached
        _served(lambda: bc.linear_of_weight(x, frozen, weight_form="ste_sign"), python_calls, expect_hits=False)
    assert bc.forget_kernel_weights() == 0


def test_inference_mode_and_grad_mode_calls_hit(device, python_calls):
    """The memo sits below autograd (BackendSelect): calls under inference_mode hit it too, and a weight that
    requires grad under no_grad as well; with grad enabled the op still refuses the gradient."""
    x = torch.randn(3, 40, device=device)
    w = torch.nn.Parameter(torch.randn(8, 40, device=device))
    with torch.no_grad():
        expected = _python(lambda: bc.linear_of_weight(x, w, weight_form="ste_sign"))
    before = python_calls[0]
    with torch.inference_mode():
        torch.testing.assert_close(bc.linear_of_weight(x, w, weight_form="ste_sign"), expected)
    assert python_calls[0] == before
    y = bc.linear_of_weight(x, w, weight_form="ste_sign")  # grad enabled: runs, and its backward raises
    torch.testing.assert_close(y.detach(), expected)
    with pytest.raises(RuntimeError, match="linear_of_weight"):
        y.sum().backward()


def test_weight_cache_clear_empties_the_memo(device, python_calls):
    x = torch.randn(3, 40, device=device)
    w = torch.randn(8, 40, device=device)
    with torch.no_grad():
        bc.linear_of_weight(x, w, weight_form="ste_sign")
    weight_ops.weight_cache.clear()
    assert bc.forget_kernel_weights() == 0
    conversions = weight_ops.weight_cache.conversions
    with torch.no_grad():
        bc.linear_of_weight(x, w, weight_form="ste_sign")
    assert weight_ops.weight_cache.conversions == conversions + 1
    assert bc.forget_kernel_weights() == 1


@pytest.mark.parametrize("bits", [0, 4])
@torch.no_grad()
def test_packed_linear_group_hits_match_python(device, python_calls, bits, monkeypatch):
    """packed_linear_group's stacked members come from the memo; a member changed in place is stacked again."""
    lookups = [0]  # the group's Python kernel: one weight_cache lookup a call
    original = weight_ops.weight_cache.get_for

    def counted(inputs, tag, *args, **kwargs):
        lookups[0] += tag.startswith("group:")
        return original(inputs, tag, *args, **kwargs)

    monkeypatch.setattr(weight_ops.weight_cache, "get_for", counted)
    x = torch.randn(2, 70, device=device, dtype=torch.float32)
    sizes = (5, 9, 3)
    if bits == 0:
        w_packed = [bc.pack_signs(torch.randn(n, 70, device=device)) for n in sizes]
        code_values = []
    else:
        from bitcompile import apot

        w_packed = [bc.pack_codes(torch.randint(0, 16, (n, 70), device=device, dtype=torch.uint8), 4) for n in sizes]
        code_values = [apot.get_scheme("apot4").code_values.to(device)] * 3
    scale = [torch.rand(n, device=device) + 0.5 for n in sizes]
    bias = [torch.randn(n, device=device) for n in sizes]
    call = lambda: bc.packed_linear_group(x, w_packed, 70, scale, bias, code_values, bits=bits)  # noqa: E731
    first = _served(call, lookups)
    members = []
    for i in range(3):
        if bits == 0:
            members.append(bc.binary_weight_linear(x, w_packed[i], 70, scale[i], bias[i]))
        else:
            members.append(bc.apot_linear(x, w_packed[i], 70, bits, code_values[i], scale[i], bias[i]))
    torch.testing.assert_close(first, torch.cat(members, -1))
    bias[1].add_(1.0)  # a member changed: the Python kernel stacks again, then the memo serves
    before = lookups[0]
    second = call()
    torch.testing.assert_close(second[:, 5:14], first[:, 5:14] + 1.0)
    call()
    assert lookups[0] == before + 1
