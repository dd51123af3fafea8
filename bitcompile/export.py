"""bitcompile.lower: the bitcompile passes on a torch.export program, with weights stored packed.

    ep = torch.export.export(model, (x,))
    small = bitcompile.lower(ep)                 # options: quantize=, filter=, skip=
    torch.export.save(small, "model.pt2")        # load it after `import bitcompile`

The weights of an exported program are known when it is lowered, so a rewritten layer calls the
kernel op itself (binary_linear, binary_conv2d, apot_linear, ...) on packed weights that become
new persistent buffers of the program ("<layer>.weight_packed": int32 signs / uint8 codes, plain
tensors, so torch.export.save/load need nothing but the registered ops). Scales that depend on
weights only (mean|W| per row, a grid's alpha) are computed now and stored as buffers too
("<layer>.weight_scale"); parameters and buffers that nothing uses any more (the float weights)
leave the program's state, so the saved file shrinks by the packing factor for those layers.

Route: a copy of the program's graph is rewritten in place of the original (the same passes as
the torch.compile backend, in mode "lower"), new placeholders are inserted in front of the user
inputs, and `ExportedProgram._update` builds the program from that graph, a new
ExportGraphSignature and the new state. The canonical view of the passes reads both the
pre-dispatch ATen IR of torch.export.export (aten.linear, aten.conv2d) and the decomposed one
(aten.addmm on a permuted weight, aten.convolution), so no run_decompositions is needed.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Optional

import torch
import torch.fx as fx
from torch.export import ExportedProgram
from torch.utils._pytree import tree_leaves as pytree_leaves
from torch.export.graph_signature import ExportGraphSignature, InputKind, InputSpec, TensorArgument

_STATE_KINDS = (InputKind.PARAMETER, InputKind.BUFFER, InputKind.CONSTANT_TENSOR)


def _options(options: dict) -> dict:
    from bitcompile.backend import BitcompileOptionError, validate_options

    if "inner" in options or "inner_options" in options:
        raise BitcompileOptionError("bitcompile.lower: 'inner' and 'inner_options' are torch.compile options; "
                                    "lower takes quantize=, filter=, skip=")
    return validate_options(options)


def lower(ep: ExportedProgram, **options) -> ExportedProgram:
    """A new ExportedProgram whose binary / APoT Linear and Conv2d layers run on bitcompile kernel
    ops with packed weights in the program's state (the float weights they replace are dropped).
    Options as torch.compile(backend="bitcompile"): quantize, filter, skip."""
    from bitcompile import passes

    options = _options(options)
    lowered = _Lowering(ep)
    ctx = passes.PassContext(mode="lower", training=False, quantize=options["quantize"], filter=options["filter"],
                             skip=options["skip"], real_value=lowered.real_value, fqn_of=lowered.fqn_of,
                             add_constant=lowered.add_constant, evaluate=lowered.evaluate)
    passes.run_passes(lowered.gm, ctx)
    result = lowered.finish()
    result._bitcompile_report = list(ctx.entries)  # what was rewritten (bitcompile.explain shows the same)
    return result


class _Lowering:
    def __init__(self, ep: ExportedProgram):
        self.ep = ep
        graph = fx.Graph()
        graph.output(graph.graph_copy(ep.graph_module.graph, {}))
        self.gm = fx.GraphModule(ep.graph_module, graph)
        self.gm.meta.update(getattr(ep.graph_module, "meta", {}))
        # graph_copy may rename a placeholder (an input called `input` becomes `input_1`): pair
        # the specs with the copied placeholders by position, under the copied names.
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        self.specs = {}
        for node, spec in zip(placeholders, ep.graph_signature.input_specs):
            if isinstance(spec.arg, TensorArgument):
                spec = dataclasses.replace(spec, arg=TensorArgument(name=node.name))
            elif hasattr(spec.arg, "name"):
                spec = dataclasses.replace(spec, arg=dataclasses.replace(spec.arg, name=node.name))
            self.specs[node.name] = spec
        self.new_state: dict = {}
        self.new_specs: dict = {}
        self.values: dict = {}
        from bitcompile.passes import ir

        self.fake_mode = ir.fake_mode_of(self.gm.graph)

    # -- what the passes ask -------------------------------------------------------------------
    def real_value(self, node: fx.Node) -> Optional[torch.Tensor]:
        if node.op != "placeholder":
            return None
        if node.name in self.new_specs:
            return self.new_state[self.new_specs[node.name].target]
        spec = self.specs.get(node.name)
        if spec is None or spec.kind not in _STATE_KINDS:
            return None
        if spec.kind == InputKind.CONSTANT_TENSOR or (spec.kind == InputKind.BUFFER and not spec.persistent):
            return self.ep.constants.get(spec.target)
        return self.ep.state_dict.get(spec.target)

    def fqn_of(self, node: fx.Node) -> Optional[str]:
        spec = self.specs.get(node.name) if node.op == "placeholder" else None
        return spec.target if spec is not None and spec.kind in _STATE_KINDS else None

    def evaluate(self, node) -> Optional[torch.Tensor]:
        """The value of a node computed from the program's state only, None if it needs an input."""
        if not isinstance(node, fx.Node):
            return node
        if node in self.values:
            return self.values[node]
        result = None
        if node.op == "placeholder":
            result = self.real_value(node)
        elif node.op == "get_attr":
            result = getattr(self.gm, node.target, None)
        elif node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), self.evaluate_or_missing)
            if not _has_missing((args, kwargs)):
                with torch.no_grad():
                    result = node.target(*args, **kwargs)
        self.values[node] = result
        return result

    def evaluate_or_missing(self, node):
        value = self.evaluate(node)
        return _MISSING if value is None else value

    def add_constant(self, name: str, tensor: torch.Tensor) -> fx.Node:
        """A new persistent buffer `name` of the program, as a placeholder in front of the user inputs."""
        target = name
        suffix = 1
        while target in self.new_state or target in self.ep.state_dict or target in self.ep.constants:
            suffix += 1
            target = f"{name}_{suffix}"
        graph = self.gm.graph
        first_user_input = next(
            (n for n in graph.nodes if n.op != "placeholder"
             or (n.name in self.specs and self.specs[n.name].kind not in _STATE_KINDS)), None)
        with graph.inserting_before(first_user_input):
            node = graph.placeholder("b_" + re.sub(r"\W", "_", target))
        tensor = tensor.detach().contiguous()
        if self.fake_mode is not None:
            node.meta["val"] = self.fake_mode.from_tensor(tensor, static_shapes=True)
        self.new_state[target] = tensor
        self.new_specs[node.name] = InputSpec(kind=InputKind.BUFFER, arg=TensorArgument(name=node.name),
                                              target=target, persistent=True)
        return node

    # -- the new program -------------------------------------------------------------------------
    def finish(self) -> ExportedProgram:
        graph = self.gm.graph
        state_dict = dict(self.ep.state_dict)
        constants = dict(self.ep.constants)
        input_specs = []
        for node in list(graph.nodes):
            if node.op != "placeholder":
                continue
            if node.name in self.new_specs:
                input_specs.append(self.new_specs[node.name])
                continue
            spec = self.specs[node.name]
            if spec.kind in _STATE_KINDS and not node.users:
                # the float weight a rewritten layer replaced: it leaves the program's state
                graph.erase_node(node)
                if not any(s.target == spec.target for s in self.specs.values() if s is not spec):
                    state_dict.pop(spec.target, None)
                    constants.pop(spec.target, None)
                continue
            input_specs.append(spec)
        state_dict.update(self.new_state)
        graph.lint()
        self.gm.recompile()
        # The rewrites replace nodes the outputs name: renumber the output specs after the graph.
        outputs = list(pytree_leaves(next(n for n in graph.nodes if n.op == "output").args[0]))
        output_specs = []
        for spec, produced in zip(self.ep.graph_signature.output_specs, outputs):
            if isinstance(spec.arg, TensorArgument) and isinstance(produced, fx.Node):
                spec = dataclasses.replace(spec, arg=TensorArgument(name=produced.name))
            output_specs.append(spec)
        signature = ExportGraphSignature(input_specs=input_specs, output_specs=output_specs)
        return self.ep._update(self.gm, signature, state_dict=state_dict, constants=constants)


class _Missing:
    pass


_MISSING = _Missing()


def _has_missing(tree) -> bool:
    from torch.utils._pytree import tree_leaves

    return any(leaf is _MISSING for leaf in tree_leaves(tree))
