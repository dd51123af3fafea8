"""The `bitcompile` torch.compile backend: bitcompile's passes, then an inner compiler.

    torch.compile(model, backend="bitcompile", options={"inner": "aot_eager", ...})

Graph kind (decided per Dynamo graph, at compile time): a *training* graph is one compiled with
grad enabled and at least one input (a parameter, usually) that requires grad. Dynamo guards
on grad mode and on requires_grad, so the same code under torch.no_grad() compiles again, as an
inference graph. Training graphs get the STE ops on the float latent weights; inference graphs
get the run-time packing ops (weights converted once per weight version, see weight_ops.py).

Registration: the entry point (pyproject.toml, group torch_dynamo_backends) makes
backend="bitcompile" work without `import bitcompile`; `import bitcompile` registers the
function directly only when that entry point is not installed. Doing both crashes: Dynamo's
lookup loads the entry point, which imports this module (registering it), and then registers
the loaded function again under the same name ("duplicate name").
"""

from __future__ import annotations

import logging
import re
from typing import Any, Callable, Optional

import torch
import torch.fx as fx

log = logging.getLogger("bitcompile")

QUANTIZE_SCHEMES = (None, "binary", "binary_weight", "apot3", "apot4", "apot5")
INNER_COMPILERS = ("inductor", "aot_eager", "eager")
OPTIONS = {
    "quantize": "None or one of 'binary', 'binary_weight', 'apot3', 'apot4', 'apot5': also convert "
                "plain float Linear/Conv2d layers, as bitcompile.quantize_ does",
    "filter": "callable (fqn, kind) -> bool, kind 'linear' or 'conv2d': True for a layer to convert",
    "skip": "module-name prefixes (str or list of str) to leave alone",
    "inner": "compiler for the rest of the graph: 'inductor' (default), 'aot_eager' or 'eager'",
    "inner_options": "dict handed to the inner compiler (inductor config patches)",
}


# The report (bitcompile.passes.Entry list) of the graph compiled last: what was rewritten.
last_report: list = []


class BitcompileOptionError(ValueError):
    """An invalid `options=` entry of torch.compile(..., backend="bitcompile")."""


def validate_options(options: Optional[dict]) -> dict:
    """Checked options with defaults filled in; raises BitcompileOptionError naming the problem."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        valid = "\n".join(f"  {name}: {text}" for name, text in OPTIONS.items())
        raise BitcompileOptionError(
            f"bitcompile: unknown option(s) {', '.join(map(repr, unknown))}. Valid options:\n{valid}")
    quantize = options.get("quantize")
    if quantize not in QUANTIZE_SCHEMES:
        raise BitcompileOptionError(f"bitcompile: option quantize={quantize!r}; use one of {QUANTIZE_SCHEMES}")
    filter_fn = options.get("filter")
    if filter_fn is not None and not callable(filter_fn):
        raise BitcompileOptionError(f"bitcompile: option filter must be a callable (fqn, kind) -> bool, got {filter_fn!r}")
    skip = options.get("skip") or ()
    if isinstance(skip, str):
        skip = (skip,)
    if not all(isinstance(prefix, str) for prefix in skip):
        raise BitcompileOptionError(f"bitcompile: option skip must be a str or a list of str, got {skip!r}")
    inner = options.get("inner", "inductor")
    if inner not in INNER_COMPILERS:
        raise BitcompileOptionError(f"bitcompile: option inner={inner!r}; use one of {INNER_COMPILERS}")
    inner_options = options.get("inner_options") or {}
    if not isinstance(inner_options, dict):
        raise BitcompileOptionError(f"bitcompile: option inner_options must be a dict, got {inner_options!r}")
    return {"quantize": quantize, "filter": filter_fn, "skip": tuple(skip), "inner": inner,
            "inner_options": inner_options}


# ----------------------------------------------------------------------------------------------
# What Dynamo tells us about placeholders
# ----------------------------------------------------------------------------------------------
_SOURCE_PART = re.compile(r"\['([^']*)'\]|\.([A-Za-z_][A-Za-z0-9_]*)")


def _source_name(node: fx.Node) -> Optional[str]:
    grapharg = node.meta.get("grapharg")
    source = getattr(grapharg, "source", None)
    return source.name if source is not None and hasattr(source, "name") else None


def fqn_from_source(name: Optional[str]) -> Optional[str]:
    """'L['self']._modules['features']._modules['0']._parameters['weight']' -> 'features.0.weight'."""
    if not name or ("_parameters" not in name and "_buffers" not in name):
        return None
    parts = []
    for match in _SOURCE_PART.finditer(name):
        parts.append(match.group(1) if match.group(1) is not None else match.group(2))
    parts = parts[1:]  # the local (L['self'] / L['model'])
    return ".".join(p for p in parts if p not in ("_modules", "_parameters", "_buffers")) or None


def _real_example(node: fx.Node, by_placeholder: dict) -> Optional[torch.Tensor]:
    if node.op != "placeholder":
        return None
    grapharg = node.meta.get("grapharg")
    example = None
    if grapharg is not None:
        try:
            example = grapharg.example
        except Exception:
            example = None
    if example is None:
        example = by_placeholder.get(node)
    return example if isinstance(example, torch.Tensor) else None


def _is_weight_tensor(node: fx.Node, example) -> bool:
    name = _source_name(node) or ""
    return isinstance(example, torch.nn.Parameter) or "_parameters" in name or "_buffers" in name


def is_training_graph(example_inputs) -> bool:
    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in example_inputs)


def make_context(gm: fx.GraphModule, example_inputs, options: dict, mode: str):
    from bitcompile import passes

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    by_placeholder = dict(zip(placeholders, example_inputs))

    def real_value(node):
        example = _real_example(node, by_placeholder)
        return example if example is not None and _is_weight_tensor(node, example) else None

    def fqn_of(node):
        return fqn_from_source(_source_name(node)) if node.op == "placeholder" else None

    return passes.PassContext(mode=mode, training=is_training_graph(example_inputs), quantize=options["quantize"],
                              filter=options["filter"], skip=options["skip"], real_value=real_value, fqn_of=fqn_of,
                              inner_inductor=mode == "backend" and options["inner"] == "inductor")


# What Dynamo hangs on its GraphModule and placeholders outside `meta` (torch 2.13
# output_graph.py: "can't move these into meta"). AOTAutograd reads them to know which inputs
# are parameters: static inputs for CUDA graphs (without them every replay copies every weight)
# and its dedup guards. A copy must carry them.
_DYNAMO_MODULE_ATTRIBUTES = ("_param_name_to_source", "_source_to_user_stacks")
_DYNAMO_NODE_ATTRIBUTES = ("_dynamo_source",)


def _copy(gm: fx.GraphModule) -> fx.GraphModule:
    """A new GraphModule with a copy of gm's graph (same placeholders, in the same order)."""
    graph = fx.Graph()
    copies: dict = {}
    output = graph.graph_copy(gm.graph, copies)
    graph.output(output)
    new = fx.GraphModule(gm, graph)
    new.meta.update(getattr(gm, "meta", {}))
    for name in _DYNAMO_MODULE_ATTRIBUTES:
        if hasattr(gm, name):
            setattr(new, name, getattr(gm, name))
    for old, copied in copies.items():
        for name in _DYNAMO_NODE_ATTRIBUTES:
            if hasattr(old, name):
                setattr(copied, name, getattr(old, name))
    return new


