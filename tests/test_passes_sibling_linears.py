"""bitcompile.passes.sibling_linears: packed linears that read the same x (q / k / v, SwiGLU's w1 / w3) run as one
packed_linear_group call on their stacked weights, stacked once per version of the members' tensors: the members'
results (to rounding: the stacked call may sum K in another order), in-place updates seen, and the op checks its
arguments like the member ops."""

import os
import sys

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch._dynamo.utils import counters

import bitcompile  # noqa: F401
from bitcompile import weight_ops
from bitcompile.quantize import quantize_

sys.path.insert(0, os.path.dirname(__file__))
from conftest import DEVICES  # noqa: E402
from test_backend import _fresh_dynamo  # noqa: E402,F401  (autouse: Dynamo and the counters reset around each test)

SCHEMES = ["binary_weight", "apot4", "apot3"]


class Siblings(nn.Module):
    """Attention-like q / k / v of different widths (one with a bias) and a SwiGLU pair; views of each output."""

    def __init__(self, dim=72, heads=3):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(dim, 48, bias=False)
        self.k = nn.Linear(dim, 24, bias=False)
        self.v = nn.Linear(dim, 24, bias=False)
        self.w1 = nn.Linear(dim, 40, bias=True)
        self.w3 = nn.Linear(dim, 40, bias=True)
        self.out = nn.Linear(40, 16, bias=False)

    def forward(self, x):
        b, length, _ = x.shape
        q = self.q(x).view(b, length, self.heads, -1)
        k = self.k(x).view(b, length, self.heads, -1)
        v = self.v(x)
        h = F.silu(self.w1(x)) * self.w3(x)
        return self.out(h) + q.sum((-1, -2), keepdim=False)[..., None] - k.amax((-1, -2))[..., None] + v[..., :16]


def _model(scheme, device, dtype):
    torch.manual_seed(0)
    return quantize_(Siblings().to(device=device, dtype=dtype), scheme)


@torch.no_grad()
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("rows", [1, 5])
def test_siblings_merge_and_match_eager(scheme, device, rows):
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = _model(scheme, device, dtype)
    x = torch.randn(2, rows, 72, device=device, dtype=dtype)
    expected = model(x)
    out = torch.compile(model, backend="bitcompile")(x)
    # q / k / v (no bias) and w1 / w3 (bias): two groups, five members; the output layer reads another x
    assert counters["bitcompile"]["sibling_linears"] == 5
    tolerance = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(out, expected, rtol=tolerance, atol=tolerance * expected.abs().max().item())


@torch.no_grad()
@pytest.mark.parametrize("device", DEVICES)
def test_siblings_see_in_place_updates(device):
    model = _model("binary_weight", device, torch.float32)
    x = torch.randn(2, 3, 72, device=device)
    compiled = torch.compile(model, backend="bitcompile")
    compiled(x)
    conversions = weight_ops.weight_cache.conversions
    compiled(x)
    assert weight_ops.weight_cache.conversions == conversions  # stacked once, not per call
    model.k.w_packed.copy_(torch.randint_like(model.k.w_packed, -2**31, 2**31 - 1))
    model.w3.bias.mul_(-3.0)
    torch.testing.assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)
    assert weight_ops.weight_cache.conversions == conversions + 2  # both groups stacked again


