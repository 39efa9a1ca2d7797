"""SimplifyLayout: remove Transpose work that only moves data around.

A transpose is a kernel that reads and writes the whole tensor, while a reshape of a contiguous tensor is
free (a view, once ``RewriteDataflowReshape`` runs). So two transposes in a row become one, or none when
they cancel (as the head-split transposes do around a recognised attention op); a transpose after a
unary elementwise op that follows a transpose moves in front of the op to meet the other one (layout
round trips such as NCHW -> NHWC -> Relu -> NCHW); and a transpose that only moves size-1 axes becomes a
reshape. Chained reshapes are TVM's ``RemoveRedundantReshape``'s job.
"""

from __future__ import annotations

from functools import reduce
from operator import or_

import tvm
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .util import UNARY_ELEMENTWISE, private, static_shape, users

_TRANSPOSE = is_op("relax.permute_dims")(wildcard())
_INNER = is_op("relax.permute_dims")(wildcard())
_TWO = is_op("relax.permute_dims")(_INNER)
_UNARY = reduce(or_, (is_op(op)(_INNER, varg_default_wildcard=True) for op in UNARY_ELEMENTWISE))
_THROUGH = is_op("relax.permute_dims")(_UNARY)


def _axes(call: relax.Call) -> list[int]:
    axes = call.attrs.axes
    return list(range(call.ty.ndim))[::-1] if axes is None else [int(a) for a in axes]


def _compose(call: relax.Call, matches: dict) -> relax.Expr:
    """permute(permute(x, p1), p2) == permute(x, p1[p2])."""
    inner = matches[_INNER]
    return relax.op.permute_dims(inner.args[0], [_axes(inner)[a] for a in _axes(call)])


def _sink(call: relax.Call, matches: dict, uses) -> relax.Expr:
    """permute(u(permute(x, p1)), p2) == u(permute(x, p1[p2])) for a unary elementwise u read only here."""
    unary, inner = matches[_UNARY], matches[_INNER]
    if not (private(call.args[0], uses) and private(unary.args[0], uses)):
        return call
    moved = relax.op.permute_dims(inner.args[0], [_axes(inner)[a] for a in _axes(call)])
    return relax.Call(unary.op, [moved, *unary.args[1:]], unary.attrs)


def _to_view(call: relax.Call, matches: dict) -> relax.Expr:
    """An identity transpose is nothing; one that keeps the order of the non-unit axes is a reshape."""
    data, axes = call.args[0], _axes(call)
    if axes == sorted(axes):
        return data
    shape = static_shape(data)
    if shape is not None and [a for a in axes if shape[a] != 1] == [a for a in range(len(axes)) if shape[a] != 1]:
        return relax.op.reshape(data, [shape[a] for a in axes])
    return call


@relax.transform.function_pass(opt_level=0, name="SimplifyLayout")
class SimplifyLayout:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        uses = users(func)
        func = rewrite_call(_THROUGH, lambda c, m: _sink(c, m, uses), func)
        return rewrite_call(_TRANSPOSE, _to_view, rewrite_call(_TWO, _compose, func))
