"""What a pass run knows besides the graph: graph kind, user options, real weights, the report."""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch
import torch.fx as fx


@dataclasses.dataclass
class Entry:
    """One Linear/Conv2d found: what happened to it and why (bitcompile.explain prints these)."""

    name: str
    kind: str            # "linear" | "conv2d"
    action: str          # "rewritten" | "skipped" | "quantized" (a quantize_'d module; explain adds these)
    op: Optional[str]    # the bitcompile op it runs on, None when skipped
    reason: str
    scheme: Optional[str] = None  # the quantize_ scheme of a "quantized" entry


@dataclasses.dataclass
class PassContext:
    # "backend": run-time ops on live weights (torch.compile); "lower": packed constants
    # (bitcompile.lower); "record": decide and report only (bitcompile.explain).
    mode: str = "backend"
    # Training graph: STE ops on float latent weights (grad enabled and a parameter requires grad).
    training: bool = False
    quantize: Optional[str] = None
    filter: Optional[Callable[[str, str], bool]] = None
    skip: tuple = ()
    # The backend's inner compiler is inductor. Inference graphs then also get the rewrites made for it: eval
    # BatchNorms folded into the op in front of them (batchnorm.py; inductor's numerics already differ from eager's
    # in the last bit) and binary convs' activations packed in the graph, for inductor to fuse (packed_input.py).
    inner_inductor: bool = False
    # The real tensor behind a placeholder (parameters, buffers), None when unknown.
    real_value: Callable[[fx.Node], Optional[torch.Tensor]] = lambda node: None
    # Fully qualified name of the parameter behind a placeholder ("features.0.weight"), or None.
    fqn_of: Callable[[fx.Node], Optional[str]] = lambda node: None
    # Lowering hooks (mode "lower"): make a constant placeholder; evaluate a weight-only node.
    add_constant: Optional[Callable[[str, torch.Tensor], fx.Node]] = None
    evaluate: Optional[Callable[[fx.Node], Optional[torch.Tensor]]] = None
    entries: list = dataclasses.field(default_factory=list)
    fake_mode: object = None

    def record(self, name, kind, action, op, reason) -> Entry:
        entry = Entry(name, kind, action, op, reason)
        self.entries.append(entry)
        return entry
