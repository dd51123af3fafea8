"""Times the bitcompile ops against dense PyTorch baselines in the same process.

    python benchmarks/bench_ops.py            # every row this machine can run, plus the M sweep on GPU
    python benchmarks/bench_ops.py --quick    # fewer repetitions (a smoke run)
    python benchmarks/bench_ops.py --sweep-only --sweep-device cpu   # the M sweep on the CPU (fp32, 4096^2)
    python benchmarks/bench_ops.py --only W1A16 --no-sweep --peers   # a row, then the peers (benchmarks/peers.py)

Baselines (DESIGN.md "Benchmarks"): cuBLAS through F.linear in bf16, cuDNN through F.conv2d in
fp16 channels_last, fp32 F.linear / F.conv2d on CPU. GPU times are triton.testing.do_bench
medians with L2 flushed; kernels of a few microseconds are also timed inside a CUDA graph, where
launch cost no longer dominates; the calls of a graph cycle over copies of the weight totalling
>= 192 MiB, so the 60 MB L2 of an H200 cannot serve a packed weight (a graph replaying one 8 MiB
weight measures L2, not HBM). Ratios are baseline time / our time (> 1: we are faster).
The table is printed and appended to benchmarks/RESULTS.md with the date, device and versions;
on GPU a plot of speedup against M goes to benchmarks/speedup_vs_m.png.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import time
from pathlib import Path

import torch
import torch.nn.functional as F

import bitcompile
from bitcompile import ops

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------------------------
# Timing
# ----------------------------------------------------------------------------------------------
def time_cpu_pair(ours, baseline, rounds: int) -> tuple[float, float]:
    """Median wall times (us) of two callables timed in alternating rounds of a few calls each, so that a busy
    machine's slow spells fall on both alike."""
    for fn in (ours, baseline):
        fn()
    start = time.perf_counter()
    baseline()
    calls = max(1, int(0.05 / max(time.perf_counter() - start, 1e-6)))  # ~50 ms a round
    samples = ([], [])
    for _ in range(rounds):
        for fn, out in zip((ours, baseline), samples):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            out.append((time.perf_counter() - start) / calls)
    return statistics.median(samples[0]) * 1e6, statistics.median(samples[1]) * 1e6


def time_cuda(fn, repeat_ms: int) -> float:
    """do_bench median in microseconds, L2 flushed between runs."""
    from triton.testing import do_bench

    return do_bench(fn, warmup=25, rep=repeat_ms, return_mode="median") * 1e3


