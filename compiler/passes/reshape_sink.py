"""SinkReshapes: elementwise ops move in front of the reshapes they read, so a matmul's epilogue fuses.

Hugging Face's GPT-2 computes each projection as ``addmm`` on a 2-D view and reshapes the result back to
[batch, seq, features] before the activation and the residual add. FuseOps lets a matmul absorb the elementwise
ops after it but not an injective op such as that reshape, so the tanh-GELU chain and the residual adds became
kernels of their own that read and write the whole activation (GPT-2 batch 32 fp16 on the H200: 1.3 ms of GELU
and 0.6 ms of adds in a 15.7 ms profile). Elementwise ops do not care about shapes, so ``op(reshape(x))`` is
``reshape(op(x))``: the reshape moves below the op until it meets the next reshape (or the output), where
``RemoveRedundantReshape`` merges the two. A second operand must be a scalar constant, a reshape of a tensor of
x's shape, or a tensor of the reshape's own shape (it is read through a reshape to x's, a view): no broadcast
changes meaning. Only reshapes that add axes sink (GPT-2's 2-D -> 3-D): the views this pass puts on second
operands remove axes, so they stay where they are and the rewriting ends. Nor does a reshape sink below the op
that computes a function output: Relax keeps a reshape there as a copy kernel, not a view.
"""

from __future__ import annotations

from functools import reduce
from operator import or_

import tvm
import tvm_ffi
from tvm import relax
from tvm.relax.dpl import is_op, rewrite_call, wildcard

from .util import BINARY_ELEMENTWISE, UNARY_ELEMENTWISE, const_array, static_shape

_UNARY = reduce(or_, (is_op(op)(wildcard(), varg_default_wildcard=True) for op in UNARY_ELEMENTWISE))
_BINARY = reduce(or_, (is_op(op)(wildcard(), wildcard()) for op in BINARY_ELEMENTWISE))


def _adds_axes(reshape: relax.Call) -> bool:
    """A reshape to more axes of a statically shaped tensor: one this pass sinks."""
    shape, out = static_shape(reshape.args[0]), static_shape(reshape)
    return shape is not None and out is not None and len(shape) < len(out)


def _source(expr: relax.Expr, var2val: dict) -> relax.Expr | None:
    """x, where ``expr`` is (a variable bound to) ``reshape(x, ...)`` that adds axes."""
    value = var2val.get(expr, expr) if isinstance(expr, relax.Var) else expr
    if isinstance(value, relax.Call) and value.op.same_as(tvm.ir.Op.get("relax.reshape")) and _adds_axes(value):
        return value.args[0]
    return None


def _unary(call: relax.Call, var2val: dict, outputs: list) -> relax.Expr:
    x = _source(call.args[0], var2val) if isinstance(call, relax.Call) else None  # DPL also offers bound variables
    if x is None or static_shape(call) is None or any(call.same_as(o) for o in outputs):
        return call
    return relax.op.reshape(relax.Call(call.op, [x, *call.args[1:]], call.attrs), static_shape(call))


def _binary(call: relax.Call, var2val: dict, outputs: list) -> relax.Expr:
    """op(reshape(x), y) or op(y, reshape(x)) -> reshape(op(x, y')) where y' is y in x's shape (see module doc)."""
    if not isinstance(call, relax.Call):  # a variable bound to the op: its binding is rewritten instead
        return call
    out = static_shape(call)
    sources = [_source(a, var2val) for a in call.args]
    side = next((i for i, s in enumerate(sources) if s is not None), None)
    if out is None or side is None or any(call.same_as(o) for o in outputs):
        return call
    x = sources[side]
    shape = static_shape(x)
    other = call.args[1 - side]
    value = const_array(other)
    if sources[1 - side] is not None and static_shape(sources[1 - side]) == shape and static_shape(other) == out:
        moved = sources[1 - side]
    elif value is not None and value.size == 1 and value.ndim <= len(out):
        moved = relax.const(value.reshape(()), str(value.dtype))
    elif static_shape(other) == out and static_shape(call.args[side]) == out:
        moved = relax.op.reshape(other, shape)
    else:
        return call
    args = [x, moved] if side == 0 else [moved, x]
    return relax.op.reshape(relax.Call(call.op, args, call.attrs), out)


@relax.transform.function_pass(opt_level=0, name="SinkReshapes")
class SinkReshapes:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        for _ in range(64):  # each round sinks the reshapes past at least one op; GPT-2 takes four
            var2val = relax.analysis.get_var2val(func)
            result = func.body.body
            outputs = [var2val.get(v) for v in (result.fields if isinstance(result, relax.Tuple) else [result])]
            new = rewrite_call(_UNARY, lambda c, m: _unary(c, var2val, outputs), func)
            new = rewrite_call(_BINARY, lambda c, m: _binary(c, var2val, outputs), new)
            if tvm_ffi.structural_equal(new, func):
                return new
            func = new
        return func
