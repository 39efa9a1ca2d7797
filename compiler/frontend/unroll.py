"""Scan (opset 9+) unrolled into plain ONNX nodes before import: tvmpipe compiles static shapes, so a scan's
length is known and its body can be repeated that many times, each copy reading the previous copy's state.

Each iteration t slices element t (from the end for a reverse direction) of every scan input with a Gather
at a constant index, feeds the body's inputs through Identity nodes, and the per-iteration scan outputs are
unsqueezed and concatenated along their output axis. The result is ordinary ONNX that the optimiser folds
and the importer converts. A scan whose length is not static, of length 0, with subgraphs in its body, or of
opset 8 (batched, with sequence_lens) is left as it is (and refused by ``support.check``).
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .support import opset_of


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
    if node.op_type != "Scan" or node.domain not in ("", "ai.onnx") or opset < 9:
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
