"""Weights whose real values already sit on a binary or APoT grid (inference graphs only).

Matches: a float weight (no binarizer in the graph) whose values, read at compile time, are
  binary grid   +-alpha[n] in every row n, alpha[n] > 0 (sign(W) * alpha per output channel)
  APoT grid     bitcompile.apot.is_on_grid(W, scheme) for apot3 / apot4 / apot5
Emits: the weight form ("binary_grid", "apot3", ...) that weight_ops.linear_of_weight re-checks on every
new weight version (a later in-place update that leaves the grid gives dense math, not garbage).
"""

from __future__ import annotations

from typing import Optional

import torch

from bitcompile import weight_ops

APOT_SCHEMES = ("apot3", "apot4", "apot5")


def grid_of(weight: torch.Tensor, float_activations: bool) -> Optional[str]:
    """The weight form of `weight`'s grid, or None when it is on none."""
    if not weight.is_floating_point() or weight.numel() == 0:
        return None
    if weight_ops._binary_grid_alpha(weight) is not None:
        return "binary_grid"
    if not float_activations:
        return None
    try:
        from bitcompile import apot
    except ImportError:  # APoT math not there: no APoT grids
        return None
    for scheme in APOT_SCHEMES:  # the smallest set first: fewest bits a code
        if apot.is_on_grid(weight, scheme):
            return scheme
    return None
