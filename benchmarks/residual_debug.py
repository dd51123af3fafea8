"""Why an add of examples/bnn_resnet.py is or is not folded into its conv (passes/residual.py), on this device."""
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
        described = []
        for a in canonical.operands:
            v = ir.value(a)
            described.append((getattr(a, "target", a), getattr(a, "kwargs", {}).get("out_dtype"),
                              None if not isinstance(v, torch.Tensor) else (tuple(v.shape), v.dtype, v.stride()),
                              len(a.users) if hasattr(a, "users") else None))
        if any(d[2] is not None and len(d[2][0]) == 4 for d in described):
            print("add", "FUSED" if found else "left", described, flush=True)
    return found


residual._conv_and_shortcut = explain
device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = torch.float16 if device == "cuda" else torch.float32
batch, size = (int(v) for v in sys.argv[1:3]) if len(sys.argv) > 2 else (2, 64)
model = br.ResNet18(binary="xnor").eval().to(device=device, dtype=dtype, memory_format=torch.channels_last)
x = torch.randn(batch, 3, size, size, device=device, dtype=dtype).contiguous(memory_format=torch.channels_last)
with torch.no_grad():
    torch.compile(model, backend="bitcompile")(x)
print(dict(counters["bitcompile"]))
