"""Read an ONNX file, bind static input shapes and clean the graph before Relax sees it.

Cleaning is onnxscript's optimiser (ONNX shape inference + constant folding, which folds exporter shape
subgraphs such as Shape->Gather->Unsqueeze->Concat->Reshape once the input shapes are static, turns
Constant nodes of every attribute form into initializers, inlines ``If`` nodes whose condition became
constant, and inlines model-local functions).
"""

from __future__ import annotations

import hashlib
import logging
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import onnx
import onnx.inliner
from google.protobuf.message import DecodeError

from ..errors import TvmpipeError
from ..package import array_digest
from . import lowp
from .support import Unsupported, iter_nodes
from .unroll import unroll_loops


@dataclass(frozen=True)
class TensorSpec:
    """A named, statically shaped model input or output; an input used as gather indices also carries the
    range they must lie in (checked by the runtime: the compiled gather reads out of bounds instead)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    index_range: tuple[int, int] | None = None  # inclusive
    index_of: str = ""  # the node(s) that gather with it
    storage: str | None = None  # a low-precision dtype (float8_e4m3fn, int4 ...) travels as this, a byte each

    def to_json(self) -> dict:
        out = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}
        if self.storage is not None:
            out["storage"] = self.storage
        if self.index_range is not None:
            out |= {"index_range": list(self.index_range), "index_of": self.index_of}
        return out


@dataclass(frozen=True)
class BoundInput:
    """A graph input frozen to one value at compile time (``--bind-input``). The model is compiled for that
    value (it may decide shapes), so the package does not take it as an input and the runtime refuses a
    different value fed in its place."""

    name: str
    value: np.ndarray = field(compare=False)

    SHOWN = 64  # bound values up to this many elements are written into the manifest as well

    def to_json(self) -> dict:
        a = self.value
        out = {"name": self.name, "shape": list(a.shape), "dtype": a.dtype.name, "sha256": array_digest(a)}
        return out | ({"value": a.tolist()} if a.size <= self.SHOWN else {})


# op type -> (position of the indices input, position of the data input) for ops that read data at indices
_GATHERS = {"Gather": (1, 0), "GatherElements": (1, 0)}


def index_ranges(model: onnx.ModelProto, specs: list[TensorSpec]) -> list[TensorSpec]:
    """``specs`` with the valid range of every input that a Gather / GatherElements uses directly as indices
    (on a data tensor of known shape): [-n, n - 1] along the gathered axis, intersected over its uses.

    TVM lowers these gathers without bounds checks ("fast" mode), so an out-of-range id (a token id past the
    vocabulary) would read outside the table, or crash the process, where onnxruntime raises an error."""
    shapes = {t.name: tuple(t.dims) for t in model.graph.initializer}
    for vi in [*model.graph.value_info, *model.graph.input]:
        dims = vi.type.tensor_type.shape.dim
        if all(d.HasField("dim_value") for d in dims):
            shapes.setdefault(vi.name, tuple(d.dim_value for d in dims))
    ranges: dict[str, tuple[int, int, list[str]]] = {}
    for node in model.graph.node:
        if node.op_type not in _GATHERS or node.domain not in ("", "ai.onnx"):
            continue
        k, d = _GATHERS[node.op_type]
        data_shape = shapes.get(node.input[d])
        if data_shape is None:
            continue
        axis = next((a.i for a in node.attribute if a.name == "axis"), 0)
        n = data_shape[axis % len(data_shape)]
        lo, hi, nodes = ranges.get(node.input[k], (-n, n - 1, []))
        ranges[node.input[k]] = (max(lo, -n), min(hi, n - 1), [*nodes, f"{node.op_type} node '{node.name or node.output[0]}'"])
    out = []
    for spec in specs:
        if spec.name in ranges and spec.dtype.startswith(("int", "uint")):
            lo, hi, nodes = ranges[spec.name]
            spec = replace(spec, index_range=(lo, hi), index_of=", ".join(nodes))
        out.append(spec)
    return out


def parse_shape_arg(text: str) -> tuple[str, tuple[int, ...]]:
    """Parse ``NAME:1x3x224x224`` (``NAME:`` alone for a scalar) into (name, shape)."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise TvmpipeError(f"malformed --input-shape '{text}': expected NAME:DIMxDIMx... such as x:1x3x224x224")
    if dims.strip() == "":
        return name, ()
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        raise TvmpipeError(
            f"malformed --input-shape '{text}': dims must be positive integers separated by 'x', e.g. {name}:1x3x224x224"
        ) from None
    if any(d <= 0 for d in shape):
        raise TvmpipeError(f"malformed --input-shape '{text}': every dim must be a positive integer")
    return name, shape


