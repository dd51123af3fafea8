"""Which adds passes/residual.py folds into their conv, and why the others stay.

    python benchmarks/residual_debug.py [BATCH SIZE]        ResNet-18 (examples/bnn_resnet.py's model) compiled alone
    python benchmarks/residual_debug.py --main ARGS...      bnn_resnet.main(ARGS) itself, e.g. --mode reduce-overhead
    python benchmarks/residual_debug.py --ab [MODE]         CUDA: float, binary without / with the pass, timed and
                                                            profiled in one process (main's flow: explain first)

Prints each 4-D add with its operands (target, out_dtype, shape, strides, readers) and FUSED / left, then the counters.
Fifty-fifth session, H100: the model alone folded 8 of 8 (batch 2 at 64x64 and 256 at 224x224, default mode), but
bnn_resnet.main --mode reduce-overhead --profile folded 6 (layer1's two adds left, by its kernel profile); on the CPU
main (batch 2, 224x224, either mode, the CUDA packing form forced) folded 8 of 8. Fifty-sixth session: the GPU
machine's torch 2.11 folded none after bnn_resnet's explain, which made the compile's batch symbolic (see
passes/residual.py's stride test; explain no longer does that). Fifty-seventh session, H100, `--ab reduce-overhead`:
5 adds folded (the downsample blocks' 3 left to inductor on purpose), 4 sums' sign words from the epilogue; kernels a
forward 2600 us with the pass against 2767 without, 98.2K against 92.0K images/s (float 68.9K).
"""
import sys

import torch
from torch._dynamo.utils import counters

sys.path.insert(0, "examples")
import bnn_resnet as br  # noqa: E402

import bitcompile  # noqa: E402,F401
from bitcompile.passes import ir, residual  # noqa: E402

original = residual._conv_and_shortcut


def explain(node):
    found = original(node)
    canonical = ir.view(node)
    if canonical is not None and canonical.kind == "add":
        values = [ir.value(a) for a in canonical.operands]
        if all(isinstance(v, torch.Tensor) and v.dim() == 4 for v in values):
            described = [(str(getattr(a, "target", a))[:48], getattr(a, "kwargs", {}).get("out_dtype"), tuple(v.shape),
                          v.stride(), [str(u.target)[:32] for u in a.users]) for a, v in zip(canonical.operands, values)]
            print("FUSED" if found else "left", described, flush=True)
    return found


def ab(mode=None, iters=20, profile=True):
    """bnn_resnet.main's models and flow (explain at batch 1, then the compile at 256: a static batch since explain
    leaves Dynamo's size record alone; before, a symbolic one, where torch 2.11 folded no add), the binary model
    compiled without the pass (main's graph) and with it, each timed and profiled in this process, the float model
    beside."""
    device, dtype = torch.device("cuda"), torch.float16
    torch.manual_seed(0)
    images = torch.randn(256, 3, 224, 224, device=device).to(dtype=dtype, memory_format=torch.channels_last)
    models = {}
    for name, binary in (("float", False), ("binary", "xnor")):
        model = br.ResNet18(binary=binary)
        br.set_batchnorm_statistics(model.to(device), images[:16].float().to(memory_format=torch.contiguous_format))
        models[name] = model.to(dtype=dtype, memory_format=torch.channels_last)
    folded = {}
    for name in ("binary with the pass", "binary without the pass", "float"):  # the pass first: a cut run keeps it
        torch._dynamo.reset()
        counters.clear()
        model = models[name.split()[0]]
        if name == "float":
            forward = torch.compile(model, mode=mode)
        else:
            with torch.no_grad():
                bitcompile.explain(model, images[:1])
            saved = residual.add_residuals
            if "without" in name:
                residual.add_residuals = lambda graph, fake_mode=None: 0
            forward = torch.compile(model, backend="bitcompile", mode=mode)
            with torch.no_grad():
                forward(images)  # compiles here, with the pass as set
            residual.add_residuals = saved
            folded[name] = dict(counters["bitcompile"])
        seconds, host = br.seconds_per_forward(forward, images, iters)
        print(f"{name:>26}: {256 / seconds:9.1f} images/s ({1000 * seconds:.3f} ms a batch, {1000 * host:.2f} ms to "
              f"enqueue)", flush=True)
        if profile:
            br.print_profile(name, forward, images, top=25)
        print(flush=True)
    for name, c in folded.items():
        print(name, {k: v for k, v in c.items() if k.startswith("residual")})


residual._conv_and_shortcut = explain
if len(sys.argv) > 1 and sys.argv[1] == "--ab":
    ab(mode=sys.argv[2] if len(sys.argv) > 2 else None)
elif len(sys.argv) > 1 and sys.argv[1] == "--main":
    sys.argv = ["bnn_resnet.py"] + sys.argv[2:]
    br.main()
else:
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.float16 if device == "cuda" else torch.float32
    batch, size = (int(v) for v in sys.argv[1:3]) if len(sys.argv) > 2 else (2, 64)
    model = br.ResNet18(binary="xnor").eval().to(device=device, dtype=dtype, memory_format=torch.channels_last)
    x = torch.randn(batch, 3, size, size, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.compile(model, backend="bitcompile")(x)
print(dict(counters["bitcompile"]))
