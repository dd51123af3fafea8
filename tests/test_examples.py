"""Smoke tests of examples/: each script runs at its --tiny size in a subprocess, exits 0 and prints
its key lines. They check that the examples work end to end, not accuracy or speed targets."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def run_example(name, *args, timeout=300):
    env = dict(os.environ)
    # One OpenMP thread unless the caller chose: the smoke runs are tiny, and several threads
    # competing for a small, busy CI machine only make them slower.
    env.setdefault("OMP_NUM_THREADS", "1")
    result = subprocess.run([sys.executable, str(EXAMPLES / name), *args], capture_output=True, text=True,
                            timeout=timeout, env=env, cwd=EXAMPLES.parent)
    assert result.returncode == 0, (f"{name} {' '.join(args)} exited with {result.returncode}\n"
                                    f"stdout:\n{result.stdout[-4000:]}\nstderr:\n{result.stderr[-4000:]}")
    return result.stdout


def test_train_bnn_digits():
    if importlib.util.find_spec("sklearn") is None:
        pytest.skip("scikit-learn is not installed (the digits data set ships with it): pip install scikit-learn")
    out = run_example("train_bnn_digits.py", "--tiny", "--device", "cpu")
    assert "epoch  1/1" in out and "train acc" in out
    assert "test accuracy" in out
    assert "compiled vs eager: agree" in out
    assert "layers rewritten" in out and "binary_conv2d" in out and "binary_linear" in out
    assert "KiB lowered" in out
    assert "loaded program agrees" in out


def test_llm_decode():
    out = run_example("llm_decode.py", "--tiny", "--device", "cpu")
    summary = out.split("summary", 1)[1]
    for model in ("float", "binary_weight", "apot4"):
        assert model in summary
    assert "tokens/s" in out and "MiB" in summary


def test_bnn_resnet():
    out = run_example("bnn_resnet.py", "--tiny")
    # explain: the 16 binary 3x3 convs of layer1-4 on binary_conv2d; stem, downsample and fc left float
    assert "binary 3x3 convs rewritten to binary_conv2d: 16 of 16; other layers rewritten: 0" in out
    assert "bitcompile: 16 of 21 layers rewritten" in out
    summary = out.split("summary", 1)[1]
    assert "float, inductor" in summary and "binary, bitcompile" in summary and "images/s" in summary
    # the rewrite alone (rest of the graph eager) reproduces the eager binary model bit for bit
    assert "bitcompile, rest of the graph eager  0.000e+00  (tolerance 0: exact)" in summary

def test_bnn_resnet_weights_only():
    out = run_example("bnn_resnet.py", "--tiny", "--weights-only")
    assert "binary 3x3 convs rewritten to binary_weight_conv2d: 16 of 16; other layers rewritten: 0" in out
    assert "(tolerance 1e-4 of the largest: within fp32 rounding)" in out


def test_export_deploy():
    out = run_example("export_deploy.py", "--tiny")
    assert "binary_linear" in out
    assert "fresh process" in out and ": agree" in out
    assert "x smaller" in out
    assert "agrees with the original model" in out


def test_quickstart():
    out = run_example("quickstart.py")
    assert "max |bitcompile - float reference| = 0" in out
    assert "OK" in out.splitlines()[-1]


def test_resnet_floor_matches_the_model():
    """benchmarks/resnet_floor.py's list of binary convs (the floor it prints) is bnn_resnet's: every XNORConv2d's
    input and output shape, in forward order, at a small batch and image size."""
    import importlib.util as util

    import torch

    def load(path, name):
        spec = util.spec_from_file_location(name, path)
        module = util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    resnet = load(EXAMPLES / "bnn_resnet.py", "bnn_resnet_for_floor")
    floor = load(EXAMPLES.parent / "benchmarks" / "resnet_floor.py", "resnet_floor")
    model = resnet.ResNet18(binary="xnor", classes=10).eval()
    seen = []
    for name, module in model.named_modules():
        if isinstance(module, resnet.XNORConv2d):
            module.register_forward_hook(lambda m, inputs, out, name=name: seen.append(
                (name, out.shape[0] * out.shape[2] * out.shape[3], inputs[0].shape[1], out.shape[1],
                 inputs[0].shape[0] * inputs[0].shape[2] * inputs[0].shape[3])))
    with torch.no_grad():
        model(torch.randn(3, 3, 64, 64))
    assert [row[:5] for row in floor.convs(3, 64)] == seen
    out = subprocess.run([sys.executable, str(EXAMPLES.parent / "benchmarks" / "resnet_floor.py")],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    assert "all 16" in out and "speedup at that floor" in out
