"""Quick start: one binary (XNOR-Net style) linear layer on the bit-packed CPU kernels.

    python examples/quickstart.py

Packs a float weight into signs (32 per int32 word), runs `bitcompile::binary_linear`, checks the
result against the float reference F.linear(sign(x), sign(W)) * alpha, and times both.
"""

import statistics
import time

import torch
import torch.nn.functional as F

import bitcompile
from bitcompile import ops


def median_ms(fn, repeat=20):
    fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def main():
    batch, in_features, out_features = 64, 4096, 4096
    x = torch.randn(batch, in_features)
    weight = torch.randn(out_features, in_features)
    alpha = weight.abs().mean(dim=1)  # XNOR-Net's per-output-channel weight scale

    print("building (first use) or loading the CPU kernels ...", flush=True)
    packed = ops.pack_signs(weight)  # int32 [out_features, in_features / 32]
    y = ops.binary_linear(x, packed, in_features, scale=alpha)

    # The same layer in plain PyTorch: a dense float matmul on values that are only +-1.
    signs = lambda t: torch.where(t >= 0, 1.0, -1.0)  # noqa: E731  (SPEC: s(0) = +1)
    reference = F.linear(signs(x), signs(weight)) * alpha
    error = (y - reference).abs().max().item()
    print(f"max |bitcompile - float reference| = {error:.3g}")
    assert torch.allclose(y, reference, rtol=1e-5, atol=1e-4), "binary_linear disagrees with the float reference"

    ours = median_ms(lambda: ops.binary_linear(x, packed, in_features, scale=alpha))
    dense_weight = signs(weight)
    dense = median_ms(lambda: F.linear(signs(x), dense_weight) * alpha)
    print(f"binary_linear  {batch}x{in_features} @ {out_features}x{in_features}: {ours:8.2f} ms")
    print(f"fp32 F.linear  same shapes:              {dense:8.2f} ms  ({dense / ours:.1f}x slower)")
    print(f"weight memory: {weight.numel() * 4 / 2**20:.1f} MiB fp32 -> {packed.numel() * 4 / 2**20:.2f} MiB packed")
    print(f"bitcompile {bitcompile.__version__} OK")


if __name__ == "__main__":
    main()
