"""Rewrites into plain ONNX before import: ops with no converter but an ONNX function body are expanded
(``expand_functions``), and Scans and Loops are unrolled (``unroll_loops``).

tvmpipe compiles static shapes, so a Scan's length is known, and a Loop's trip count often is (a constant,
or bound with --bind-input): the body is repeated that many times, each copy reading the previous copy's
state through Identity nodes. A Scan's copy t reads element t (from the end for a reverse direction) of every
scan input through a Gather at a constant index; a Loop's copy reads its iteration number as a constant; the
per-iteration outputs are unsqueezed and concatenated along their output axis. The result is ordinary ONNX
that the optimiser folds and the importer converts. What cannot be unrolled this way (a length that is not
static or is 0, subgraphs in the body, Scan opset 8 with its batch axis, a Loop whose condition may stop
it early) is left as it is, and refused by ``support.check``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
import onnx.inliner
from onnx import helper, numpy_helper

from .support import ONNX_DOMAINS, attr, opset_of

# Expanded, these would only move the refusal to the random op of their body.
_RANDOM = {"Bernoulli"}
_LOCAL = "tvmpipe.expanded"  # the domain of the per-node function copies


def _function(node: onnx.NodeProto, schema, types: dict[str, onnx.TypeProto]) -> onnx.FunctionProto | None:
    """The ONNX function body of ``node``'s op for this node (a context-dependent body sees its input types;
    an omitted optional input has none), or None if the op has none."""
    fn = onnx.FunctionProto()
    if schema.has_function:
        fn.CopyFrom(schema.function_body)
    elif schema.has_context_dependent_function:
        fn.ParseFromString(schema.get_context_dependent_function(
            node.SerializeToString(), [types.get(i, onnx.TypeProto()).SerializeToString() for i in node.input]))
    else:
        return None
    return fn


def _with_defaults(node: onnx.NodeProto, schema) -> None:
    """Write the schema's default value for every attribute ``node`` leaves out (the bodies refer to them)."""
    given = {a.name for a in node.attribute}
    node.attribute.extend(a.default_value for name, a in schema.attributes.items()
                          if name not in given and a.default_value.name)


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
            try:
                schema = onnx.defs.get_schema(node.op_type, opset_of(typed, node.domain), node.domain)
            except onnx.defs.SchemaError:
                continue
            _with_defaults(node, schema)
            fn = _function(node, schema, types)
            if fn is None:
                continue
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


def _no_subgraphs(body: onnx.GraphProto) -> bool:
    return not any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
                   for n in body.node for a in n.attribute)


def _scan_length(node: onnx.NodeProto, shapes: dict, opset: int) -> int | None:
    """The scan length if this Scan can be unrolled, else None."""
    if opset < 9 or not _no_subgraphs(attr(node, "body")):
        return None
    m = attr(node, "num_scan_inputs")
    axes = attr(node, "scan_input_axes", [0] * m)
    dims = shapes.get(node.input[len(node.input) - m])
    if not dims or dims[axes[0] % len(dims)] in (None, 0):
        return None
    return dims[axes[0] % len(dims)]


def _constant(graph: onnx.GraphProto, name: str) -> np.ndarray | None:
    init = next((t for t in graph.initializer if t.name == name), None)
    return None if init is None else numpy_helper.to_array(init)


def _loop_length(node: onnx.NodeProto, graph: onnx.GraphProto) -> int | None:
    """The trip count if this Loop runs exactly that many times: a constant count, a constant true (or no)
    condition, and a body that passes the condition through unchanged; else None."""
    body = attr(node, "body")
    if not node.input[0] or not _no_subgraphs(body):
        return None
    count = _constant(graph, node.input[0])
    cond = _constant(graph, node.input[1]) if len(node.input) > 1 and node.input[1] else np.array(True)
    if count is None or cond is None or not bool(cond) or int(count) <= 0:
        return None
    cond_in, cond_out = body.input[1].name, body.output[0].name
    passed = cond_out == cond_in or any(n.op_type == "Identity" and list(n.input) == [cond_in] and
                                        list(n.output) == [cond_out] for n in body.node)
    return int(count) if passed else None


class _Unroller:
    """Copies of a loop body, each reading the previous copy's state: nodes and initializers to add."""

    def __init__(self, body: onnx.GraphProto, opset: int, uid: str):
        self.body, self.opset, self.uid = body, opset, uid
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.local = {vi.name for vi in body.input} | {t.name for t in body.initializer}
        self.local |= {o for n in body.node for o in n.output if o}

    def const(self, name: str, value, dtype=np.int64) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype), name))
        return name

    def copy(self, t: int, inputs: dict[str, str]) -> dict[str, str]:
        """Copy ``t`` of the body with its inputs read from ``inputs`` (body input -> outer value); returns
        the renaming of the body's values in it."""
        prefix = f"{self.uid}_t{t}_"
        rename = {name: prefix + name for name in self.local}
        self.nodes += [helper.make_node("Identity", [src], [rename[name]]) for name, src in inputs.items()]
        for init in self.body.initializer:
            copy = onnx.TensorProto()
            copy.CopyFrom(init)
            copy.name = rename[init.name]
            self.inits.append(copy)
        for n in self.body.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(n)
            copy.name = prefix + n.name
            copy.input[:] = [rename.get(i, i) if i else i for i in n.input]
            copy.output[:] = [rename.get(o, o) if o else o for o in n.output]
            self.nodes.append(copy)
        return rename

    def stack(self, parts: list[str], axis: int, out: str) -> None:
        """``out`` = the per-step values ``parts`` stacked along a new ``axis``."""
        names = []
        for k, part in enumerate(parts):
            name = f"{out}_{self.uid}_step{k}"
            if self.opset >= 13:
                axes = self.const(f"{name}_axes", [axis])
                self.nodes.append(helper.make_node("Unsqueeze", [part, axes], [name]))
            else:
                self.nodes.append(helper.make_node("Unsqueeze", [part], [name], axes=[axis]))
            names.append(name)
        self.nodes.append(helper.make_node("Concat", names, [out], axis=axis))


