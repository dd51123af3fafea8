"""cuDNN's kernels for each float conv shape of ResNet-18 (the part both of examples/bnn_resnet.py's models share).

    python benchmarks/resnet_float_convs.py [batch]     # CUDA; default batch 256

Eager F.conv2d, one conv at a time, in the shapes and layout bnn_resnet.py gives them (fp16, channels_last input
and weight), with cudnn.benchmark off and on; for the 3-channel stem also with the input and weight padded to 4 and 8
channels by the caller, and in NCHW. It prints each conv's kernels (torch.profiler, us a call).

H100, torch 2.11 (cuDNN of cu130), 2026-12-06, batch 256: the stem is image_first_layer 400.6 us + nhwcAddPadding
147.5 (cuDNN pads C = 3 to 4 itself) + a 33.6 us memset; layer2.0's 1x1 stride-2 downsample (C = 64 56x56 -> OC
= 128) is precomputed_convolve_sgemm 152.6 + nhwcToNchw 102.5 + nchwToNhwc 46.1 = 302.3 us, where layer3.0's
(C = 128) is one sm90 implicit GEMM of 22.5 us. cudnn.benchmark = True picks the same kernels. ~480 us of the
~1600 us that bound ResNet-18's speedup are these two cuDNN choices, in the float and the binary model alike."""
import sys

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

cl = torch.channels_last
dev = "cuda"


def kernels(fn, reps=5):
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        us = e.self_device_time_total / reps
        if us > 0:
            rows.append((us, e.key))
    rows.sort(reverse=True)
    return rows


def show(title, fn):
    rows = kernels(fn)
    total = sum(us for us, _ in rows)
    print(f"\n{title}: {total:.1f} us")
    for us, key in rows[:8]:
        print(f"  {us:8.1f}  {key[:120]}")


convs = [  # (name, C, H, OC, k, stride, pad)
    ("stem 7x7/2", 3, 224, 64, 7, 2, 3),
    ("layer1 3x3", 64, 56, 64, 3, 1, 1),
    ("layer2.0.conv1 3x3/2", 64, 56, 128, 3, 2, 1),
    ("layer2 3x3", 128, 28, 128, 3, 1, 1),
    ("layer2.0.down 1x1/2", 64, 56, 128, 1, 2, 0),
    ("layer3.0.down 1x1/2", 128, 28, 256, 1, 2, 0),
    ("layer4.0.down 1x1/2", 256, 14, 512, 1, 2, 0),
]


def main():
    B = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    torch.manual_seed(0)
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench
        print(f"\n===== cudnn.benchmark = {bench}")
        for name, C, H, OC, k, s, p in convs:
            x = torch.randn(B, C, H, H, device=dev, dtype=torch.half).to(memory_format=cl)
            w = torch.randn(OC, C, k, k, device=dev, dtype=torch.half).to(memory_format=cl)
            show(f"{name} (x {tuple(x.shape)})", lambda: F.conv2d(x, w, None, s, p))
            if C == 3:
                for pad_to in (4, 8):
                    xp = F.pad(x.contiguous(memory_format=torch.contiguous_format), (0, 0, 0, 0, 0, pad_to - 3))
                    xp = xp.to(memory_format=cl)
                    wp = F.pad(w.contiguous(memory_format=torch.contiguous_format), (0, 0, 0, 0, 0, pad_to - 3))
                    wp = wp.to(memory_format=cl)
                    ref = F.conv2d(x.float(), w.float(), None, s, p)
                    err = (F.conv2d(xp, wp, None, s, p).float() - ref).abs().max().item()
                    show(f"{name} input padded to {pad_to} channels (max err {err:.3g})",
                         lambda: F.conv2d(xp, wp, None, s, p))
                xn = x.contiguous()
                wn = w.contiguous()
                show(f"{name} NCHW input and weight", lambda: F.conv2d(xn, wn, None, s, p))


if __name__ == "__main__":
    main()
