"""ExpandSmallPowers: ``x ** 2`` and ``x ** 3`` with a constant exponent become multiplications.

GPT-2's tanh-GELU computes ``pow(x, 3)``. TVM lowers it to ``powf``: on CUDA a long exact routine (with fast
math it was ``__powf`` = exp2(3 log2 x), NaN for every x < 0), and TVM warns at each compile that pow with
y >= 3 may misbehave for x < 0. ``x * x * x`` is right for negative x, infinities, NaN and -0, costs two
multiplies, and is what onnxruntime's CPU Pow computes for these two exponents.
"""

from __future__ import annotations

import tvm
from tvm import relax
from tvm.relax.dpl import is_const, is_op, rewrite_call, wildcard

from .util import const_array, dtype, scalar

_POW = is_op("relax.power")(wildcard(), is_const())


def _expand(call: relax.Expr, matches: dict) -> relax.Expr:
    x, exponent = matches[_POW].args
    y, value = scalar(exponent), const_array(exponent)
    # a float base only (an integer base with a float exponent is a cast in disguise), and an exponent
    # constant that cannot broadcast x to a bigger shape
    if y not in (2.0, 3.0) or not dtype(x).startswith(("float", "bfloat")) or value.ndim > x.ty.ndim:
        return call
    square = relax.op.multiply(x, x)
    return square if y == 2.0 else relax.op.multiply(square, x)


@relax.transform.function_pass(opt_level=0, name="ExpandSmallPowers")
class ExpandSmallPowers:
    def transform_function(self, func: relax.Function, mod: tvm.IRModule, ctx) -> relax.Function:
        return rewrite_call(_POW, _expand, func)
