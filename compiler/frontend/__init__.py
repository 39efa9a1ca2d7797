"""Frontend stage: ONNX file -> Relax IRModule with static shapes, a clean graph and constant weights.

``load(path, shapes, bind)`` is the one entry point: read + validate the file, freeze the inputs given a
value (``--bind-input``) into initializers, bind the given static shapes, expand ops with no converter but
an ONNX function body, clean the graph (onnxscript, Scans and Loops unrolled), refuse every node we cannot compile
exactly (all at once), then import.
"""

from __future__ import annotations

import warnings
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ..errors import TvmpipeError
from . import attention_op, clip, resize, rnn  # noqa: F401  (register Attention, Clip, Resize, LSTM/GRU/RNN)
from . import converters_layout, converters_math, converters_nn, converters_ops, lowp  # noqa: F401  (our converters)
from .importer import import_model, is_supported, qualified_op
from .onnx_clean import BoundInput, TensorSpec, bind_shapes, bind_values, clean, index_ranges, parse_shape_arg, read_model
from .support import Unsupported, check, iter_nodes, opset_of
from .unroll import expand_functions

__all__ = ["BoundInput", "Imported", "TensorSpec", "load", "parse_shape_arg"]


@dataclass
class Imported:
    """The imported model and what the package manifest needs to know about it."""

    mod: object  # tvm.IRModule
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    source: str
    sha256: str
    opset: int
    onnx_model: onnx.ModelProto  # after binding and cleaning
    op_counts: Counter = field(default_factory=Counter)  # ONNX ops of the original file
    bound: list[BoundInput] = field(default_factory=list)  # inputs frozen to a value, no longer inputs


def _outputs(mod, graph: onnx.GraphProto, path: str) -> list[TensorSpec]:
    from tvm import relax

    ret = mod["main"].ret_ty
    fields = list(ret.fields) if isinstance(ret, relax.TupleType) else [ret]
    if len(fields) != len(graph.output):
        raise TvmpipeError(f"{path}: the graph has {len(graph.output)} outputs but import produced {len(fields)}")
    specs = []
    for out, ty in zip(graph.output, fields):
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            raise Unsupported(f"{path}: output '{out.name}' has a data-dependent shape ({ty}); "
                              "tvmpipe compiles static shapes only")
        try:
            shape = tuple(int(d) for d in ty.shape)
        except TypeError:
            raise Unsupported(
                f"{path}: output '{out.name}' has a data-dependent shape {ty.shape}; tvmpipe compiles static shapes only"
            ) from None
        elem = out.type.tensor_type.elem_type
        if elem in lowp.LOWP:  # computed as its storage byte: the manifest names the ONNX type
            specs.append(TensorSpec(out.name, shape, lowp.dtype_name(elem), storage=str(ty.dtype)))
        else:
            specs.append(TensorSpec(out.name, shape, str(ty.dtype)))
    return specs


def load(path: str | Path, shapes: dict[str, tuple[int, ...]] | None = None,
         bind: dict[str, np.ndarray] | None = None) -> Imported:
    """Read, bind, clean, check and import an ONNX model."""
    path = str(path)
    model, sha = read_model(path)
    op_counts = Counter(qualified_op(n.domain, n.op_type) for n in iter_nodes(model.graph))
    both = sorted(set(shapes or {}) & set(bind or {}))
    if both:
        raise TvmpipeError(f"input '{both[0]}' has both --input-shape and --bind-input: its bound value gives its shape")
    frozen = bind_values(model, dict(bind or {}))
    inputs = bind_shapes(model, dict(shapes or {}))
    bound = onnx.ModelProto.FromString(model.SerializeToString())  # clean() may rewrite in place
    model = clean(expand_functions(model, is_supported))
    check(model, path, is_supported, original=bound)
    opset = opset_of(model, "")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # renamed-input and checker chatter from the upstream importer
        try:
            mod = import_model(lowp.lower(model), opset, {s.name: list(s.shape) for s in inputs},
                               {s.name: s.storage or s.dtype for s in inputs})
        except TvmpipeError as err:
            raise type(err)(f"{path}: {err}") from err
        except Exception as err:
            raise TvmpipeError(f"{path}: import failed: {type(err).__name__}: {err}") from err
    return Imported(mod, index_ranges(model, inputs), _outputs(mod, model.graph, path), path, sha, opset, model,
                    op_counts, frozen)
