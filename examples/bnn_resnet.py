"""Binary ResNet-18 inference: images/s of the float model (inductor) and the binary one (bitcompile).

    python examples/bnn_resnet.py                           # CUDA: batch 256, 224x224, fp16, channels_last
    python examples/bnn_resnet.py --device cpu --batch 16   # CPU: fp32, channels_last
    python examples/bnn_resnet.py --tiny                    # CPU smoke run for CI (batch 2, 32x32)
    python examples/bnn_resnet.py --profile                 # and where each model's forward spends its time
    python examples/bnn_resnet.py --mode reduce-overhead    # both models in CUDA graphs (no host time a forward)
    python examples/bnn_resnet.py --device cpu --weights-only   # binary weights, float activations (BWN)

What it shows: a ResNet-18 written in plain PyTorch (torchvision's layout: 7x7 stem conv, max-pool,
four stages of two BasicBlocks, 1x1 downsample convs, average pool, fc; defined below, random
weights). In the binary model every 3x3 conv of the four stages is an XNOR-Net conv, written the
way BNN code is written: conv2d(ste_sign(x), ste_sign(W)) * alpha, alpha = mean|W| per output
channel. The stem, the downsample convs and the fc stay float (usual BNN practice), and, as in
Bi-Real Net, the binary model has no ReLU: a ReLU in front of a sign would make every sign +1.
- the float model runs under torch.compile (inductor), the binary one under
  torch.compile(backend="bitcompile"), which rewrites the 16 binary convs into bitcompile's
  bit-packed binary_conv2d (bitcompile.explain checks that, and that nothing else is rewritten);
- images/s of both (after a warm-up; CUDA events on the GPU) and the speedup;
- the compiled binary model against its own eager model (float convs on +-1 values): with the rest
  of the graph left in eager PyTorch, bitcompile's rewrite gives the same logits bit for bit.
The BatchNorm statistics come from a few random batches.

--weights-only: a binary-weight network instead (BinaryConnect, XNOR-Net's BWN): the same 16 convs as
conv2d(x, ste_sign(W)) * alpha on float activations, ReLUs kept; bitcompile rewrites them into
binary_weight_conv2d, which has a CPU kernel only (a CPU example: on CUDA the graph keeps the dense convs). Its
sums are fp32 in another order than oneDNN's, so the check against eager is to rounding, not bit for bit.
"""

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

import bitcompile


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=None, help="images a forward (default 256 on CUDA, 16 on CPU)")
    parser.add_argument("--size", type=int, default=224, help="image height and width")
    parser.add_argument("--iters", type=int, default=20, help="timed forwards per model")
    parser.add_argument("--tiny", action="store_true", help="CPU smoke run for CI: batch 2, 32x32, 2 iterations, fp32")
    parser.add_argument("--profile", action="store_true",
                        help="print each compiled model's kernels by time a forward (torch.profiler; CUDA)")
    parser.add_argument("--top", type=int, default=15, help="kernels --profile prints a model")
    parser.add_argument("--mode", default=None, choices=["default", "reduce-overhead", "max-autotune-no-cudagraphs"],
                        help="torch.compile mode of both models (reduce-overhead: CUDA graphs, no host time a forward)")
    parser.add_argument("--weights-only", action="store_true",
                        help="binary weights, float activations (BWN) instead of XNOR convs; CPU")
    args = parser.parse_args()
    if args.profile and not args.device.startswith("cuda"):
        parser.error("--profile times CUDA kernels: it needs --device cuda")
    if args.tiny:
        args.device, args.batch, args.size, args.iters = "cpu", 2, 32, 2
    if args.weights_only and not args.device.startswith("cpu"):
        parser.error("--weights-only: binary_weight_conv2d has a CPU kernel only (use --device cpu)")
    if args.batch is None:
        args.batch = 256 if args.device.startswith("cuda") else 16
    return args


# ------------------------------------------------------------------------------------------------
# The model
# ------------------------------------------------------------------------------------------------
class XNORConv2d(nn.Conv2d):
    """A binary conv (XNOR-Net): sign activations, sign weights, alpha = mean|W| per output channel.
    Trained with the straight-through estimator of bitcompile.ste_sign; same parameters as nn.Conv2d."""

    def forward(self, x):
        alpha = self.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(bitcompile.ste_sign(x), bitcompile.ste_sign(self.weight), None,
                     self.stride, self.padding, self.dilation, self.groups)
        return y * alpha.view(1, -1, 1, 1)  # after the conv: y is an exact integer in eager too