def read_model(path: str | Path) -> tuple[onnx.ModelProto, str]:
    """Load an ONNX file (with external data) and return it with the file's sha256."""
    path = Path(path)
    if not path.exists():
        raise TvmpipeError(f"model file not found: {path}")
    if path.is_dir():
        raise TvmpipeError(f"model path is a directory, not an ONNX file: {path}")
    data = path.read_bytes()
    if not data:
        raise TvmpipeError(f"model file is empty (0 bytes): {path}")
    try:
        model = onnx.load_model_from_string(data)
    except (DecodeError, RuntimeWarning, ValueError) as err:
        raise TvmpipeError(f"{path} is not a valid ONNX model (truncated or not ONNX: {err})") from None
    if not model.graph.node and not model.graph.output:
        raise TvmpipeError(f"{path} is not a valid ONNX model (no graph: truncated or not ONNX)")
    try:
        onnx.load_external_data_for_model(model, str(path.parent))
    except (FileNotFoundError, OSError) as err:
        raise TvmpipeError(f"{path}: external weight data could not be read: {err}") from None
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as err:
        # The checker is stricter than the runtimes people test their exports with; say so and go on.
        warnings.warn(f"{path} does not pass onnx.checker ({str(err).strip().splitlines()[0]}); compiling anyway")
    return model, hashlib.sha256(data).hexdigest()


def graph_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """Real inputs: graph inputs that are not initializers (old exporters list weights as inputs)."""
    inits = {t.name for t in model.graph.initializer}
    return [i for i in model.graph.input if i.name not in inits]


def _dtype_of(vi: onnx.ValueInfoProto) -> str:
    elem = vi.type.tensor_type.elem_type
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem)).name
    except (KeyError, TypeError):
        raise Unsupported(
            f"input '{vi.name}' has element type {onnx.TensorProto.DataType.Name(elem)}, which tvmpipe cannot feed"
        ) from None


def bind_values(model: onnx.ModelProto, values: dict[str, np.ndarray]) -> list[BoundInput]:
    """Turn the graph inputs named in ``values`` into initializers holding those values, so shape inference
    and constant folding see them; their dtype must be the input's and their shape fit its declared dims."""
    inputs = {vi.name: vi for vi in graph_inputs(model)}
    weights = {t.name for t in model.graph.initializer}
    bound = []
    for name, value in values.items():
        value = np.asarray(value)
        if name not in inputs:
            what = "a weight (initializer)" if name in weights else "not an input of the model"
            raise TvmpipeError(f"--bind-input {name}: '{name}' is {what}; the model's inputs are "
                               f"{', '.join(repr(k) for k in inputs)}")
        vi = inputs[name]
        if not vi.type.HasField("tensor_type"):
            raise Unsupported(f"input '{name}' is not a tensor (sequence/map/optional inputs are not supported)")
        dtype = _dtype_of(vi)
        if value.dtype.name != dtype:
            raise TvmpipeError(f"--bind-input {name}: the value is {value.dtype.name}, the model's input '{name}' "
                               f"is {dtype}")
        tt = vi.type.tensor_type
        if tt.HasField("shape"):
            dims = ["?" if not d.HasField("dim_value") else d.dim_value for d in tt.shape.dim]
            if len(dims) != value.ndim or any(d not in ("?", n) for d, n in zip(dims, value.shape)):
                raise TvmpipeError(f"--bind-input {name}: the value has shape {list(value.shape)}, the model's "
                                   f"input '{name}' has shape {dims}")
        model.graph.input.remove(vi)
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
        bound.append(BoundInput(name, value))
    return bound


