"""Can inductor make W1A16's bit planes of x inside the kernel that produces x? (a question for the GPU)

At M <= 3, binary_weight_linear launches x_planes_kernel (csrc/cuda/binary_weight_linear.cu) and then the weight
kernel: in llm_decode that is 16 of the 63 kernels of a token (28.8 us, plus a launch gap each in the CUDA graph).
The planes are a pure function of x, so they could be computed by torch ops in the graph, where inductor may fuse
them into the RMSNorm or SwiGLU kernel that makes x, and the weight op would take the planes instead of x.
This script holds that decomposition (`planes_of`), checks it bit for bit against a loop written from the kernel's
definition, and compiles RMSNorm + planes with inductor, printing how many kernels inductor made and (CUDA) the us
a call in a CUDA graph against RMSNorm alone.

    python benchmarks/kernels/pending/planes_in_producer.py [--device cuda] [--k 4096]

Twenty-eighth session, CPU (2-core EPYC, torch 2.13.0): inductor made one kernel for RMSNorm + planes (the C++
backend fuses reductions of different sizes). Twenty-ninth session, H200 (torch 2.11, Triton): 3 kernels, 4.60 us a
call in a CUDA graph against RMSNorm's 1.60 (x_planes_kernel: ~1.9), and the compiled words differed from eager's at
2067 of 3072 places (x_sum at 8 of 8): this route is closed (benchmarks/NOTES.md, twenty-ninth session).
"""

import argparse
import re
import time

import torch

P, CHUNK, NON_FINITE = 24, 512, 1000  # kPlaneBits, values a chunk, kNonFinite (binary_weight_linear.cu)


def planes_of(x: torch.Tensor):
    """x [M, K] float -> (planes int32 [M, C, P, 16], x_sum int64 [M, C], shift int32 [M, C]); C = ceil(K / 512).
    Word w of plane p of chunk c: bit i is bit p of xq[512 c + 32 w + i] (two's complement), xq = rint(x 2^shift),
    shift = 22 - e for the chunk's largest finite |x| = m 2^e (m in [0.5, 1), e = 0 for 0), clamped to +-126;
    a chunk holding an Inf or NaN gets xq = 0 and shift NON_FINITE."""
    m, k = x.shape
    chunks = -(-k // CHUNK)
    v = torch.nn.functional.pad(x.float(), (0, chunks * CHUNK - k)).view(m, chunks, CHUNK)
    finite = torch.isfinite(v).all(-1, keepdim=True)
    largest = torch.where(torch.isnan(v), 0.0, v.abs()).amax(-1, keepdim=True)
    e = torch.frexp(largest)[1]
    shift = (P - 2 - e).clamp(-126, 126)
    factor = ((shift + 127) << 23).to(torch.int32).view(torch.float32)  # 2^shift exactly (exp2 may be approximate)
    q = torch.where(finite, torch.round(v * factor), 0.0).to(torch.int64)
    bits = (q.view(m, chunks, 1, 16, 32) >> torch.arange(P, device=x.device).view(P, 1, 1)) & 1
    words = (bits << torch.arange(32, device=x.device)).sum(-1)  # [M, C, P, 16], 0 .. 2^32 - 1
    planes = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    shift = torch.where(finite, shift, NON_FINITE).to(torch.int32)
    return planes, q.sum(-1), shift.squeeze(-1)


def planes_reference(x: torch.Tensor):
    """The same, a chunk at a time in plain Python integers (from the kernel's definition)."""
    import math

    m, k = x.shape
    chunks = -(-k // CHUNK)
    planes = torch.zeros(m, chunks, P, 16, dtype=torch.int32)
    x_sum = torch.zeros(m, chunks, dtype=torch.int64)
    shifts = torch.zeros(m, chunks, dtype=torch.int32)
    values = x.float().cpu()
    for r in range(m):
        for c in range(chunks):
            chunk = [float(values[r, i]) if i < k else 0.0 for i in range(c * CHUNK, (c + 1) * CHUNK)]
            finite = all(math.isfinite(v) for v in chunk)
            largest = max((abs(v) for v in chunk if not math.isnan(v)), default=0.0)
            e = math.frexp(largest)[1] if math.isfinite(largest) else 0
            shift = max(-126, min(126, P - 2 - e))
            # v * 2^shift is exact in fp32 here (a power of two, no overflow below 2^22): round half to even
            q = [round(v * 2.0**shift) if finite else 0 for v in chunk]
            x_sum[r, c] = sum(q)
            shifts[r, c] = shift if finite else NON_FINITE
            for p in range(P):
                for w in range(16):
                    word = sum(((q[32 * w + i] >> p) & 1) << i for i in range(32))
                    planes[r, c, p, w] = word - 2**32 if word >= 2**31 else word
    return planes, x_sum, shifts


def rms_norm(x, weight):
    return (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


def producer_with_planes(x, weight):
    return planes_of(rms_norm(x, weight))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--k", type=int, default=4096)
    parser.add_argument("--m", type=int, default=1)
    args = parser.parse_args()
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    x = torch.randn(args.m, 1000, device=device, dtype=dtype) * 3
    x[0, 7] = 0.0
    x[0, 900] = float("nan")  # chunk 1 of row 0: non-finite
    if args.m > 1:
        x[1, 600] = float("inf")  # chunk 1 of row 1: non-finite
    got, want = planes_of(x), planes_reference(x)
    for name, a, b in zip(("planes", "x_sum", "shift"), got, want):
        assert torch.equal(a.cpu(), b), f"{name} differs from the reference"
    print("planes_of matches the reference (K = 1000, a zero, a NaN, an Inf)")

    from torch._inductor.utils import run_and_get_code

    x = torch.randn(args.m, args.k, device=device, dtype=dtype)
    weight = torch.randn(args.k, device=device, dtype=dtype)
    for name, fn in (("RMSNorm", rms_norm), ("RMSNorm + planes", producer_with_planes)):
        torch._dynamo.reset()
        compiled = torch.compile(fn)
        out, code = run_and_get_code(compiled, x, weight)
        source = "\n".join(code)
        kernels = len(set(re.findall(r"\b(triton_\w+|cpp_fused_\w+) = ", source)))
        if name != "RMSNorm":  # inductor's RMSNorm rounds differently from eager's: check the planes of its own y
            y, *planes = torch.compile(lambda x, weight: (rms_norm(x, weight), *planes_of(rms_norm(x, weight))))(x, weight)
            for what, a, b in zip(("planes", "x_sum", "shift"), planes, planes_of(y)):
                if not torch.equal(a, b):
                    print(f"the compiled {what} differ from eager's of the same x at {(a != b).sum().item()} of "
                          f"{a.numel()} places", flush=True)
        line = f"{name:>18}: {kernels} kernel(s) in inductor's code"
        if device.type == "cuda":
            graph = torch.cuda.CUDAGraph()
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(3):
                    compiled(x, weight)
            torch.cuda.current_stream().wait_stream(stream)
            with torch.cuda.graph(graph):
                for _ in range(100):
                    compiled(x, weight)
            graph.replay()
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                graph.replay()
            torch.cuda.synchronize()
            line += f", {(time.perf_counter() - start) / 1000 * 1e6:.2f} us a call in a CUDA graph"
        print(line, flush=True)


if __name__ == "__main__":
    main()