def _unroll_scan(node: onnx.NodeProto, length: int, opset: int, uid: str) -> _Unroller:
    body = attr(node, "body")
    m = attr(node, "num_scan_inputs")
    n_state = len(node.input) - m
    in_axes = attr(node, "scan_input_axes", [0] * m)
    in_rev = attr(node, "scan_input_directions", [0] * m)
    k_out = len(body.output) - n_state
    out_axes = attr(node, "scan_output_axes", [0] * k_out)
    out_rev = attr(node, "scan_output_directions", [0] * k_out)
    u = _Unroller(body, opset, uid)
    state = list(node.input[:n_state])
    steps: list[list[str]] = [[] for _ in range(k_out)]
    for t in range(length):
        inputs = {vi.name: src for vi, src in zip(body.input[:n_state], state)}
        for j, vi in enumerate(body.input[n_state:]):  # element t (from the end if reversed) of each scan input
            idx = u.const(f"{uid}_t{t}_index{j}", length - 1 - t if in_rev[j] else t)
            element = f"{uid}_t{t}_element{j}"
            u.nodes.append(helper.make_node("Gather", [node.input[n_state + j], idx], [element], axis=in_axes[j]))
            inputs[vi.name] = element
        rename = u.copy(t, inputs)
        state = [rename.get(vi.name, vi.name) for vi in body.output[:n_state]]
        for k, vi in enumerate(body.output[n_state:]):
            steps[k].append(rename.get(vi.name, vi.name))
    u.nodes += [helper.make_node("Identity", [src], [out]) for out, src in zip(node.output[:n_state], state) if out]
    for k, out in enumerate(node.output[n_state:]):
        if out:
            u.stack(steps[k][::-1] if out_rev[k] else steps[k], out_axes[k], out)
    return u


def _unroll_loop(node: onnx.NodeProto, length: int, opset: int, uid: str) -> _Unroller:
    body = attr(node, "body")
    n_carried = len(node.input) - 2
    u = _Unroller(body, opset, uid)
    cond = node.input[1] if len(node.input) > 1 and node.input[1] else u.const(f"{uid}_true", True, np.bool_)
    state = [cond, *node.input[2:]]  # the condition stays true: _loop_length checked the body passes it on
    steps: list[list[str]] = [[] for _ in range(len(body.output) - 1 - n_carried)]
    for t in range(length):
        inputs = {body.input[0].name: u.const(f"{uid}_t{t}_iteration", t)}
        inputs.update({vi.name: src for vi, src in zip(body.input[1:], state)})
        rename = u.copy(t, inputs)
        state = [rename.get(vi.name, vi.name) for vi in body.output[:1 + n_carried]]
        for k, vi in enumerate(body.output[1 + n_carried:]):
            steps[k].append(rename.get(vi.name, vi.name))
    finals = zip(node.output[:n_carried], state[1:])
    u.nodes += [helper.make_node("Identity", [src], [out]) for out, src in finals if out]
    for k, out in enumerate(node.output[n_carried:]):
        if out:
            u.stack(steps[k], 0, out)
    return u


def unroll_loops(model: onnx.ModelProto) -> bool:
    """Unroll, in place, every top-level Scan of static length and every Loop with a constant trip count that
    its condition cannot cut short; True if any was."""
    if not any(n.op_type in ("Scan", "Loop") and n.domain in ONNX_DOMAINS for n in model.graph.node):
        return False
    opset, shapes = opset_of(model, ""), _shapes(model)
    new_nodes, changed = [], False
    for k, node in enumerate(model.graph.node):
        length = None
        if node.domain in ONNX_DOMAINS and node.op_type == "Scan":
            length = _scan_length(node, shapes, opset)
        elif node.domain in ONNX_DOMAINS and node.op_type == "Loop":
            length = _loop_length(node, model.graph)
        if length is None:
            new_nodes.append(node)
            continue
        unrolled = (_unroll_scan if node.op_type == "Scan" else _unroll_loop)(node, length, opset, f"loop{k}")
        new_nodes.extend(unrolled.nodes)
        model.graph.initializer.extend(unrolled.inits)
        changed = True
    del model.graph.node[:]
    model.graph.node.extend(new_nodes)
    return changed
