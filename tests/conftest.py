"""Shared test fixtures: devices, fresh random seeds, dtype tolerances."""

import os
import random
import zlib

import pytest
import torch

import bitcompile  # noqa: F401  (registers the ops)

CUDA = torch.cuda.is_available()
DEVICES = ["cpu"] + (["cuda"] if CUDA else [])
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# Tolerances of DESIGN.md "Tests": fp32 ~1e-5 relative, fp16/bf16 ~1e-2.
TOLERANCE = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 1e-2}

requires_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def skip_without_wgmma():
    """Skips a dispatch test where no wgmma kernel can run: not a compute capability 9.0 GPU, or no sm_90a code."""
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the wgmma kernels run on compute capability 9.0 only")
    arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if arch_list and "9.0a" not in arch_list:
        pytest.skip("TORCH_CUDA_ARCH_LIST without 9.0a: no sm_90a code, no wgmma kernel")


def profiled_kernel_counts(call, op_kernels):
    """{name: launches} of the CUDA kernels one call() launches (after a first call that builds and loads them); skips
    where the profiler records none whose name contains one of op_kernels (no CUPTI)."""
    call()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
        call()
        torch.cuda.synchronize()
    counts = {event.key: event.count for event in profile.key_averages()}
    if not any(kernel in name for name in counts for kernel in op_kernels):
        pytest.skip(f"the profiler recorded none of the op's kernels (CUPTI?): {list(counts)}")
    return counts


def profiled_kernels(call, op_kernels):
    """Names of the CUDA kernels one call() launches (profiled_kernel_counts)."""
    return list(profiled_kernel_counts(call, op_kernels))


def pytest_configure(config):
    # Fresh random inputs every run (DESIGN.md); the seed is printed so a failure can be replayed
    # with BITCOMPILE_TEST_SEED=<seed>.
    seed = int(os.environ.get("BITCOMPILE_TEST_SEED", random.SystemRandom().randrange(2**31)))
    worker = getattr(config, "workerinput", None)  # a pytest-xdist worker runs on the controller's seed
    config._bitcompile_seed = worker["bitcompile_seed"] if worker is not None else seed


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    node.workerinput["bitcompile_seed"] = node.config._bitcompile_seed


def pytest_report_header(config):
    return f"bitcompile test seed: {config._bitcompile_seed} (set BITCOMPILE_TEST_SEED to replay)"


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    # -q (the README's and CI's command) drops the header: repeat the seed at the end, where a
    # failure's log is read.
    terminalreporter.write_line(pytest_report_header(config))


@pytest.fixture(autouse=True)
def _seed_each_test(request):
    seed = request.config._bitcompile_seed + zlib.crc32(request.node.nodeid.encode()) % 100003
    torch.manual_seed(seed)
    random.seed(seed)


@pytest.fixture(params=DEVICES)
def device(request):
    if request.param == "cuda":
        request.applymarker(pytest.mark.cuda)
    return request.param


def assert_close_relative(actual, expected, dtype, what="", magnitude=None):
    """‖actual - expected‖ / ‖expected‖ within the dtype's tolerance (METHOD.md's measure).

    `magnitude`, for outputs that are sums (per output: the root of the sum of the squared terms,
    plus |bias|), floors the denominator. With a handful of outputs, cancellation can make
    ‖expected‖ far smaller than the terms whose rounding the error comes from (one output of
    2049 terms of size ~1 summing to 0.03 failed an fp32 check at 2e-4); for random-sign sums the
    two norms agree, so the floor only steps in where cancellation happened.
    """
    actual = actual.double().cpu()
    expected = expected.double().cpu()
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert torch.isfinite(actual).all(), f"{what}: non-finite values"
    if expected.numel() == 0:
        return
    denominator = expected.norm()
    if magnitude is not None:
        assert magnitude.shape == expected.shape, f"{what}: magnitude shape {tuple(magnitude.shape)}"
        denominator = torch.maximum(denominator, magnitude.double().cpu().norm())
    error = (actual - expected).norm() / denominator.clamp_min(1e-30)
    assert error <= TOLERANCE[dtype], f"{what}: relative error {error:.3g} > {TOLERANCE[dtype]}"
