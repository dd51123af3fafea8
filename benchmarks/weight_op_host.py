"""Host time of the backend's weight ops against the kernel op each runs, on tiny tensors (the kernels' own time
is small there, so the difference is the weight op's path: the dispatcher, the weight's lookup, the call).

    python benchmarks/weight_op_host.py                  # CPU
    python benchmarks/weight_op_host.py --device cuda    # host time to enqueue (the GPU is not waited for)

A weight found in the C++ memo (csrc/weight_memo.h) costs its kernel op's time and a lookup; before the memo each
call ran the Python kernel (sixty-first session, 2-core CPU: packed_conv2d_of_weight 25.4 -> 16.1 us, its kernel op
13.0; linear_of_weight 11.0 -> 5.5, its kernel op 4.2; packed_linear_group of 3 members 19.8 -> 7.5).
"""

import argparse
import time

import torch

import bitcompile
from bitcompile.weight_ops import cached_kernel_weight


def best_us(fn, device, calls=4000, rounds=5):
    """Best of `rounds` averages of host microseconds a call (CUDA: to enqueue)."""
    for _ in range(300):
        fn()
    best = float("inf")
    for _ in range(rounds):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls // rounds):
            fn()
        best = min(best, (time.perf_counter() - start) / (calls // rounds) * 1e6)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return best


@torch.no_grad()
def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    device = torch.device(parser.parse_args().device)
    bitcompile.ops.load_kernels(device.type)
    bc = torch.ops.bitcompile
    torch.manual_seed(0)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    x_bits = bc.pack_signs(torch.randn(1, 4, 4, 64, device=device))
    w = torch.randn(64, 64, 3, 3, device=device)
    scale, bias = torch.rand(64, device=device), torch.randn(64, device=device)
    x = torch.randn(1, 256, device=device, dtype=dtype)
    w_linear = torch.randn(64, 256, device=device)
    members = [bc.pack_signs(torch.randn(32, 256, device=device)) for _ in range(3)]
    member_scales = [torch.rand(32, device=device) for _ in range(3)]
    member_biases = [torch.randn(32, device=device) for _ in range(3)]
    conv_bits = cached_kernel_weight(w, "ste_sign").packed
    linear_bits = cached_kernel_weight(w_linear, "ste_sign").packed
    geometry = ([1, 1], [1, 1], [1, 1])
    rows = {
        "packed_conv2d_of_weight": lambda: bc.packed_conv2d_of_weight(
            x_bits, w, *geometry, scale, bias, weight_form="ste_sign", out_dtype=torch.int32),
        "  its kernel op, binary_conv2d_packed": lambda: bc.binary_conv2d_packed(
            x_bits, conv_bits, 64, [3, 3], *geometry, scale, bias, out_dtype=torch.int32),
        "linear_of_weight": lambda: bc.linear_of_weight(x, w_linear, scale, bias, weight_form="ste_sign"),
        "  its kernel op, binary_weight_linear": lambda: bc.binary_weight_linear(x, linear_bits, 256, scale, bias),
        "packed_linear_group, 3 members": lambda: bc.packed_linear_group(
            x, members, 256, member_scales, member_biases, []),
    }
    print(f"torch {torch.__version__}, device {device}, bitcompile {bitcompile.__version__}")
    for name, fn in rows.items():
        print(f"{name:40s} {best_us(fn, device):7.1f} us a call (best of 5)", flush=True)


if __name__ == "__main__":
    main()