def time_cuda_graph(fn, replays: int = 200) -> float:
    """Microseconds per call of `fn` captured `replays` times in one CUDA graph (launch cost amortized)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(replays):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(5):
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / replays)
    return statistics.median(samples)


# ----------------------------------------------------------------------------------------------
# Problems: each returns (ours, baseline) callables on fresh random data
# ----------------------------------------------------------------------------------------------
ROTATE_BYTES = 192 << 20  # graph timing: weight copies totalling at least this (the timing rule of issue 10)


def rotating(tensor: torch.Tensor, device: str) -> list:
    """The tensor and copies of it, >= ROTATE_BYTES together on CUDA (just the tensor on CPU)."""
    copies = 1 if device != "cuda" else max(1, -(-ROTATE_BYTES // (tensor.numel() * tensor.element_size())))
    return [tensor] + [tensor.clone() for _ in range(copies - 1)]


def cycling(call, weights: list):
    """A no-argument callable that runs call(weight) on the next weight of the list each time."""
    state = {"i": 0}

    def run():
        weight = weights[state["i"] % len(weights)]
        state["i"] += 1
        return call(weight)

    return run


def linear_problem(op: str, m: int, n: int, k: int, device: str):
    act_dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(m, k, device=device, dtype=act_dtype)
    w = torch.randn(n, k, device=device)
    alpha = w.abs().mean(1)
    baseline = cycling(lambda dense: F.linear(x, dense), rotating(w.to(act_dtype), device))
    if op == "binary_linear":
        # includes binarizing and packing x: it happens inside the op
        call = lambda packed: torch.ops.bitcompile.binary_linear(x, packed, k, alpha)  # noqa: E731
        packed = ops.pack_signs(w)
    elif op == "binary_weight_linear":
        call = lambda packed: torch.ops.bitcompile.binary_weight_linear(x, packed, k, alpha)  # noqa: E731
        packed = ops.pack_signs(w)
    elif op == "apot_linear":
        from bitcompile import apot

        table = apot.get_scheme("apot4").code_values.to(device)
        call = lambda packed: torch.ops.bitcompile.apot_linear(x, packed, k, 4, table, alpha)  # noqa: E731
        packed = ops.pack_codes(torch.randint(0, 16, (n, k), device=device), 4)
    else:
        raise ValueError(op)
    return cycling(call, rotating(packed, device)), baseline, 2 * m * n * k


def conv_problem(batch: int, channels: int, size: int, device: str, op: str = "binary_conv2d"):
    dtype = torch.float16 if device == "cuda" else torch.float32
    x = torch.randn(batch, channels, size, size, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(channels, channels, 3, 3, device=device)
    dense_w = w.to(dtype).contiguous(memory_format=torch.channels_last)
    packed = ops.pack_signs(w.permute(0, 2, 3, 1))
    inputs = rotating(x, device)  # the activations rotate (the timing rule of issue 11), the weights stay
    kernel = getattr(torch.ops.bitcompile, op)  # binary_conv2d, or binary_weight_conv2d (x not binarized)
    ours = cycling(lambda a: kernel(a, packed, channels, [3, 3], [1, 1], [1, 1], [1, 1]), inputs)
    baseline = cycling(lambda a: F.conv2d(a, dense_w, padding=1), inputs)
    return ours, baseline, 2 * batch * channels * channels * 9 * size * size


# Rows of the speed issues (#10, #11): (label, device, builder, target ratio; met when the do_bench or the graph
# ratio reaches it: the issues set the W1A16 / apot rows on the rotating graph)
ROWS = [
    ("binary_linear W1A1 M=4096 N=K=8192", "cuda", lambda: linear_problem("binary_linear", 4096, 8192, 8192, "cuda"), 8),
    ("binary_linear W1A1 M=512 N=K=8192", "cuda", lambda: linear_problem("binary_linear", 512, 8192, 8192, "cuda"), 4),
    ("binary_weight_linear W1A16 M=1 N=K=8192", "cuda", lambda: linear_problem("binary_weight_linear", 1, 8192, 8192, "cuda"), 7),
    ("binary_weight_linear W1A16 M=1 N=K=16384", "cuda", lambda: linear_problem("binary_weight_linear", 1, 16384, 16384, "cuda"), 10),
    ("binary_weight_linear W1A16 M=16 N=K=8192", "cuda", lambda: linear_problem("binary_weight_linear", 16, 8192, 8192, "cuda"), 6),
    ("apot_linear apot4 M=1 N=K=8192", "cuda", lambda: linear_problem("apot_linear", 1, 8192, 8192, "cuda"), 3.5),
    ("apot_linear apot4 M=4096 N=K=8192", "cuda", lambda: linear_problem("apot_linear", 4096, 8192, 8192, "cuda"), 0.8),
    ("binary_conv2d 3x3 pad 1 B=64 C=256 14x14", "cuda", lambda: conv_problem(64, 256, 14, "cuda"), 3),
    ("binary_conv2d 3x3 pad 1 B=256 C=512 7x7", "cuda", lambda: conv_problem(256, 512, 7, "cuda"), 3),
    ("binary_conv2d 3x3 pad 1 B=1 C=256 14x14", "cuda", lambda: conv_problem(1, 256, 14, "cuda"), 2),
    ("binary_conv2d 3x3 pad 1 B=256 C=64 56x56", "cuda", lambda: conv_problem(256, 64, 56, "cuda"), None),
    ("binary_linear W1A1 M=64 N=K=4096 (CPU)", "cpu", lambda: linear_problem("binary_linear", 64, 4096, 4096, "cpu"), 6),
    ("binary_weight_linear M=1 N=K=4096 (CPU)", "cpu", lambda: linear_problem("binary_weight_linear", 1, 4096, 4096, "cpu"), 4),
    ("apot_linear apot4 M=1 N=K=4096 (CPU)", "cpu", lambda: linear_problem("apot_linear", 1, 4096, 4096, "cpu"), None),
    ("binary_conv2d 3x3 pad 1 B=8 C=128 14x14 (CPU)", "cpu", lambda: conv_problem(8, 128, 14, "cpu"), 8),
    ("binary_weight_conv2d 3x3 pad 1 B=8 C=128 28x28 (CPU)", "cpu",
     lambda: conv_problem(8, 128, 28, "cpu", "binary_weight_conv2d"), None),
]


def run_rows(quick: bool, only: str = ""):
    results = []
    for label, device, build, target in ROWS:
        if (device == "cuda" and not torch.cuda.is_available()) or only not in label:
            continue
        try:
            ours, baseline, work = build()
            if device == "cuda":
                t_ours, t_base = time_cuda(ours, 50 if quick else 200), time_cuda(baseline, 50 if quick else 200)
                g_ours, g_base = time_cuda_graph(ours, 20 if quick else 100), time_cuda_graph(baseline, 20 if quick else 100)
            else:  # alternating rounds: this 2-core machine's busy spells (2x) fall on both alike
                t_ours, t_base = time_cpu_pair(ours, baseline, 5 if quick else 15)
                g_ours = g_base = None
        except Exception as error:  # a missing op is reported as a row, not a crash
            results.append((label, device, None, None, None, None, target, f"{type(error).__name__}: {error}"[:120]))
            continue
        results.append((label, device, t_ours, t_base, g_ours, g_base, target, ""))
    return results


def sweep_m(quick: bool, sizes=None, n: int = 8192, k: int = 8192, device: str = "cuda"):
    """Speedup of binary_linear, binary_weight_linear and apot4 apot_linear over F.linear (bf16 on CUDA, fp32 on the
    CPU) at N x K, against M. CUDA: do_bench, L2 flushed. CPU: ours and F.linear in alternating rounds (medians)."""
    if sizes is None:
        if device == "cuda":
            sizes = [1, 4, 16, 64, 256, 1024, 4096] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048,
                                                                   4096, 8192]
        else:
            sizes = [1, 4, 16, 64, 256, 1024] if quick else [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]
    curves = {"binary_linear": [], "binary_weight_linear": [], "apot_linear": []}
    for op in curves:
        for m in sizes:
            ours, baseline, _ = linear_problem(op, m, n, k, device)
            if device == "cuda":
                curves[op].append(time_cuda(baseline, 50) / time_cuda(ours, 50))
            else:
                t_ours, t_base = time_cpu_pair(ours, baseline, 3 if quick else 9)
                curves[op].append(t_base / t_ours)
    return sizes, curves


def format_table(results) -> str:
    lines = [
        "| shape | ours (us) | baseline (us) | ratio | ours in graph (us) | baseline in graph (us) | graph ratio | target |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, device, t_ours, t_base, g_ours, g_base, target, error in results:
        if error:
            lines.append(f"| {label} | error: {error} | | | | | | {target or ''} |")
            continue
        ratio = t_base / t_ours
        graph = f"{g_ours:.1f} | {g_base:.1f} | {g_base / g_ours:.2f}x" if g_ours else " | | "
        met = "" if target is None else (f">= {target}x " + ("met" if max(ratio, (g_base / g_ours) if g_ours else 0) >= target else "MISSED"))
        lines.append(f"| {label} | {t_ours:.1f} | {t_base:.1f} | {ratio:.2f}x | {graph} | {met} |")
    return "\n".join(lines)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return f"{line.split(':', 1)[1].strip()} ({os.cpu_count()} cores, {torch.backends.cpu.get_cpu_capability()})"
    except OSError:
        pass
    return platform.processor() or platform.machine()


def environment() -> str:
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else cpu_name()
    cuda = f", CUDA {torch.version.cuda}" if torch.cuda.is_available() else ""
    kernels = ""
    return (f"{datetime.date.today().isoformat()}, {device}, torch {torch.__version__}{cuda}, "
            f"{torch.get_num_threads()} CPU threads, bitcompile {bitcompile.__version__}{kernels}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument("--no-sweep", action="store_true", help="skip the M sweep on GPU")
    parser.add_argument("--sweep-device", choices=("cuda", "cpu"), default=None,
                        help="where the M sweep runs (default: cuda when there is a GPU, else no sweep); cpu times the "
                             "ops against fp32 F.linear, at N = K = 4096 unless --shape says otherwise")
    parser.add_argument("--results", default=str(HERE / "RESULTS.md"), help="file the table is appended to")
    parser.add_argument("--sizes", help="comma-separated M of the sweep (default: powers of two)")
    parser.add_argument("--sweep-only", action="store_true", help="only the M sweep")
    parser.add_argument("--shape", default=None, help="N,K of the M sweep (default 8192,8192; the plot is "
                        "written for 8192,8192 only)")
    parser.add_argument("--only", default="", help="only the rows whose label contains this text (e.g. binary_conv2d)")
    parser.add_argument("--peers", action="store_true", help="then W1A16 against gemlite and humming-kernels where "
                        "they import (benchmarks/peers.py: the same tables as running it)")
    args = parser.parse_args()
    if args.peers and not torch.cuda.is_available():
        parser.error("--peers: no CUDA device (benchmarks/peers.py --dry-run checks the peers without one)")

    header = f"## {environment()}"
    print(header)
    if not args.sweep_only:
        table = format_table(run_rows(args.quick, args.only))
        print(table)
        with open(args.results, "a") as out:
            out.write(f"\n{header}\n\n{table}\n")

    sweep_device = args.sweep_device or ("cuda" if torch.cuda.is_available() else None)
    if sweep_device == "cuda" and not torch.cuda.is_available():
        parser.error("--sweep-device cuda: no CUDA device")
    if sweep_device is not None and not args.no_sweep:
        sizes = [int(m) for m in args.sizes.split(",")] if args.sizes else None
        shape_arg = args.shape or ("8192,8192" if sweep_device == "cuda" else "4096,4096")
        n, k = (int(v) for v in shape_arg.split(","))
        shape = f"N=K={n}" if n == k else f"N={n} K={k}"
        baseline = "bf16 F.linear" if sweep_device == "cuda" else "fp32 F.linear (CPU)"
        sizes, curves = sweep_m(args.quick, sizes, n, k, sweep_device)
        sweep = "| M | " + " | ".join(curves) + " |\n|---|" + "---|" * len(curves) + "\n"
        sweep += "\n".join(f"| {m} | " + " | ".join(f"{curves[op][i]:.2f}x" for op in curves) + " |" for i, m in enumerate(sizes))
        print(f"\nspeedup over {baseline}, {shape}\n" + sweep)
        with open(args.results, "a") as out:
            out.write(f"\n{header if args.sweep_only else ''}\nSpeedup over {baseline} against M ({shape}):\n\n{sweep}\n")
        if sweep_device == "cuda" and (n, k) == (8192, 8192):  # the plot in the repo is the 8192^2 sweep
            try:
                import matplotlib

                matplotlib.use("Agg")
                import matplotlib.pyplot as plt

                figure, axis = plt.subplots(figsize=(6, 4))
                for op, values in curves.items():
                    axis.plot(sizes, values, marker="o", label=op)
                axis.axhline(1.0, color="grey", linewidth=0.8)
                axis.set_xscale("log", base=2)
                axis.set_xlabel("M (batch rows)")
                axis.set_ylabel("speedup over bf16 F.linear")
                axis.set_title(f"N=K=8192, {torch.cuda.get_device_name()}")
                axis.legend()
                figure.tight_layout()
                figure.savefig(HERE / "speedup_vs_m.png", dpi=120)
                print(f"plot: {HERE / 'speedup_vs_m.png'}")
            except ImportError:
                print("matplotlib not installed: no plot")
    if args.peers:
        import peers  # beside this file; it imports this module's timers

        peers.run(args.quick, args.results)


if __name__ == "__main__":
    main()
