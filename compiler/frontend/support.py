"""Decide, before any conversion, which nodes tvmpipe cannot compile correctly, and say so all at once.

Refused: ops with no converter; ops whose Relax converter exists but would give a wrong answer for this
node (``REFUSALS``: it substitutes a default for a run-time input, ignores an attribute ...); run-time
values that must be known at compile time because they decide a shape or a kernel (``CONSTANT_INPUTS``,
and graph inputs the optimiser folded away trusting declared output shapes); element types TVM cannot
compute exactly; non-tensor outputs. All are collected over the whole graph, subgraphs included, and
raised as one ``Unsupported`` error (the conformance run counts those as "unsupported", not as failures).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx

from ..errors import TvmpipeError
from . import lowp

ONNX_DOMAINS = ("", "ai.onnx")


class Unsupported(TvmpipeError):
    """A clear refusal: the model uses something tvmpipe does not compile (exactly), by design or yet.

    ``bindable``: graph inputs whose run-time value decides a shape or a kernel; the message suggests
    ``--bind-input`` for them (and ``benchmarks/onnx_conformance.py`` retries with them bound)."""

    def __init__(self, message: str, bindable: tuple[str, ...] = ()):
        super().__init__(message)
        self.bindable = bindable


def iter_nodes(graph: onnx.GraphProto) -> Iterator[onnx.NodeProto]:
    """Every node of the graph and of its If/Loop/Scan bodies."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from iter_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from iter_nodes(g)


def constant_names(graph: onnx.GraphProto) -> set[str]:
    """Names whose value is known at compile time (initializers and Constant outputs)."""
    names = {t.name for t in graph.initializer}
    names.update(n.output[0] for n in graph.node if n.op_type == "Constant")
    return names


def consumed_names(graph: onnx.GraphProto) -> set[str]:
    used = {o.name for o in graph.output}
    for node in iter_nodes(graph):
        used.update(node.input)
    return used


# A refusal rule looks at one node and returns the reason it would be computed wrongly, or None.
Refusal = Callable[[onnx.NodeProto, onnx.GraphProto], "str | None"]