def bind_shapes(model: onnx.ModelProto, shapes: dict[str, tuple[int, ...]]) -> list[TensorSpec]:
    """Write static shapes into the graph inputs; every dynamic dim must be bound by ``shapes``."""
    inputs = graph_inputs(model)
    known = {i.name for i in inputs}
    unknown = sorted(set(shapes) - known)
    if unknown:
        raise TvmpipeError(
            f"--input-shape names {', '.join(repr(u) for u in unknown)}, but the model's inputs are "
            f"{', '.join(repr(k) for k in sorted(known))}"
        )
    specs = []
    for vi in inputs:
        if not vi.type.HasField("tensor_type"):
            raise Unsupported(f"input '{vi.name}' is not a tensor (sequence/map/optional inputs are not supported)")
        dtype = _dtype_of(vi)
        tt = vi.type.tensor_type
        dims = list(tt.shape.dim) if tt.HasField("shape") else None
        given = shapes.get(vi.name)
        if given is None:
            if dims is None:
                raise TvmpipeError(f"input '{vi.name}' has unknown rank: give its shape with --input-shape {vi.name}:DxDx...")
            dynamic = [(k, d.dim_param or "?") for k, d in enumerate(dims) if not d.HasField("dim_value")]
            if dynamic:
                example = "x".join(str(d.dim_value) if d.HasField("dim_value") else "1" for d in dims)
                where = ", ".join(f"dim {k} ('{p}')" for k, p in dynamic)
                raise TvmpipeError(
                    f"input '{vi.name}' has dynamic {where}: bind it with --input-shape {vi.name}:{example}"
                )
            shape = tuple(d.dim_value for d in dims)
        else:
            if dims is not None and len(dims) != len(given):
                raise TvmpipeError(
                    f"--input-shape {vi.name}: rank {len(given)} given, but the model's input has rank {len(dims)}"
                )
            for k, (d, g) in enumerate(zip(dims or [], given)):
                if d.HasField("dim_value") and d.dim_value != g:
                    raise TvmpipeError(
                        f"--input-shape {vi.name}: dim {k} is fixed to {d.dim_value} in the model, {g} given"
                    )
            shape = tuple(given)
            tt.ClearField("shape")
            for g in shape:
                tt.shape.dim.add().dim_value = g
        storage = lowp.STORAGE if vi.type.tensor_type.elem_type in lowp.LOWP else None
        specs.append(TensorSpec(vi.name, shape, dtype, storage=storage))
        if 0 in shape:
            _read_as_constant(model.graph, vi.name, np.zeros(shape, dtype))
    return specs


def _read_as_constant(graph: onnx.GraphProto, name: str, value: np.ndarray) -> None:
    """Make the nodes read a constant instead of input ``name`` (which stays in the interface): an empty
    input's value is fully known from its shape, and converters that need e.g. empty ``axes`` as a
    constant can then use it."""
    const = f"{name}__const"
    graph.initializer.append(onnx.numpy_helper.from_array(value, const))

    def rename(g: onnx.GraphProto) -> None:
        for node in g.node:
            node.input[:] = [const if i == name else i for i in node.input]
            for attr in node.attribute:
                for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
                    rename(sub)

    rename(graph)


