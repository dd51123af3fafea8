"""The HBM floor of bitcompile's kernels in examples/bnn_resnet.py's binary ResNet-18, and the speedup it bounds.

    python benchmarks/resnet_floor.py       # batch 256, 224x224, fp16; an H100's bandwidths and profile
    python benchmarks/resnet_floor.py --bandwidth 4.4 --float-us F --shared-us S    # an H200, with its profile's F, S

What bitcompile's passes leave for its kernels (explain() of the compiled model): the 16 binary 3x3 convs, each
reading its input as sign words (1 bit a channel) and writing
- conv1 of a block: sign words only (bn1 and the sign folded into the epilogue);
- conv2 of a block: the fp16 sum bn2(conv) + identity (the residual stream, read and written at 2 bytes a value)
  and its sign words for the next block.
So the bytes are the residual stream's fp16 traffic plus the sign words; the binary ops (2 * pixels * OC * 9 * C)
run at 15.5 POPS (wgmma b1, DESIGN.md). The floor is max(bytes / bandwidth, ops / 15.5 POPS) a conv, summed.
With the kernels of the float part both models share (--shared-us, from `bnn_resnet.py --profile`: the binary
model's kernels a forward less bitcompile's binary_conv2d kernels) and the float model's (--float-us), the speedup
bitcompile's kernels could give at their floor is float / (shared + floor). The defaults are the sixty-second
session's H100 profile (RESULTS.md) and the H100's HBM (3.0 TB/s reached, 3.35 peak); a bound for another GPU needs
that GPU's bandwidth and profile.
"""

import argparse

B1_OPS_PER_S = 15.5e15   # wgmma b1 AND.POPC, DESIGN.md


def convs(batch, size):
    """(name, pixels out, in channels, out channels, pixels in, output bytes a value or 0 for sign words only)."""
    rows, channels, hw = [], 64, size // 4           # after the stem (stride 2) and the max-pool (stride 2)
    for layer, planes in enumerate((64, 128, 256, 512)):
        for block in range(2):
            stride = 2 if layer > 0 and block == 0 else 1
            out_hw = hw // stride
            pixels_in, pixels = batch * hw * hw, batch * out_hw * out_hw
            rows.append((f"layer{layer + 1}.{block}.conv1", pixels, channels, planes, pixels_in, 0))
            rows.append((f"layer{layer + 1}.{block}.conv2", pixels, planes, planes, pixels, 2))
            channels, hw = planes, out_hw
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--bandwidth", type=float, action="append",
                   help="HBM TB/s (repeatable; default 3.0 and 3.35, the H100's; the H200's: 4.4 and 4.8)")
    p.add_argument("--float-us", type=float, default=3607.0, help="the float model's kernels a forward (us)")
    p.add_argument("--shared-us", type=float, default=1594.0,
                   help="the binary model's kernels a forward less bitcompile's (us)")
    args = p.parse_args()
    bandwidths = args.bandwidth or [3.0, 3.35]

    total_bytes = total_ops = 0.0
    floors_us = {tbs: 0.0 for tbs in bandwidths}
    print(f"{'conv':<16} {'MB':>8} {'G binary ops':>13}")
    for name, pixels, c, oc, pixels_in, out_bytes in convs(args.batch, args.size):
        sign_in = pixels_in * c / 8
        sign_out = pixels * oc / 8
        stream = 2 * pixels * oc * out_bytes          # the residual read and the sum written, fp16
        nbytes = sign_in + sign_out + stream
        ops = 2.0 * pixels * oc * 9 * c
        total_bytes += nbytes
        total_ops += ops
        for tbs in bandwidths:
            floors_us[tbs] += max(nbytes / (tbs * 1e12), ops / B1_OPS_PER_S) * 1e6
        print(f"{name:<16} {nbytes / 1e6:8.1f} {ops / 1e9:13.1f}")
    print(f"{'all 16':<16} {total_bytes / 1e6:8.1f} {total_ops / 1e9:13.1f}"
          f"   (b1 tensor cores at 15.5 POPS: {total_ops / B1_OPS_PER_S * 1e6:.1f} us)")
    for tbs in bandwidths:
        floor_us = floors_us[tbs]
        bound = args.float_us / (args.shared_us + floor_us)
        print(f"at {tbs:.2f} TB/s: bitcompile's kernels >= {floor_us:6.1f} us a forward; "
              f"speedup at that floor {bound:.2f}x (float {args.float_us:.0f} us, shared {args.shared_us:.0f} us)")


if __name__ == "__main__":
    main()