@torch.no_grad()
def test_siblings_not_merged_across_inputs_or_forms():
    class Mixed(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=True)  # bias on one only
            self.c, self.d = nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=False)  # different inputs

        def forward(self, x):
            return self.a(x) + self.b(x) + self.c(x) + self.d(x * 2)

    model = quantize_(Mixed(), "binary_weight")
    x = torch.randn(3, 64)
    out = torch.compile(model, backend="bitcompile")(x)
    assert counters["bitcompile"]["sibling_linears"] == 2  # a and c: same x, neither with a bias
    torch.testing.assert_close(out, model(x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
def test_siblings_not_merged_across_an_in_place_write_of_a_member():
    """A member's scale written in place between two members' calls: merged, the later member would read it at the
    first one's place, before the write."""

    class Rescaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(64, 32, bias=False), nn.Linear(64, 32, bias=False)

        def forward(self, x):
            y = self.a(x)
            self.b.scale.mul_(2.0)
            return y + self.b(x)

    model = quantize_(Rescaled(), "binary_weight")
    reference = quantize_(Rescaled(), "binary_weight")
    reference.load_state_dict(model.state_dict())
    x = torch.randn(3, 64)
    out = torch.compile(model, backend="bitcompile")(x)
    assert counters["bitcompile"]["sibling_linears"] == 0
    torch.testing.assert_close(out, reference(x), rtol=1e-4, atol=1e-4)


@torch.no_grad()
@pytest.mark.parametrize("device", DEVICES)
def test_group_op_matches_members_and_opcheck(device):
    """packed_linear_group against the member ops called one by one, with a scalar and a vector scale, one APoT
    group with a shared table and one with different tables (a call a member)."""
    x = torch.randn(3, 70, device=device)
    w = [torch.randint(-2**31, 2**31 - 1, (n, 3), dtype=torch.int32, device=device) for n in (5, 7)]
    scale = [torch.rand(5, device=device), torch.rand(1, device=device)]
    bias = [torch.randn(5, device=device), torch.randn(7, device=device)]
    args = (x, w, 70, scale, bias, [])
    expected = torch.cat([torch.ops.bitcompile.binary_weight_linear(x, *member)
                          for member in zip(w, [70, 70], scale, bias)], -1)
    torch.testing.assert_close(torch.ops.bitcompile.packed_linear_group(*args), expected, rtol=1e-5, atol=1e-5)
    torch.library.opcheck(torch.ops.bitcompile.packed_linear_group, args)
    codes = [torch.randint(0, 256, (n, 35), dtype=torch.uint8, device=device) for n in (6, 9)]
    alpha = [torch.rand(6, device=device), torch.rand(9, device=device)]
    table = bitcompile.apot.get_scheme("apot4").code_values.to(device)
    for tables in ([table, table.clone()], [table, table * 0.5]):
        args = (x, codes, 70, alpha, [], tables)
        expected = torch.cat([torch.ops.bitcompile.apot_linear(x, c, 70, 4, t, a) for c, t, a in zip(codes, tables, alpha)],
                             -1)
        out = torch.ops.bitcompile.packed_linear_group(*args, bits=4)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        torch.library.opcheck(torch.ops.bitcompile.packed_linear_group, args, {"bits": 4})


def test_group_op_errors_name_the_op():
    x = torch.randn(3, 70)
    w = torch.zeros(5, 3, dtype=torch.int32)
    bad = [
        ((x, [w, torch.zeros(4, 2, dtype=torch.int32)], 70, [], [], []), {}, "wide"),
        ((x, [w], 70, [torch.rand(4)], [], []), {}, "scale"),
        ((x, [w, w], 70, [], [torch.rand(5)], []), {}, "bias must hold"),
        ((x, [], 70, [], [], []), {}, "at least one"),
        ((x, [torch.zeros(5, 35, dtype=torch.uint8)], 70, [torch.rand(5)], [], [torch.rand(4)]), {"bits": 4},
         "entries"),
    ]
    for args, kwargs, message in bad:
        with pytest.raises(RuntimeError, match=f"bitcompile::packed_linear_group: .*{message}"):
            torch.ops.bitcompile.packed_linear_group(*args, **kwargs)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@torch.no_grad()
def test_cuda_siblings_under_reduce_overhead():
    """CUDA graphs: the stacked weights are made at the first call, outside the graphs' pool, and replays read them."""
    model = _model("binary_weight", "cuda", torch.bfloat16)
    x = torch.randn(1, 1, 72, device="cuda", dtype=torch.bfloat16)
    compiled = torch.compile(model, backend="bitcompile", mode="reduce-overhead")
    for _ in range(4):
        out = compiled(x)
    conversions = weight_ops.weight_cache.conversions
    for _ in range(3):
        out = compiled(x)
    torch.cuda.synchronize()
    assert weight_ops.weight_cache.conversions == conversions
    assert counters["bitcompile"]["sibling_linears"] == 5
    torch.testing.assert_close(out.clone(), model(x), rtol=3e-2, atol=3e-2)
