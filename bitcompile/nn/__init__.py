"""Layers for binary and APoT networks on stock PyTorch (SPEC.md 3).

- BinaryLinear, BinaryConv2d (binary.py): bitorch-engine semantics, float latent weights.
- APoTLinear, APoTConv2d (apot.py): weights fake-quantized to an APoT scheme with an STE.
"""

import importlib

__all__ = ["BinaryLinear", "BinaryConv2d", "APoTLinear", "APoTConv2d"]

_HOMES = {"BinaryLinear": "binary", "BinaryConv2d": "binary", "APoTLinear": "apot", "APoTConv2d": "apot"}


def __getattr__(name):
    # Imported on first use so that `import bitcompile` stays light.
    if name in _HOMES:
        return getattr(importlib.import_module(f"bitcompile.nn.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'bitcompile.nn' has no attribute {name!r}")
