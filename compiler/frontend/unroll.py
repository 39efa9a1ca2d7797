"""Rewrites into plain ONNX before import: ops with no converter but an ONNX function body are expanded
(``expand_functions``), and Scans are unrolled (``unroll_scans``).

Scan (opset 9+) is unrolled into plain ONNX nodes: tvmpipe compiles static shapes, so a scan's
length is known and its body can be repeated that many times, each copy reading the previous copy's state.

Each iteration t slices element t (from the end for a reverse direction) of every scan input with a Gather
at a constant index, feeds the body's inputs through Identity nodes, and the per-iteration scan outputs are
unsqueezed and concatenated along their output axis. The result is ordinary ONNX that the optimiser folds
and the importer converts. A scan whose length is not static, of length 0, with subgraphs in its body, or of
opset 8 (batched, with sequence_lens) is left as it is (and refused by ``support.check``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper

from .support import ONNX_DOMAINS, opset_of

# Expanded, these would only move the refusal to the random op of their body.
_RANDOM = {"Bernoulli"}
_LOCAL = "tvmpipe.expanded"  # the domain of the per-node function copies


def _function(node: onnx.NodeProto, model: onnx.ModelProto,
              types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The ONNX function body of ``node``'s op for this node (a context-dependent body sees its input types;
    an omitted optional input has none), or None if the op has none."""
    try:
        schema = onnx.defs.get_schema(node.op_type, opset_of(model, node.domain), node.domain)
    except onnx.defs.SchemaError:
        return None
    fn = onnx.FunctionProto()
    if schema.has_function:
        fn.CopyFrom(schema.function_body)
    elif schema.has_context_dependent_function:
        node = _with_defaults(node, schema)
        fn.ParseFromString(schema.get_context_dependent_function(
            node.SerializeToString(), [types.get(i, onnx.TypeProto()).SerializeToString() for i in node.input]))
    else:
        return None
    return fn


def _with_defaults(node: onnx.NodeProto, schema) -> onnx.NodeProto:
    """``node`` with the schema's default value written for every attribute it leaves out."""
    node = onnx.NodeProto.FromString(node.SerializeToString())
    given = {a.name for a in node.attribute}
    node.attribute.extend(a.default_value for name, a in schema.attributes.items()
                          if name not in given and a.default_value.name)
    return node


def expand_functions(model: onnx.ModelProto, is_supported: Callable[[str, str], bool]) -> onnx.ModelProto:
    """``model`` with every node whose op has no converter (``is_supported(domain, op)`` false) but an ONNX
    function body (LinearAttention, FlexAttention ...) replaced by that body: each such node calls its own
    model-local copy (context-dependent bodies differ per node), which onnx's inliner then inlines. Shape
    inference runs first for the input types. Unchanged if that fails: the nodes are then refused as they are."""
    def wanted(n: onnx.NodeProto) -> bool:
        return (n.op_type not in _RANDOM and n.domain in (*ONNX_DOMAINS, "ai.onnx.preview")
                and not is_supported(n.domain, n.op_type))

    if not any(map(wanted, model.graph.node)):
        return model
    try:
        typed = onnx.shape_inference.infer_shapes(model)
        g = typed.graph
        types = {vi.name: vi.type for vi in [*g.input, *g.value_info, *g.output]}
        found = False
        for k, node in enumerate(filter(wanted, g.node)):
            fn = _function(node, typed, types)
            if fn is None:
                continue
            node.CopyFrom(_with_defaults(node, onnx.defs.get_schema(node.op_type, opset_of(typed, node.domain),
                                                                    node.domain)))
            fn.name, fn.domain = f"{node.op_type}_{k}", _LOCAL
            node.op_type, node.domain = fn.name, _LOCAL
            typed.functions.append(fn)
            found = True
        if not found:
            return model
        typed.opset_import.append(helper.make_opsetid(_LOCAL, 1))
        return onnx.inliner.inline_local_functions(typed)
    except Exception:  # noqa: BLE001 - the inliner refuses what it cannot type
        return model


def _shapes(model: onnx.ModelProto) -> dict[str, list[int | None]]:
    """Static-or-not dims of every value shape inference knows."""
    inferred = onnx.shape_inference.infer_shapes(model)
    g = inferred.graph
    shapes = {t.name: list(t.dims) for t in g.initializer}
    for vi in [*g.input, *g.value_info, *g.output]:
        tt = vi.type.tensor_type
        if vi.type.HasField("tensor_type") and tt.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in tt.shape.dim]
    return shapes


