"""Numeric precision of the compiled model: ``fp32`` as imported, or ``fp16`` (GPU targets).

``fp16`` is Relax's ToMixedPrecision with fp32 accumulation: conv/matmul read fp16 operands and
accumulate in fp32 (their inputs and weights are cast, weights once at compile time by FoldConstant),
ops that lose accuracy in fp16 (softmax, reductions, normalisation statistics) stay fp32 where the pass
keeps them so, and the model's inputs and outputs keep their fp32 dtype, so callers see no difference.
"""

from __future__ import annotations

import tvm
from tvm import relax

from .errors import TvmpipeError
from .targets import TargetInfo

PRECISIONS = ("fp32", "fp16")


def check(target: TargetInfo, precision: str) -> None:
    """Refuse an unknown precision, or fp16 for a CPU target, before any work is done."""
    if precision not in PRECISIONS:
        raise TvmpipeError(f"unknown precision '{precision}' (known: {', '.join(PRECISIONS)})")
    if precision != "fp32" and not target.is_gpu:
        raise TvmpipeError(f"--precision {precision} is for GPU targets; {target.name} compiles fp32 only")


@relax.transform.function_pass(opt_level=0, name="ClipAsMinMax")
def clip_as_min_max(func: relax.Function, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> relax.Function:
    """``clip(x, lo, hi)`` -> ``minimum(maximum(x, lo), hi)`` with tensor bounds of x's dtype.

    ToMixedPrecision (TVM 0.27) aborts on clip's scalar PrimExpr bounds ("Expected TensorType, but got
    T.int64"), and ReLU6 (MobileNetV2) is a clip. The rewrite is exact; the result casts like any other op.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    x, lo, hi = wildcard(), wildcard(), wildcard()

    def rewrite(call: relax.Call, match: dict) -> relax.Expr:
        dtype = call.ty.dtype
        low, high = (relax.const(float(match[v].value), dtype) for v in (lo, hi))  # IntImm/FloatImm bounds
        return relax.op.minimum(relax.op.maximum(match[x], low), high)

    return rewrite_call(is_op("relax.clip")(x, lo, hi), rewrite, func)


@relax.transform.function_pass(opt_level=0, name="FoldScalarCasts")
def fold_scalar_casts(func: relax.Function, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> relax.Function:
    """``astype(scalar constant)`` -> the cast constant.

    ToMixedPrecision casts every scalar operand (GPT-2's GELU coefficients, pow's exponent 3) and Relax's
    FoldConstant leaves a cast of a 0-d constant alone, so the graph passes saw variables where constants
    were: ``pow(x, 3)`` stayed a pow, and the reshapes before the GELU could not sink (``SinkReshapes``).
    numpy casts float32 -> float16 to nearest even, as TVM does; other types stay as they are.
    """
    from tvm.relax.dpl import is_const, is_op, rewrite_call

    def rewrite(call: relax.Call, match: dict) -> relax.Expr:
        value, dtype = call.args[0].value.numpy(), str(call.attrs.dtype)
        if value.ndim or dtype not in ("float16", "float32", "float64"):
            return call
        return relax.const(value.astype(dtype), dtype)

    return rewrite_call(is_op("relax.astype")(is_const()), rewrite, func)


def apply(mod: tvm.IRModule, precision: str) -> tvm.IRModule:
    """Rewrite ``mod`` for ``precision`` (before the graph passes, which then fold the weight casts)."""
    if precision == "fp32":
        return mod
    return tvm.transform.Sequential(
        [clip_as_min_max, relax.transform.ToMixedPrecision(out_dtype="float32"), fold_scalar_casts]
    )(mod)
