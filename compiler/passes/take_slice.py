"""TakeAsSlice: ``take(x, constant indices)`` that picks one index, or evenly spaced ones, becomes a slice.

PyTorch's packed attention projection exports as ``Gather(qkv, 0 / 1 / 2)`` (torchvision's ViT: 36 of them).
TVM lowers ``take`` to a kernel of its own that reads an int64 index buffer, so it neither fuses with the
transposes after it nor gets a vectorised schedule: on the H200 the 36 copies were 11 % of ViT-B/16 at batch 32
in fp16 (``dlight:Fallback``). A ``strided_slice`` (+ ``squeeze`` for a scalar index) is the same copy as an
injective op on float buffers, which FuseOps merges into its consumers.
"""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .util import const_array, static_shape

_TAKE = is_op("relax.take")(wildcard(), is_const())


def _positions(indices: np.ndarray, extent: int, mode: str) -> np.ndarray | None:
    """The indices as positions in [0, extent) the way ``take``'s mode reads them (None: out of range)."""
    if mode == "wrap":
        return indices % extent
    if mode == "clip":
        return np.clip(indices, 0, extent - 1)
    pos = np.where(indices < 0, indices + extent, indices)  # "fast": ONNX Gather's negative indices count from the end
    return pos if ((0 <= pos) & (pos < extent)).all() else None


def _slice(call: relax.Expr, matches: dict) -> relax.Expr:
    x, indices = matches[_TAKE].args
    shape, value = static_shape(x), const_array(indices)
    if shape is None or value is None or value.dtype.kind not in "iu" or value.ndim > 1 or value.size == 0:
        return call
    axis = int(call.attrs.axis) % len(shape) if call.attrs.axis is not None else None
    if axis is None:  # take over the flattened tensor: not a slice of one axis
        return call
    pos = _positions(value.astype(np.int64), shape[axis], str(call.attrs.mode))
    if pos is None:
        return call
    flat = pos.reshape(-1)
    step = int(flat[1] - flat[0]) if flat.size > 1 else 1
    if step < 1 or not (np.diff(flat) == step).all():  # not evenly spaced upwards
        return call
    sliced = relax.op.strided_slice(x, [axis], [int(flat[0])], [int(flat[-1]) + 1], [step])
    return relax.op.squeeze(sliced, [axis]) if value.ndim == 0 else sliced


@relax.transform.function_pass(opt_level=0, name="TakeAsSlice")
class TakeAsSlice:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        return rewrite_call(_TAKE, _slice, func)