class BWNConv2d(nn.Conv2d):
    """A binary-weight conv (BinaryConnect / BWN): float activations, sign weights, alpha = mean|W| per output."""

    def forward(self, x):
        alpha = self.weight.abs().mean(dim=(1, 2, 3))
        y = F.conv2d(x, bitcompile.ste_sign(self.weight), None, self.stride, self.padding, self.dilation, self.groups)
        return y * alpha.view(1, -1, 1, 1)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride, binary):
        super().__init__()
        conv3x3 = {False: nn.Conv2d, "xnor": XNORConv2d, "bwn": BWNConv2d}[binary]
        self.conv1 = conv3x3(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.relu = nn.Identity() if binary == "xnor" else nn.ReLU(inplace=True)
        self.downsample = None
        if stride != 1 or inplanes != planes:  # float 1x1 conv on the shortcut
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    def __init__(self, binary=False, classes=1000):
        """binary: False (float), "xnor" (XNOR-Net convs) or "bwn" (binary-weight convs)."""
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)   # float stem
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.Identity() if binary == "xnor" else nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        widths, inplanes = (64, 128, 256, 512), 64
        for i, planes in enumerate(widths):
            stride = 1 if i == 0 else 2
            setattr(self, f"layer{i + 1}", nn.Sequential(BasicBlock(inplanes, planes, stride, binary),
                                                         BasicBlock(planes, planes, 1, binary)))
            inplanes = planes
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, classes)                                    # float classifier

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


