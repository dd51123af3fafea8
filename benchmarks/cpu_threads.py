"""How the CPU kernels scale with threads, against the dense fp32 op at the same thread count (oneDNN / MKL).

    python benchmarks/cpu_threads.py                 # 1, 2, 4, ... up to the cores torch sees
    python benchmarks/cpu_threads.py --threads 1 16

Why: on the GPU machine's host (16-core Intel Xeon, 2026-12-05) bench_ops' CPU rows came out far below this 2-core
AMD machine's (binary_weight_conv2d B=8 C=128 28x28 0.56x fp32 there, 1.7-2.0x here; binary_conv2d B=8 C=128 14x14
3.8x, ~11x here). This tells a kernel that stops scaling (the same ratio drop on any many-core machine) from one that
runs slower on that microarchitecture (the ratio already low at one thread).
"""

import argparse

import torch
import torch.nn.functional as F
from bench_ops import time_cpu_pair  # benchmarks/bench_ops.py: medians (us) of alternating rounds

from bitcompile import ops


def problems():
    """(label, ours, dense) for the CPU rows of bench_ops, fp32, channels_last activations."""
    torch.manual_seed(0)
    rows = []
    for op, batch, channels, size in (("binary_weight_conv2d", 8, 128, 28), ("binary_conv2d", 8, 128, 14)):
        x = torch.randn(batch, channels, size, size).contiguous(memory_format=torch.channels_last)
        w = torch.randn(channels, channels, 3, 3)
        dense = w.contiguous(memory_format=torch.channels_last)
        packed = ops.pack_signs(w.permute(0, 2, 3, 1))
        kernel = getattr(torch.ops.bitcompile, op)
        rows.append((f"{op} 3x3 B={batch} C={channels} {size}x{size}",
                     lambda x=x, packed=packed, kernel=kernel, c=channels: kernel(x, packed, c, [3, 3], [1, 1], [1, 1],
                                                                                   [1, 1]),
                     lambda x=x, dense=dense: F.conv2d(x, dense, padding=1)))
    n = k = 4096
    w = torch.randn(n, k)
    packed = ops.pack_signs(w)
    for m in (1, 64):
        x = torch.randn(m, k)
        rows.append((f"binary_weight_linear M={m} N=K={n}",
                     lambda x=x: torch.ops.bitcompile.binary_weight_linear(x, packed, k),
                     lambda x=x: F.linear(x, w)))
    x = torch.randn(64, k)
    rows.append((f"binary_linear W1A1 M=64 N=K={n}", lambda: torch.ops.bitcompile.binary_linear(x, packed, k),
                 lambda: F.linear(x, w)))
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cores = torch.get_num_threads()
    default = sorted({1 << i for i in range(cores.bit_length()) if (1 << i) <= cores} | {cores})
    parser.add_argument("--threads", type=int, nargs="+", default=default)
    parser.add_argument("--rounds", type=int, default=9, help="alternating rounds of ~50 ms each")
    args = parser.parse_args()
    rows = problems()
    print("| op | " + " | ".join(f"{t} threads: ours / fp32 us (ratio)" for t in args.threads) + " |")
    print("|---|" + "---|" * len(args.threads))
    for label, ours, dense in rows:
        cells = []
        for threads in args.threads:
            torch.set_num_threads(threads)
            a, b = time_cpu_pair(ours, dense, args.rounds)
            cells.append(f"{a:.0f} / {b:.0f} ({b / a:.2f}x)")
        print(f"| {label} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