def _attr(node: onnx.NodeProto, name: str, default=None):
    a = next((a for a in node.attribute if a.name == name), None)
    return default if a is None else helper.get_attribute_value(a)


def unrollable(node: onnx.NodeProto, shapes: dict, opset: int) -> int | None:
    """The scan length if ``node`` can be unrolled, else None."""
    if node.op_type != "Scan" or node.domain not in ONNX_DOMAINS or opset < 9:
        return None
    body = _attr(node, "body")
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for n in body.node for a in n.attribute):
        return None
    m = _attr(node, "num_scan_inputs")
    first = node.input[len(node.input) - m]
    axes = _attr(node, "scan_input_axes", [0] * m)
    dims = shapes.get(first)
    if not dims or dims[axes[0] % len(dims)] in (None, 0):
        return None
    return dims[axes[0] % len(dims)]


def _unroll(node: onnx.NodeProto, length: int, opset: int,
            uid: str) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """The nodes (and initializers) computing ``node``'s outputs by ``length`` copies of its body."""
    body = _attr(node, "body")
    m = _attr(node, "num_scan_inputs")
    n_state = len(node.input) - m
    in_axes = _attr(node, "scan_input_axes", [0] * m)
    in_rev = _attr(node, "scan_input_directions", [0] * m)
    k_out = len(body.output) - n_state
    out_axes = _attr(node, "scan_output_axes", [0] * k_out)
    out_rev = _attr(node, "scan_output_directions", [0] * k_out)
    nodes, inits = [], []
    state = list(node.input[:n_state])
    per_step: list[list[str]] = [[] for _ in range(k_out)]
    local = {vi.name for vi in body.input} | {t.name for t in body.initializer}
    local |= {o for n in body.node for o in n.output if o}

    def index_const(name: str, value: int, shape: list[int]) -> str:
        inits.append(numpy_helper.from_array(np.array(value, np.int64).reshape(shape), name))
        return name

    for t in range(length):
        prefix = f"{uid}_t{t}_"
        rename = {name: prefix + name for name in local}
        for vi, src in zip(body.input[:n_state], state):
            nodes.append(helper.make_node("Identity", [src], [rename[vi.name]]))
        for j, vi in enumerate(body.input[n_state:]):
            step = length - 1 - t if in_rev[j] else t
            idx = index_const(f"{prefix}index{j}", step, [])
            nodes.append(helper.make_node("Gather", [node.input[n_state + j], idx], [rename[vi.name]], axis=in_axes[j]))
        for init in body.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = rename[init.name]
            inits.append(copy)
        for n in body.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = prefix + n.name
            copy.input[:] = [rename.get(i, i) if i else i for i in n.input]
            copy.output[:] = [rename.get(o, o) if o else o for o in n.output]
            nodes.append(copy)
        state = [rename.get(vi.name, vi.name) for vi in body.output[:n_state]]
        for k, vi in enumerate(body.output[n_state:]):
            name = f"{prefix}scan_out{k}"
            if opset >= 13:
                nodes.append(helper.make_node("Unsqueeze", [rename.get(vi.name, vi.name),
                                                            index_const(f"{prefix}axes{k}", out_axes[k], [1])], [name]))
            else:
                nodes.append(helper.make_node("Unsqueeze", [rename.get(vi.name, vi.name)], [name], axes=[out_axes[k]]))
            per_step[k].append(name)
    for out, src in zip(node.output[:n_state], state):
        if out:
            nodes.append(helper.make_node("Identity", [src], [out]))
    for k, out in enumerate(node.output[n_state:]):
        if out:
            parts = per_step[k][::-1] if out_rev[k] else per_step[k]
            nodes.append(helper.make_node("Concat", parts, [out], axis=out_axes[k]))
    return nodes, inits


def unroll_scans(model: onnx.ModelProto) -> bool:
    """Unroll every top-level Scan of static length in place; True if any was."""
    if not any(n.op_type == "Scan" for n in model.graph.node):
        return False
    opset, shapes = opset_of(model, ""), _shapes(model)
    new_nodes, changed = [], False
    for k, node in enumerate(model.graph.node):
        length = unrollable(node, shapes, opset)
        if length is None:
            new_nodes.append(node)
            continue
        nodes, inits = _unroll(node, length, opset, f"scan{k}")
        new_nodes.extend(nodes)
        model.graph.initializer.extend(inits)
        changed = True
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    return changed