def _nms(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    """(Inputs computed at run time are refused by ``CONSTANT_INPUTS``: the converter needs their values.)"""
    names = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")
    for k, what in enumerate(names, start=2):
        if len(node.input) <= k or not node.input[k]:
            return f"input {what} is omitted and the Relax converter would substitute a non-ONNX default"
    return None


def _training_mode(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if attrs.get("training_mode", 0):
        return "training_mode=1 is not an inference computation"
    if node.op_type == "Dropout" and len(node.input) > 2 and node.input[2]:
        if node.input[2] not in constant_names(graph):
            return "training_mode is a run-time input"
        init = {t.name: t for t in graph.initializer}.get(node.input[2])
        if init is not None and bool(onnx.numpy_helper.to_array(init).item()):
            return "training_mode=True is not an inference computation"
    return None


def attr(node: onnx.NodeProto, name: str, default=None):
    """A node attribute's value (strings decoded), or ``default``."""
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


def _roialign(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    if attr(node, "mode", "avg") == "max":
        return "mode='max' is computed differently by the Relax converter (ONNX takes the max of weighted samples)"
    return None


def _maxpool(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    if len(node.output) > 1 and node.output[1] and node.output[1] in consumed_names(graph):
        return "the Indices output is not supported"
    return None


def _blocked(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    return "blocked quantization (block_size > 0) is not supported" if attr(node, "block_size", 0) else None


REFUSALS: dict[str, Refusal] = {
    "RoiAlign": _roialign,
    "MaxPool": _maxpool,
    "QuantizeLinear": _blocked,
    "DequantizeLinear": _blocked,
    "NonMaxSuppression": _nms,
    "BatchNormalization": _training_mode,
    "Dropout": _training_mode,
}


# Why an op that tvmpipe handles in some forms was left without a converter in this one.
NO_CONVERTER_NOTES = {
    "Scan": " (Scan is unrolled before import only at opset 9+, with a static non-zero length and no subgraph "
            "in its body)",
    "Loop": " (Loop is unrolled before import only with a constant non-zero trip count, a constant true "
            "condition that its body passes on unchanged, and no subgraph in its body)",
}


_REDUCE = ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
           "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")

# Inputs whose value must be known at compile time: they decide the output shape (tvmpipe compiles static
# shapes) or the kernel itself (an axis). op -> input positions.
CONSTANT_INPUTS: dict[str, tuple[int, ...]] = {
    **{op: (1,) for op in _REDUCE},
    "Reshape": (1,), "Expand": (1,), "Tile": (1,), "ConstantOfShape": (0,), "Range": (0, 1, 2),
    "Slice": (1, 2, 3, 4), "Pad": (1, 3), "Resize": (1, 2, 3), "Upsample": (1,), "TopK": (1,), "OneHot": (1,),
    "Split": (1,), "Squeeze": (1,), "Unsqueeze": (1,), "CumSum": (1,), "AffineGrid": (1,),
    "CenterCropPad": (1,), "SplitToSequence": (1,), "Col2Im": (1, 2), "MaxUnpool": (2,), "DFT": (1, 2),
    "CumProd": (1,), "HannWindow": (0,), "HammingWindow": (0,), "BlackmanWindow": (0,),
    "NonMaxSuppression": (2, 3, 4), "STFT": (1, 3), "Loop": (0, 1),
    # every input: bound, the whole op is a constant that the optimiser evaluates (there is no converter)
    "MelWeightMatrix": (0, 1, 2, 3, 4),
}

# Uses of a value that never read its elements: only its shape and dtype, or (Dropout's ratio) nothing at
# inference (training mode is refused on its own).
_METADATA_USES = {("Shape", 0), ("Size", 0), ("CastLike", 1), ("EyeLike", 0), ("RandomNormalLike", 0),
                  ("RandomUniformLike", 0), ("Dropout", 1)}


def _input_role(node: onnx.NodeProto, k: int, opset: int) -> str:
    try:
        formal = onnx.defs.get_schema(node.op_type, opset, node.domain).inputs
        return formal[min(k, len(formal) - 1)].name
    except onnx.defs.SchemaError:
        return f"input {k}"


def _source_inputs(producers: dict[str, onnx.NodeProto], name: str, inputs: set[str]) -> list[str]:
    """The graph inputs whose elements the value ``name`` is computed from (shape-only uses not followed);
    ``producers``: value name -> the node that computes it."""
    found, seen, todo = set(), set(), [name]
    while todo:
        value = todo.pop()
        if value in seen:
            continue
        seen.add(value)
        if value in inputs:
            found.add(value)
        elif value in producers:
            node = producers[value]
            todo += [v for k, v in enumerate(node.input) if v and (node.op_type, k) not in _METADATA_USES]
    return sorted(found)


def _bind_hint(names: list[str]) -> str:
    if not names:
        return ""
    them = "it" if len(names) == 1 else "them"
    flags = " ".join(f"--bind-input {n}=FILE.npy" for n in names)
    return f"; to compile for one value of the graph input{'s' if len(names) > 1 else ''} " \
           f"{', '.join(repr(n) for n in names)}, freeze {them} with {flags}"


def runtime_constant_problems(model: onnx.ModelProto,
                              original: onnx.ModelProto) -> list[tuple[onnx.NodeProto, str, list[str]]]:
    """Nodes that need a run-time value at compile time, in the cleaned ``model``: (node, reason, the graph
    inputs that value comes from, which ``--bind-input`` would make constant).

    Two ways this shows: the node still reads a graph input (or a value computed from one) at a position of
    ``CONSTANT_INPUTS``; or the optimiser, trusting the model's declared output shapes, replaced such a value
    by a constant, so a graph input that ``original`` read for its elements is no longer read at all (its
    value would be silently ignored). Both are refused.
    """
    opset = opset_of(model, "")
    consts = constant_names(model.graph)
    problems = []
    producers = {out: node for node in model.graph.node for out in node.output}
    model_inputs = _graph_input_names(model)
    for node in model.graph.node:
        for k in CONSTANT_INPUTS.get(node.op_type, ()) if node.domain in ONNX_DOMAINS else ():
            if k < len(node.input) and node.input[k] and node.input[k] not in consts:
                sources = _source_inputs(producers, node.input[k], model_inputs)
                problems.append((node, f"its {_input_role(node, k, opset)} ('{node.input[k]}') must be a constant, "
                                       f"but it is computed at run time (tvmpipe compiles static shapes){_bind_hint(sources)}",
                                 sources))
    still_read, inputs = consumed_names(model.graph), _graph_input_names(original)
    for node in iter_nodes(original.graph):
        for k, name in enumerate(node.input):
            if name in inputs and name not in still_read and (node.op_type, k) not in _METADATA_USES:
                problems.append((node, f"its {_input_role(node, k, opset)} is the graph input '{name}', whose value "
                                       f"must be known at compile time (tvmpipe compiles static shapes){_bind_hint([name])}",
                                 [name]))
    return problems


def _graph_input_names(model: onnx.ModelProto) -> set[str]:
    inits = {t.name for t in model.graph.initializer}
    return {i.name for i in model.graph.input if i.name not in inits}


_DT = onnx.TensorProto
# Element types TVM's CPU/CUDA code cannot compute exactly (strings, complex numbers): any tensor of these
# types is refused. The low-precision ones (float8/float4/int4/int2) are refused only where ``lowp`` cannot
# compile them exactly (anything but Cast / CastLike).
UNSUPPORTED_TYPES = {_DT.STRING, _DT.COMPLEX64, _DT.COMPLEX128}


def dtype_problems(model: onnx.ModelProto) -> list[tuple[str, str]]:
    """(what, element type name) for every value, initializer or cast target of an unsupported type."""
    found = []

    def note(what: str, elem: int) -> None:
        if elem in UNSUPPORTED_TYPES:
            found.append((what, _DT.DataType.Name(elem)))

    graph = model.graph
    for vi in [*graph.input, *graph.output, *graph.value_info]:
        if vi.type.HasField("tensor_type"):
            note(f"'{vi.name}'", vi.type.tensor_type.elem_type)
    for t in graph.initializer:
        note(f"'{t.name}'", t.data_type)
    for node in iter_nodes(graph):
        for attr in node.attribute:
            if attr.name in ("to", "output_dtype", "dtype") and attr.type == onnx.AttributeProto.INT:
                note(f"the {attr.name} of {node.op_type} '{node.name}'", attr.i)
            elif attr.type == onnx.AttributeProto.TENSOR:
                note(f"the {attr.name} of {node.op_type} '{node.name}'", attr.t.data_type)
    return found + lowp.problems(model)


def opset_of(model: onnx.ModelProto, domain: str) -> int:
    for imp in model.opset_import:
        if imp.domain == domain or (domain in ONNX_DOMAINS and imp.domain in ONNX_DOMAINS):
            return imp.version
    return 0


def check(model: onnx.ModelProto, path: str, is_supported: Callable[[str, str], bool],
          original: onnx.ModelProto | None = None) -> None:
    """Raise one Unsupported error listing every node tvmpipe cannot compile exactly; return if none.

    ``model`` is the cleaned graph; ``original`` the graph before cleaning (to spot run-time inputs the
    optimiser replaced by constants).
    """
    problems: dict[tuple[str, str, str], list[str]] = {}

    def add(node: onnx.NodeProto, reason: str) -> None:
        names = problems.setdefault((node.domain or "", node.op_type, reason), [])
        name = node.name or f"<unnamed {node.op_type}>"
        if name not in names:
            names.append(name)

    for node in iter_nodes(model.graph):
        domain = node.domain or ""
        reason = None
        if not is_supported(domain, node.op_type):
            reason = "no converter" + (NO_CONVERTER_NOTES.get(node.op_type, "") if domain in ONNX_DOMAINS else "")
        elif domain in ONNX_DOMAINS and node.op_type in REFUSALS:
            reason = REFUSALS[node.op_type](node, model.graph)
        if reason:
            add(node, reason)
    bindable: set[str] = set()
    for node, reason, sources in runtime_constant_problems(model, original or model):
        add(node, reason)
        bindable.update(sources)
    parts = []
    for (domain, op, reason), nodes in sorted(problems.items()):
        qual = f"{domain}::{op}" if domain not in ONNX_DOMAINS else op
        shown = ", ".join(f"'{n}'" for n in nodes[:3]) + (f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else "")
        parts.append(f"{qual} (opset {opset_of(model, domain)}; node{'s' if len(nodes) > 1 else ''} {shown}): {reason}")
    for out in model.graph.output:
        if not out.type.HasField("tensor_type"):
            parts.append(f"output '{out.name}' is not a tensor (sequence/map/optional outputs are not supported)")
    types = dtype_problems(model)
    if types:
        shown = ", ".join(f"{what}: {name}" for what, name in types[:4]) + (" ..." if len(types) > 4 else "")
        parts.append(f"element types tvmpipe cannot compute exactly ({shown})")
    if not parts:
        return
    n = sum(len(v) for v in problems.values())
    head = f"{n} node{'s' if n > 1 else ''} cannot be compiled" if n else "the model cannot be compiled"
    raise Unsupported(f"{path}: {head}: " + "; ".join(parts), tuple(sorted(bindable)))
