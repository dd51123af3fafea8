"""The decoder's CUDA-graph step with and without the sibling-linear pass, in one process (twenty-seventh and
twenty-eighth sessions: the pass's win showed only against this control; across machines the host time a step varies
by 2x).

    python benchmarks/decode_passes_ab.py [--scheme binary_weight|apot4] [--tokens 128]
Same quantized model (examples/llm_decode.py's Llama, dim 4096, 4 layers, bf16, CUDA graphs):
  1. inductor                        (quantize_'s ops called one by one)
  2. bitcompile, sibling pass off
  3. bitcompile, sibling pass on     (what llm_decode runs)
For each: tokens/s; host us a step to enqueue 20 steps against wall us a step (host-bound where they are equal);
kernel us a step and the GPU's idle us a step between consecutive kernels (torch.profiler timestamps); the host's
top events over 20 replays (a bitcompile op there means a step ran outside its graph).
"""

import argparse
import copy
import os
import sys
import time

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "examples"))
import llm_decode  # noqa: E402
from bitcompile.passes import sibling_linears  # noqa: E402
from bitcompile.quantize import quantize_  # noqa: E402


def gaps(forward, token, position, steps=10):
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            forward(token, position)
        torch.cuda.synchronize()
    events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                    key=lambda e: e.time_range.start)
    busy = sum(e.time_range.end - e.time_range.start for e in events)
    idle, end = 0.0, None
    for e in events:
        if end is not None and e.time_range.start > end:
            idle += e.time_range.start - end
        end = e.time_range.end if end is None else max(end, e.time_range.end)
    return busy / steps, idle / steps, len(events) / steps


def host_events(forward, token, position, steps=20, top=14):
    """What the host does in `steps` replays (torch.profiler CPU events): a bitcompile op or many kernel launches
    here mean the step did not (only) replay its graph."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            forward(token, position)
        torch.cuda.synchronize()
    rows = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:top]
    for e in rows:
        print(f"{'':>24}{e.self_cpu_time_total / steps:8.1f} us self CPU a step  {e.count / steps:5.1f} calls  "
              f"{e.key[:90]}", flush=True)


def main():
    torch._logging.set_logs(perf_hints=True)  # CUDA graph skip reasons, on stderr
    parser = argparse.ArgumentParser()
    parser.add_argument("--scheme", default="binary_weight")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--dim", type=int, default=4096)
    parser.add_argument("--device", default="cuda", help="cpu: a smoke run of this script (no CUDA graphs, no gaps)")
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    base = llm_decode.Llama(8192, args.dim, 4, args.dim // 128, 8 + args.tokens).to(
        device, torch.bfloat16 if cuda else torch.float32)
    model = quantize_(copy.deepcopy(base), args.scheme, filter=llm_decode.not_output_head)
    prompt = torch.randint(8192, (1, 8), device=device)
    merge = sibling_linears.merge_sibling_linears
    for name, backend, merging in (("inductor", "inductor", False), ("bitcompile, pass off", "bitcompile", False),
                                   ("bitcompile, pass on", "bitcompile", True)):
        torch._dynamo.reset()
        counters.clear()
        sibling_linears.merge_sibling_linears = merge if merging else (lambda graph, fake_mode=None: 0)
        forward = torch.compile(model, backend=backend, mode="reduce-overhead" if cuda else None, fullgraph=True)
        with torch.no_grad():
            for _ in range(2):
                llm_decode.greedy_decode(forward, prompt, 4)
            _, _, seconds = llm_decode.greedy_decode(forward, prompt, args.tokens)
            token = torch.ones(1, 1, dtype=torch.long, device=device)
            position = torch.tensor([9], device=device)
            llm_decode.synchronize(device)
            start = time.perf_counter()
            for _ in range(20):
                forward(token, position)
            host = (time.perf_counter() - start) / 20
            llm_decode.synchronize(device)
            wall = (time.perf_counter() - start) / 20
            busy, idle, kernels = gaps(forward, token, position) if cuda else (0.0, 0.0, 0)
            if cuda:
                host_events(forward, token, position)
        print(f"{name:>22}: {(args.tokens - 1) / seconds:7.1f} tokens/s; host {1e6 * host:5.0f} us a step, wall "
              f"{1e6 * wall:5.0f}; kernels {busy:5.0f} us, GPU idle {idle:5.0f} us, {kernels:.0f} kernels a step",
              flush=True)
        print(f"{'':>22}  inductor counters: {dict((k, v) for k, v in counters['inductor'].items() if 'graph' in k)}, "
              f"bitcompile: {dict(counters['bitcompile'])}", flush=True)
    sibling_linears.merge_sibling_linears = merge


if __name__ == "__main__":
    main()
