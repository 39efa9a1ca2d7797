"""Decide, before any conversion, which nodes tvmpipe cannot compile correctly, and say so all at once.

Two kinds of refusal: ops with no converter at all, and ops whose Relax converter exists but would give a
wrong answer for this particular node (it substitutes a default for a runtime input, or returns a dummy
output). Both are collected over the whole graph, subgraphs included, and raised as one error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import onnx

from ..errors import TvmpipeError

ONNX_DOMAINS = ("", "ai.onnx")


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
    consts = constant_names(graph)
    names = ("max_output_boxes_per_class", "iou_threshold", "score_threshold")
    for k, what in enumerate(names, start=2):
        if len(node.input) <= k or not node.input[k]:
            return f"input {what} is omitted and the Relax converter would substitute a non-ONNX default"
        if node.input[k] not in consts:
            return f"input {what} is computed at run time and the Relax converter would replace it with a default"
    return None


def _layernorm(node: onnx.NodeProto, graph: onnx.GraphProto) -> str | None:
    used = consumed_names(graph)
    extra = [o for o in node.output[1:] if o and o in used]
    if extra:
        return f"outputs Mean/InvStdDev ({', '.join(extra)}) are used and the Relax converter returns dummies"
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


REFUSALS: dict[str, Refusal] = {
    "NonMaxSuppression": _nms,
    "LayerNormalization": _layernorm,
    "BatchNormalization": _training_mode,
    "Dropout": _training_mode,
}


def opset_of(model: onnx.ModelProto, domain: str) -> int:
    for imp in model.opset_import:
        if imp.domain == domain or (domain in ONNX_DOMAINS and imp.domain in ONNX_DOMAINS):
            return imp.version
    return 0


def check(model: onnx.ModelProto, path: str, is_supported: Callable[[str, str], bool]) -> None:
    """Raise one TvmpipeError listing every node tvmpipe cannot compile exactly; return if none."""
    problems: dict[tuple[str, str, str], list[str]] = {}
    for node in iter_nodes(model.graph):
        domain = node.domain or ""
        reason = None
        if not is_supported(domain, node.op_type):
            reason = "no converter"
        elif domain in ONNX_DOMAINS and node.op_type in REFUSALS:
            reason = REFUSALS[node.op_type](node, model.graph)
        if reason:
            problems.setdefault((domain, node.op_type, reason), []).append(node.name or f"<unnamed {node.op_type}>")
    if not problems:
        return
    parts = []
    for (domain, op, reason), nodes in sorted(problems.items()):
        qual = f"{domain}::{op}" if domain not in ONNX_DOMAINS else op
        shown = ", ".join(f"'{n}'" for n in nodes[:3]) + (f" (+{len(nodes) - 3} more)" if len(nodes) > 3 else "")
        parts.append(f"{qual} (opset {opset_of(model, domain)}; node{'s' if len(nodes) > 1 else ''} {shown}): {reason}")
    n = sum(len(v) for v in problems.values())
    raise TvmpipeError(f"{path}: {n} node{'s' if n > 1 else ''} cannot be compiled: " + "; ".join(parts))
