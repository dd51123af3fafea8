"""Is a compiled forward host-bound? Host time to enqueue a forward against its wall time, for the binary and
float ResNet-18 of examples/bnn_resnet.py, and the host time of one call of each bitcompile conv op.

    python benchmarks/host_time.py                                   # CUDA: batch 256, 224x224, fp16
    python benchmarks/host_time.py --device cpu --batch 1 --size 32  # CPU (enqueue = wall there)

Where the host enqueue time a forward is as long as the wall time, the GPU waits for the host: kernel speed-ups
do not show in images/s (benchmarks/NOTES.md, twenty-fifth session).
"""

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
import bnn_resnet as R  # noqa: E402


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def per_call(fn, device, calls):
    """(host us a call to enqueue `calls` calls, wall us a call once they have run)."""
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    enqueued = time.perf_counter()
    sync(device)
    done = time.perf_counter()
    return 1e6 * (enqueued - start) / calls, 1e6 * (done - start) / calls


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--size", type=int, default=224)
    parser.add_argument("--forwards", type=int, default=20)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    images = images.to(dtype=dtype, memory_format=torch.channels_last)
    for name, binary in (("binary", "xnor"), ("float", False)):
        model = R.ResNet18(binary=binary).to(device)
        R.set_batchnorm_statistics(model, torch.randn(max(args.batch, 4), 3, args.size, args.size, device=device))
        model = model.to(dtype=dtype, memory_format=torch.channels_last)
        compiled = torch.compile(model, backend="bitcompile") if binary else torch.compile(model)
        for _ in range(3):
            compiled(images)
        for _ in range(3):
            host, wall = per_call(lambda: compiled(images), device, args.forwards)
            print(f"{name:>6} ResNet-18: host {host:7.0f} us a forward to enqueue, wall {wall:7.0f} us", flush=True)

    x = torch.randn(8, 512, 7, 7, device=device, dtype=dtype).to(memory_format=torch.channels_last)
    w = torch.randn(512, 512, 3, 3, device=device, dtype=dtype)
    x_bits = torch.ops.bitcompile.pack_signs(x.permute(0, 2, 3, 1))
    w_bits = torch.ops.bitcompile.pack_signs(w.permute(0, 2, 3, 1).contiguous())
    scale = torch.rand(512, device=device)
    geometry = ([1, 1], [1, 1], [1, 1])
    calls = {
        "packed_conv2d_of_weight": lambda: torch.ops.bitcompile.packed_conv2d_of_weight(
            x_bits, w, *geometry, scale, None, weight_form="ste_sign", out_dtype=dtype),
        "binary_conv2d_packed": lambda: torch.ops.bitcompile.binary_conv2d_packed(
            x_bits, w_bits, 512, [3, 3], *geometry, scale, None, out_dtype=dtype),
        "binary_conv2d_packed, sign words": lambda: torch.ops.bitcompile.binary_conv2d_packed(
            x_bits, w_bits, 512, [3, 3], *geometry, scale, None, out_dtype=torch.int32),
        "pack_signs": lambda: torch.ops.bitcompile.pack_signs(x.permute(0, 2, 3, 1)),
        "torch.add (for scale)": lambda: torch.add(scale, 1),
    }
    count = 2000 if device.type == "cuda" else 20
    for name, fn in calls.items():
        per_call(fn, device, max(1, count // 40))  # warm-up
        host, wall = per_call(fn, device, count)
        print(f"{name:>34}: host {host:6.1f} us a call, wall {wall:6.1f} us (B = 8, C = 512, 7x7)")


if __name__ == "__main__":
    main()
