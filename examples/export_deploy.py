"""Deploy a binary model: torch.export, bitcompile.lower, torch.export.save, load in a fresh process.

    python examples/export_deploy.py                  # exports, lowers, saves, checks in a new process
    python examples/export_deploy.py --out model.pt2  # keep the lowered program
    python examples/export_deploy.py --load model.pt2 --inputs inputs.pt   # what the new process runs
    python examples/export_deploy.py --tiny           # a smaller model (smoke test)

What it shows:
- a small binary MLP written in plain PyTorch: a float input layer, an XNOR-Net layer spelled with
  bitcompile.ste_sign (sign of the activations and of the weights, times mean|W| per output row),
  a bitcompile.nn.BinaryLinear, and a float output layer;
- `bitcompile.lower(torch.export.export(model, ...))` turns the binary layers into bitcompile ops on
  packed weights (1 bit a weight) that live in the program's state, so the saved file shrinks;
- the saved program loads in a new Python process after `import bitcompile` (which registers the
  ops; the program does not call the model's Python code) and gives the original model's outputs.
"""

import argparse
import os
import subprocess
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import bitcompile
from bitcompile.nn import BinaryLinear


class XnorLinear(nn.Linear):
    """XNOR-Net layer in plain PyTorch: (sign(x) @ sign(W).T) * mean|W| per output row + bias."""

    def forward(self, x):
        alpha = self.weight.abs().mean(dim=1)
        return F.linear(bitcompile.ste_sign(x), bitcompile.ste_sign(self.weight)) * alpha + self.bias


class BinaryMLP(nn.Module):
    def __init__(self, features=128, hidden=1024, classes=10):
        super().__init__()
        self.fc_in = nn.Linear(features, hidden)                       # float: first layer
        self.norm1 = nn.BatchNorm1d(hidden)
        self.xnor = XnorLinear(hidden, hidden)                         # binary (ste_sign spelling)
        self.norm2 = nn.BatchNorm1d(hidden)
        self.binary = BinaryLinear(hidden, hidden)                     # binary (bitcompile.nn layer)
        self.norm3 = nn.BatchNorm1d(hidden)
        self.fc_out = nn.Linear(hidden, classes)                       # float: last layer

    def forward(self, x):
        x = self.norm1(self.fc_in(x))
        x = self.norm2(self.xnor(x))
        x = self.norm3(self.binary(x))
        return self.fc_out(x)


def kib(path):
    return os.path.getsize(path) / 1024


def export_and_lower(model, x):
    """(exported float program, lowered program); the batch dimension stays dynamic."""
    batch = torch.export.Dim("batch")
    exported = torch.export.export(model, (x,), dynamic_shapes=({0: batch},))
    return exported, bitcompile.lower(exported)


def run_saved_program(program_path, inputs_path):
    """What the fresh process does: load the lowered program, run it, compare with the expected output."""
    saved = torch.load(inputs_path)
    program = torch.export.load(program_path)
    with torch.no_grad():
        output = program.module()(saved["x"])
    max_diff = (output - saved["expected"]).abs().max().item()
    agree = torch.allclose(output, saved["expected"], rtol=1e-5, atol=1e-5)
    print(f"fresh process: loaded {os.path.basename(program_path)}, ran batch {saved['x'].shape[0]}, "
          f"max |difference| to the original model {max_diff:.2e}: {'agree' if agree else 'DISAGREE'}")
    return 0 if agree else 1


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="where to write the lowered program (default: a temporary folder)")
    parser.add_argument("--load", help="load this lowered program and check it (what the fresh process runs)")
    parser.add_argument("--inputs", help="with --load: the file of inputs and expected outputs")
    parser.add_argument("--tiny", action="store_true", help="a smaller model, for a smoke test")
    args = parser.parse_args()
    if args.load:
        return run_saved_program(args.load, args.inputs)

    torch.manual_seed(0)
    model = BinaryMLP(hidden=256 if args.tiny else 1024)
    model.train()
    with torch.no_grad():
        model(torch.randn(64, 128))  # sets BinaryLinear's scale_a and the BatchNorm statistics
    model.eval()

    x = torch.randn(16, 128)
    with torch.no_grad():
        expected = model(x)
    exported, lowered = export_and_lower(model, torch.randn(8, 128))
    print(bitcompile.explain(exported))

    with tempfile.TemporaryDirectory() as folder:
        float_path = os.path.join(folder, "binary_mlp_float.pt2")
        lowered_path = args.out or os.path.join(folder, "binary_mlp_lowered.pt2")
        inputs_path = os.path.join(folder, "inputs.pt")
        torch.export.save(exported, float_path)
        torch.export.save(lowered, lowered_path)
        torch.save({"x": x, "expected": expected}, inputs_path)
        print(f"saved: {kib(float_path):.1f} KiB exported (float weights), "
              f"{kib(lowered_path):.1f} KiB lowered (packed weights)")

        # A new Python process running this script with --load: it shares no state with this one.
        fresh = subprocess.run([sys.executable, os.path.abspath(__file__), "--load", lowered_path,
                                "--inputs", inputs_path], capture_output=True, text=True)
        print(fresh.stdout.strip())
        if fresh.returncode != 0:
            print(fresh.stderr[-3000:], file=sys.stderr)
        float_kib, lowered_kib = kib(float_path), kib(lowered_path)

    print("\nsummary")
    print(f"  file size: {float_kib:.1f} KiB before lowering -> {lowered_kib:.1f} KiB after "
          f"({float_kib / lowered_kib:.1f}x smaller)")
    print(f"  lowered program in a fresh process: {'agrees with' if fresh.returncode == 0 else 'DIFFERS from'} "
          "the original model")
    return fresh.returncode


if __name__ == "__main__":
    sys.exit(main())