def _normalize_constants(graph: onnx.GraphProto) -> None:
    """Rewrite every Constant node to the plain ``value=<tensor>`` form (evaluated by onnx's reference
    implementation), so sparse_value / value_ints / value_string ... never reach code that only knows one."""
    from onnx.reference import ReferenceEvaluator

    for node in graph.node:
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                _normalize_constants(attr.g)
        if node.op_type != "Constant" or node.domain not in ("", "ai.onnx") or node.attribute[0].name == "value":
            continue
        attr = node.attribute[0]
        if attr.name == "sparse_value":  # the reference evaluator returns it sparse: scatter it here
            sp = attr.sparse_tensor
            value = np.zeros(tuple(sp.dims), onnx.helper.tensor_dtype_to_np_dtype(sp.values.data_type))
            idx = onnx.numpy_helper.to_array(sp.indices)
            value[np.unravel_index(idx, value.shape) if idx.ndim == 1 else tuple(idx.T)] = onnx.numpy_helper.to_array(sp.values)
        else:
            single = onnx.helper.make_graph([node], "c", [], [onnx.helper.make_empty_tensor_value_info(node.output[0])])
            opsets = [onnx.helper.make_opsetid("", 17)]
            value = ReferenceEvaluator(onnx.helper.make_model(single, opset_imports=opsets)).run(None, {})[0]
        del node.attribute[:]
        node.attribute.append(onnx.helper.make_attribute("value", onnx.numpy_helper.from_array(np.asarray(value), node.output[0])))


SMALL_FILL = 1024  # ConstantOfShape outputs up to this many elements are folded


def _fold_small_fills(node) -> bool | None:
    """Fold a ConstantOfShape of known small size, which onnxscript keeps (so as not to grow a model by its
    zeros): such values are mostly shapes and axes (the expanded LayerNorm's reshape target) that later ops
    need as constants. None leaves every other node to onnxscript's own rules."""
    if node.op_type != "ConstantOfShape" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
        return None
    shape = node.inputs[0].const_value
    return True if shape is not None and int(np.prod(shape.numpy())) <= SMALL_FILL else None


