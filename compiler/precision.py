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
from .passes.util import dtype, private, users
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


# float casts that lose precision (a cast placed earlier converts the same values: the result is identical)
_NARROWING = {"float32": ("float16", "bfloat16")}


@relax.transform.function_pass(opt_level=0, name="CastBeforeLayout")
def cast_before_layout(func: relax.Function, mod: tvm.IRModule, ctx: tvm.transform.PassContext) -> relax.Function:
    """``astype(L(x), narrower)`` -> ``L(astype(x, narrower))`` for the layout ops L (expand_dims, broadcast_to,
    reshape, permute_dims), where only the cast reads ``L(x)``.

    ToMixedPrecision casts an fp16 op's operand where the op reads it: after transformers' ``repeat_kv`` (expand_dims,
    broadcast_to, reshape) of a float32 KV cache and the transposes of attention. There the attention pass, which
    reads grouped heads and the cache's layout through layout ops only, saw a cast and fused attention over a copy of
    the cache repeated to every query head and transposed; cast first, it reads one cast copy of the cache in place.
    Casting before a broadcast also converts fewer elements. Exact: the same values are converted.
    """
    from tvm.relax.dpl import is_op, rewrite_call, wildcard

    uses = users(func)
    layout = (is_op("relax.expand_dims")(wildcard()) | is_op("relax.permute_dims")(wildcard())
              | is_op("relax.broadcast_to")(wildcard(), wildcard()) | is_op("relax.reshape")(wildcard(), wildcard()))

    def rewrite(call: relax.Call, match: dict) -> relax.Expr:
        shaped, narrower = match[layout], str(call.attrs.dtype)
        x = shaped.args[0]
        if narrower not in _NARROWING.get(dtype(x), ()) or not private(call.args[0], uses):
            return call
        return relax.Call(shaped.op, [relax.op.astype(x, narrower), *shaped.args[1:]], shaped.attrs)

    return rewrite_call(is_op("relax.astype")(layout), rewrite, func)


def apply(mod: tvm.IRModule, precision: str) -> tvm.IRModule:
    """Rewrite ``mod`` for ``precision`` (before the graph passes, which then fold the weight casts)."""
    if precision == "fp32":
        return mod
    return tvm.transform.Sequential(
        [clip_as_min_max, relax.transform.ToMixedPrecision(out_dtype="float32"), cast_before_layout, fold_scalar_casts]
    )(mod)