def _inner(name: str, mode: Optional[str], inner_options: dict) -> Callable:
    if name == "eager":
        return lambda gm, example_inputs: gm.forward
    if name == "aot_eager":
        from torch._dynamo.backends.registry import lookup_backend

        return lookup_backend("aot_eager")
    from torch._inductor.compile_fx import compile_fx

    patches = dict(torch._inductor.list_mode_options(mode)) if mode else {}
    patches.update(inner_options)
    return lambda gm, example_inputs: compile_fx(gm, example_inputs, config_patches=patches)


def bitcompile_backend(gm: fx.GraphModule, example_inputs: list, **kwargs: Any):
    """torch.compile backend: rewrite binary/APoT Linear and Conv2d, hand the rest to `inner`."""
    mode = kwargs.pop("mode", None)
    options = validate_options(kwargs.pop("options", None))
    if kwargs:
        raise BitcompileOptionError(f"bitcompile: unexpected backend arguments {sorted(kwargs)}")
    from torch._dynamo.utils import counters

    from bitcompile import passes

    rewritten = _copy(gm)
    ctx = make_context(rewritten, example_inputs, options, mode="backend")
    try:
        passes.run_passes(rewritten, ctx)
    except Exception as error:  # never fail compilation because of a pass
        log.warning("bitcompile: passes failed (%s: %s); compiling the graph unchanged", type(error).__name__, error)
        rewritten = _copy(gm)
    global last_report
    last_report = list(ctx.entries)
    done = sum(e.action == "rewritten" for e in ctx.entries)
    log.info("bitcompile: %s graph, %d of %d layers rewritten", "training" if ctx.training else "inference",
             done, len(ctx.entries))
    compiled_fn = _inner(options["inner"], mode, options["inner_options"])(rewritten, example_inputs)
    # Counted once the inner compiler succeeded: Dynamo may restart a compile (for example to
    # specialize a Python float), which is not a recompilation.
    counters["bitcompile"]["graphs"] += 1
    return compiled_fn


def _entry_point_installed() -> bool:
    try:
        from importlib.metadata import entry_points

        return any(ep.name == "bitcompile" for ep in entry_points(group="torch_dynamo_backends"))
    except Exception:
        return False


def register() -> None:
    """Make backend="bitcompile" known to Dynamo, without the duplicate-name crash (module doc)."""
    if _entry_point_installed():
        return
    from torch._dynamo.backends import registry

    if "bitcompile" in registry._COMPILER_FNS:
        return
    registry.register_backend(compiler_fn=bitcompile_backend, name="bitcompile")


register()