def _split_constants(graph) -> None:
    """Give the outputs of a Split of constants their values, which onnxscript does not fold (it folds no
    multi-output op): the expanded AffineGrid splits its size into N, C, H, W and shapes a Range by them."""
    import onnx_ir as ir

    for node in graph:
        if node.op_type != "Split" or node.domain not in ("", "ai.onnx") or node.inputs[0] is None:
            continue
        x = node.inputs[0].const_value
        sizes = node.inputs[1].const_value if len(node.inputs) > 1 and node.inputs[1] is not None else None
        if x is None or (len(node.inputs) > 1 and node.inputs[1] is not None and sizes is None):
            continue
        attrs = {a.name: a.value for a in node.attributes.values()}
        data, axis = x.numpy(), attrs.get("axis", 0)
        sizes = sizes.numpy() if sizes is not None else attrs.get("split")
        if sizes is None:
            part = -(-data.shape[axis] // attrs.get("num_outputs", len(node.outputs)))
            sizes = [min(part, data.shape[axis] - s) for s in range(0, data.shape[axis], part)]
        for out, piece in zip(node.outputs, np.split(data, np.cumsum(sizes)[:-1], axis=axis)):
            if out.const_value is None:
                out.const_value = ir.tensor(piece)


def _optimize(model: onnx.ModelProto, iterations: int = 4) -> onnx.ModelProto:
    """onnxscript's ``optimize`` without its rewrite rules, but one.

    Those rules match constants with a tolerance (``x + 1e-12`` is taken for ``x + 0`` and dropped, which
    turns LayerNorm's epsilon into a division by zero); graph rewrites are our passes' job, on Relax. The one
    kept, ``fuse_pad_into_conv``, checks exactly (a constant Pad of zeros on spatial axes only, a Conv without
    ``auto_pad``) and folds the Pad into the Conv's ``pads``: imported, a Pad is a kernel of its own
    (``converters_layout``) in front of a conv that pads as it reads.
    """
    import onnx_ir as ir
    import onnx_ir.passes.common as common
    from onnxscript.optimizer import fold_constants_ir
    from onnxscript.rewriter import rewrite
    from onnxscript.rewriter.rules.common import fuse_pad_into_conv_rule

    m = ir.serde.deserialize_model(model)
    common.InlinePass()(m)
    for _ in range(iterations):
        _split_constants(m.graph)
        folded = fold_constants_ir(m, onnx_shape_inference=True, output_size_limit=1 << 26,
                                   should_fold=_fold_small_fills).modified
        if not common.RemoveUnusedNodesPass()(m).modified and not folded:
            break
    rewrite(m, pattern_rewrite_rules=[fuse_pad_into_conv_rule])
    ir.passes.Sequential(
        common.RemoveUnusedFunctionsPass(),
        common.LiftConstantsToInitializersPass(lift_all_constants=True, size_limit=0),
        common.LiftSubgraphInitializersToMainGraphPass(),
        common.DeduplicateInitializersPass(),
        common.OutputFixPass(),
        common.NameFixPass(),
    )(m)
    return ir.serde.serialize_model(m)


def _castlike_to_cast(model: onnx.ModelProto) -> onnx.ModelProto:
    """Rewrite each CastLike that sets ``saturate`` or ``round_mode`` as the Cast it stands for, keeping them:
    onnxscript's optimiser makes the Cast itself but drops both (a saturate=0 float8 cast would then
    saturate). The target type is the ``like`` input's, from shape inference; unknown, the node is left.
    Model-local functions holding one are inlined first (the optimiser inlines them anyway), so that shape
    inference types their ``like`` inputs."""
    def setting(nodes) -> bool:
        return any(n.op_type == "CastLike" and n.attribute for n in nodes)

    if any(setting(f.node) for f in model.functions):
        model = onnx.inliner.inline_local_functions(model)
    if not setting(iter_nodes(model.graph)):
        return model
    inferred = onnx.shape_inference.infer_shapes(model)

    def rewrite(graph: onnx.GraphProto, inferred_graph: onnx.GraphProto) -> None:
        types = {vi.name: vi.type.tensor_type.elem_type for vi in
                 [*inferred_graph.input, *inferred_graph.value_info, *inferred_graph.output]
                 if vi.type.HasField("tensor_type")}
        types.update({t.name: t.data_type for t in inferred_graph.initializer})
        for node, twin in zip(graph.node, inferred_graph.node):
            for attr, inferred_attr in zip(node.attribute, twin.attribute):
                if attr.type == onnx.AttributeProto.GRAPH:
                    rewrite(attr.g, inferred_attr.g)
            if node.op_type == "CastLike" and node.domain in ("", "ai.onnx") and node.attribute \
                    and types.get(node.input[1]):
                attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                node.CopyFrom(onnx.helper.make_node("Cast", node.input[:1], node.output, node.name,
                                                    to=types[node.input[1]], **attrs))

    rewrite(model.graph, inferred.graph)
    return model


def _optimized(model: onnx.ModelProto) -> onnx.ModelProto:
    folder_log = logging.getLogger("onnxscript.optimizer._constant_folding")
    level = folder_log.level
    # It logs "Evaluation failed: ..." for every value it cannot fold (BERT's mask: "cannot reshape array of
    # size 1 into shape (1,128)"); such a value stays in the graph and TVM computes it, so that is no news.
    folder_log.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _optimize(model)
    except Exception as err:  # the optimiser is best effort: import the unoptimised graph instead
        warnings.warn(f"onnxscript optimiser failed ({type(err).__name__}: {err}); importing the raw graph")
        return onnx.shape_inference.infer_shapes(model)
    finally:
        folder_log.setLevel(level)


def clean(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shape inference + constant folding + If/function inlining with onnxscript's optimiser; Scans and Loops
    of static length unrolled (``unroll``), then optimised again."""
    _normalize_constants(model.graph)
    model = _castlike_to_cast(model)
    # Symbolic shapes recorded by the exporter for intermediate values go stale once inputs are bound.
    del model.graph.value_info[:]
    model = _optimized(model)
    if unroll_loops(model):
        model = _optimized(model)
    _normalize_constants(model.graph)  # the optimiser writes folded values in other Constant forms
    return model
