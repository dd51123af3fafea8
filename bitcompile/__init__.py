"""bitcompile: binary and APoT-quantized Linear/Conv2d on bit-packed kernels, as a torch.compile backend.

`import bitcompile` registers the `bitcompile` ops (schemas, fake kernels, autograd) and the
backend; it compiles nothing. Kernels are built on first use (see bitcompile._build).
"""

from bitcompile import ops
from bitcompile.ops import ste_sign
from bitcompile import weight_ops  # noqa: F401  (registers the backend's run-time weight ops)
from bitcompile import backend  # noqa: F401  (registers backend="bitcompile")
from bitcompile import apot, compat, nn  # noqa: F401  (plain PyTorch: nothing compiles)
from bitcompile.export import lower
from bitcompile.explain import explain
from bitcompile.quantize import quantize_

__version__ = "0.1.0"

__all__ = ["apot", "compat", "explain", "lower", "nn", "ops", "quantize_", "ste_sign"]