@torch.no_grad()
def set_batchnorm_statistics(model, images, batches=2):
    """Running mean and variance of every BatchNorm from a few random batches (a stand-in for
    training: the signs of the binary convs' inputs are then balanced)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.reset_running_stats()
            m.momentum = None  # cumulative average
    model.train()
    for _ in range(batches):
        model(torch.randn_like(images))
    model.eval()


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------
BINARY_KERNELS = ("binary_conv2d", "pack_signs")  # bitcompile's CUDA kernels in a binary forward


@torch.no_grad()
def print_profile(name, forward, images, forwards=5, top=15):
    """Kernel time a forward by kernel name (torch.profiler, CUDA), the top kernels, and the share of bitcompile's
    kernels: what is left when they cost nothing bounds the speedup any binary kernel can give."""
    from torch.profiler import ProfilerActivity, profile

    forward(images)
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(forwards):
            forward(images)
        torch.cuda.synchronize()
    times = {}
    for event in prof.key_averages():
        us = event.self_device_time_total / forwards
        if us > 0:
            times[event.key] = times.get(event.key, 0.0) + us
    total = sum(times.values())
    binary = sum(us for key, us in times.items() if any(k in key for k in BINARY_KERNELS))
    print(f"\n{name}: {total:.0f} us of kernels a forward; bitcompile's binary_conv2d and pack_signs kernels "
          f"{binary:.0f} us ({100 * binary / max(total, 1e-9):.0f}%)")
    for key, us in sorted(times.items(), key=lambda kv: -kv[1])[:top]:
        print(f"  {us:9.1f} us  {100 * us / total:5.1f}%  {key[:110]}")
    # Kernels launched with programmatic dependent launch overlap the one before them: the GPU's busy time (the
    # union of the kernels' intervals) is what a forward costs, and a kernel's exposed time is how much of that
    # union it alone covers.
    intervals = [(e.key, e.time_range.start, e.time_range.end) for e in prof.events()
                 if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > e.time_range.start]
    busy = union_us(intervals) / forwards
    tables = (union_us(intervals) - union_us([i for i in intervals if "tap_table" not in i[0]])) / forwards
    print(f"  busy (union of the kernels' intervals) {busy:.0f} us a forward; the conv_tap_table kernels alone "
          f"cover {tables:.1f} us of it")
    return total, binary


def union_us(intervals):
    """The length of the union of (name, start, end) intervals."""
    covered, reach = 0.0, float("-inf")
    for _, start, end in sorted(intervals, key=lambda i: i[1]):
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


@torch.no_grad()
def seconds_per_forward(forward, images, iters, warmup=3):
    """(wall seconds a forward, host seconds a forward to enqueue it). Where the two are equal on CUDA, the GPU
    waited for the host (Python, dispatch, launches): --mode reduce-overhead removes that time."""
    for _ in range(warmup):  # the first call compiles
        forward(images)
    if images.is_cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        host = time.perf_counter()
        for _ in range(iters):
            forward(images)
        host = time.perf_counter() - host
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1000 / iters, host / iters
    start = time.perf_counter()
    for _ in range(iters):
        forward(images)
    seconds = (time.perf_counter() - start) / iters
    return seconds, seconds


def main():
    args = parse_args()
    device = torch.device(args.device)
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    images = torch.randn(args.batch, 3, args.size, args.size, device=device)
    images = images.to(dtype=dtype, memory_format=torch.channels_last)
    print(f"ResNet-18, batch {args.batch}, {args.size}x{args.size}, {dtype}, channels_last, device {device}")

    kind = "bwn" if args.weights_only else "xnor"
    binary_class, binary_op = ((BWNConv2d, "binary_weight_conv2d") if args.weights_only
                               else (XNORConv2d, "binary_conv2d"))
    models = {}
    for name, binary in (("float", False), ("binary", kind)):
        model = ResNet18(binary=binary)
        calibration = images[:16].float().to(memory_format=torch.contiguous_format)
        set_batchnorm_statistics(model.to(device), calibration)  # in fp32, before the cast
        models[name] = model.to(dtype=dtype, memory_format=torch.channels_last)

    # What bitcompile rewrites: the 16 binary 3x3 convs, and nothing else.
    with torch.no_grad():
        report = bitcompile.explain(models["binary"], images[:1])
    print(report)
    binary_convs = {n for n, m in models["binary"].named_modules() if isinstance(m, binary_class)}
    rewritten = {e.name for e in report.rewritten}
    print(f"binary 3x3 convs rewritten to {binary_op}: {len(rewritten & binary_convs)} of {len(binary_convs)}; "
          f"other layers rewritten: {len(rewritten - binary_convs)}")
    if rewritten != binary_convs or any(e.op != binary_op for e in report.rewritten):
        raise SystemExit("bitcompile did not rewrite exactly the binary convs")

    compiled = {"float": torch.compile(models["float"], mode=args.mode),                         # inductor
                "binary": torch.compile(models["binary"], backend="bitcompile", mode=args.mode)}  # bitcompile, inductor
    results = {}
    for name, forward in compiled.items():
        start = time.perf_counter()
        with torch.no_grad():
            forward(images)
        compile_s = time.perf_counter() - start
        seconds, host = seconds_per_forward(forward, images, args.iters)
        results[name] = args.batch / seconds
        print(f"{name:>6}: {results[name]:9.1f} images/s ({1000 * seconds:.2f} ms a batch, {1000 * host:.2f} ms of "
              f"it to enqueue; first call, with compilation, {compile_s:.1f} s)", flush=True)

    if args.profile:
        float_total, _ = print_profile("float, inductor", compiled["float"], images, top=args.top)
        binary_total, binary_own = print_profile("binary, bitcompile", compiled["binary"], images, top=args.top)
        rest = binary_total - binary_own
        print(f"the binary model without bitcompile's kernels: {rest:.0f} us a forward, so no binary kernel can "
              f"make it more than {float_total / max(rest, 1e-9):.2f}x the float model (profiled times)")

    # The compiled binary model against its own eager model (dense float convs on +-1 values).
    # 1. bitcompile's rewrite, the rest of the graph left to eager PyTorch (inner="eager"): every
    #    +-1 dot product is an exact integer in both (|dot| <= 9 * 512: exact in fp32, and in fp16
    #    up to 2048), and both multiply it by alpha in fp32 and round once to the output dtype, so
    #    the logits must be equal bit for bit. Tolerance 0, fp32 and fp16.
    # 2. The timed model (bitcompile, then inductor) has no tolerance: inductor fuses BatchNorm and
    #    the adds and rounds them differently from eager; an activation within that rounding of 0
    #    changes sign, which moves the next layer's integers by 2, and a random binary network
    #    amplifies that (on --tiny, torch.compile without bitcompile moves the logits as much).
    rewrite_only = torch.compile(models["binary"], backend="bitcompile", options={"inner": "eager"})
    with torch.no_grad():
        eager = models["binary"](images).float()
        exact = (rewrite_only(images).float() - eager).abs().max().item()
        timed = (compiled["binary"](images).float() - eager).abs().max().item()
    scale = eager.abs().max().item()

    print(f"\nsummary (ResNet-18 forward, batch {args.batch}, {args.size}x{args.size}, {dtype}, {device})")
    print(f"{'model':>20}  {'images/s':>9}  {'speedup':>7}")
    print(f"{'float, inductor':>20}  {results['float']:9.1f}  {1.0:6.2f}x")
    print(f"{'binary, bitcompile':>20}  {results['binary']:9.1f}  {results['binary'] / results['float']:6.2f}x")
    print(f"max |compiled - eager| of the binary model (logits up to {scale:.3e}):")
    verdict = "exact" if exact == 0 else "NOT EXACT"
    if args.weights_only:  # fp32 sums of float activations, in another order than oneDNN's: equal to rounding
        verdict = "within fp32 rounding" if exact <= 1e-4 * scale else "NOT WITHIN fp32 ROUNDING"
        print(f"  bitcompile, rest of the graph eager  {exact:.3e}  (tolerance 1e-4 of the largest: {verdict})")
    else:
        print(f"  bitcompile, rest of the graph eager  {exact:.3e}  (tolerance 0: {verdict})")
    print(f"  bitcompile + inductor (timed)        {timed:.3e}  (inductor's rounding and the sign flips it causes)")
    if exact > (1e-4 * scale if args.weights_only else 0):
        raise SystemExit("bitcompile's binary convs do not reproduce the eager model")


if __name__ == "__main__":
    main()
